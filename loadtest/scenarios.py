"""The benchmark scenarios: each opens real MQTT connections to one server and returns one Result.

Every scenario connects through `server.endpoint(tls=, auth=)`, so `Params.tls` / `Params.auth` run it over
the server's TLS listener and/or with the bench users' user name and password.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from loadtest.client import DISCONNECT, ConnackRefused, Counters, Endpoint, MqttConn, Publisher, disconnect
from loadtest.servers import SERVER_CORE, Server, core_busy_seconds

MAX_RAMP_STEPS = 20
RAMP_FACTOR = 1.3
ACK_WAIT_S = 5.0
DISCONNECT_WAIT_S = 1.0  # connect scenario: how long a loop waits for the server to close after DISCONNECT
MAX_CONNECT_ERRORS = 100  # connect scenario: stop after this many failed attempts (a broken setup fails fast)


@dataclass(slots=True)
class Params:
    """Knobs shared by all scenarios; None means "the scenario's own default"."""

    seconds: float = 10.0
    qos: int | None = None
    rate: float | None = None  # fanout: deliveries/s (math.inf: find the max); latency: msgs/s
    subscribers: int = 1000
    publishers: int = 10
    pairs: int = 100
    connections: int = 10_000
    concurrency: int = 20  # connect scenario: concurrent connect/disconnect loops
    window: int | None = None  # unacked publishes per publisher in window mode
    payload: int = 64
    drain: float = 1.0
    max_p99_ms: float = 50.0
    ramp_start: float = 40_000.0  # fanout --rate max: first step, deliveries/s
    step_seconds: float = 3.0
    max_steps: int = MAX_RAMP_STEPS
    open_concurrency: int = 200  # connections being opened at once
    auth: bool = False  # CONNECT with the bench users' user name/password (server: password file, no anonymous)
    tls: bool = False  # connect to the server's TLS listener


@dataclass(slots=True)
class Result:
    scenario: str
    server: str
    rate: float  # the headline number, in `unit`
    unit: str = "msgs/s"
    sent: int = 0
    received: int = 0
    lost: int = 0
    dup: int = 0  # repeated or out-of-order sequence numbers seen by subscribers
    p50_ms: float | None = None
    p99_ms: float | None = None
    p999_ms: float | None = None
    duration_s: float = 0.0
    load_cpu: float = 0.0  # fraction of one core used by this load generator while sending
    server_cpu: float = 0.0  # fraction of one core used by the server while sending
    extra: dict[str, float] = field(default_factory=dict)


def percentiles(samples_ns: list[int]) -> tuple[float | None, float | None, float | None]:
    """p50, p99, p999 in milliseconds (nearest rank); None when there are no samples."""
    if not samples_ns:
        return None, None, None
    s = sorted(samples_ns)
    n = len(s)
    return tuple(s[min(n - 1, int(q * n))] / 1e6 for q in (0.5, 0.99, 0.999))  # type: ignore[return-value]


class _Meter:
    """Wall time plus CPU used by this process and by the server over one measured phase, and how busy
    the server's core was with other work (other processes skew a shared machine's numbers)."""

    __slots__ = ("_b0", "_c0", "_s0", "_server", "_t0", "other_cpu")

    def __init__(self, server: Server) -> None:
        self._server = server
        self._t0 = time.perf_counter()
        self._c0 = time.process_time()
        self._s0 = _server_cpu(server)
        self._b0 = core_busy_seconds(SERVER_CORE)
        self.other_cpu = 0.0

    def stop(self) -> tuple[float, float, float]:
        wall = max(time.perf_counter() - self._t0, 1e-9)
        server_cpu = (_server_cpu(self._server) - self._s0) / wall
        self.other_cpu = max(0.0, (core_busy_seconds(SERVER_CORE) - self._b0) / wall - server_cpu)
        return wall, (time.process_time() - self._c0) / wall, server_cpu


def _server_cpu(server: Server) -> float:
    try:
        return server.cpu_seconds()
    except OSError:
        return 0.0


def _prefix(scenario: str) -> str:
    return f"lt-{scenario}-{secrets.token_hex(3)}"


def endpoint_for(server: Server, p: Params) -> Endpoint:
    return server.endpoint(tls=p.tls, auth=p.auth)


async def open_many(server: Server | Endpoint, n: int, prefix: str, counters: Counters, concurrency: int,
                    keepalive: int = 600, strict: bool = True) -> tuple[list[MqttConn], int]:
    """Open n connections, at most `concurrency` handshakes at a time; returns (connections, failures).
    A Server is reached plainly and anonymously; pass an Endpoint for TLS or credentials."""
    sem = asyncio.Semaphore(max(1, concurrency))
    ep = server if isinstance(server, Endpoint) else server.endpoint()

    async def one(i: int) -> MqttConn:
        async with sem:
            return await ep.connect(f"{prefix}-{i}", counters, index=i, keepalive=keepalive)

    results = await asyncio.gather(*(one(i) for i in range(n)), return_exceptions=True)
    conns = [r for r in results if isinstance(r, MqttConn)]
    errors = [r for r in results if not isinstance(r, MqttConn)]
    if errors and strict:
        await close_all(conns)
        raise RuntimeError(f"{len(errors)}/{n} connections failed; first: {errors[0]!r}")
    return conns, len(errors)


async def close_all(conns: list[MqttConn]) -> None:
    for c in conns:
        c.write(DISCONNECT)
        c.close()
    await asyncio.sleep(0.05)  # let the transports flush and close


async def subscribe_all(conns: list[MqttConn], topics: list[str], qos: int, timeout: float = 30.0) -> None:
    granted = await asyncio.wait_for(
        asyncio.gather(*(c.subscribe(t, qos) for c, t in zip(conns, topics, strict=True))), timeout)
    refused = sum(1 for g in granted if g >= 0x80)
    if refused:
        raise RuntimeError(f"{refused} subscriptions refused")


async def _paced(pubs: list[MqttConn], msg_rate: float, seconds: float) -> int:
    """Send msg_rate msgs/s in total, spread over the publishers, in 1 ms ticks; returns msgs skipped
    because a QoS>0 window was full (the server was not acking fast enough)."""
    per_pub = msg_rate / len(pubs)
    start = time.perf_counter()
    done = skipped = 0
    while True:
        elapsed = time.perf_counter() - start
        due = int(min(elapsed, seconds) * per_pub) - done
        if due > 0:
            for c in pubs:
                skipped += due - c.send(due)
            done += due
        if elapsed >= seconds:
            return skipped
        await asyncio.sleep(0.001)


async def _windowed(pubs: list[MqttConn], seconds: float) -> None:
    """Each publisher keeps its window full: every ack triggers the next publish (see MqttConn.refill)."""
    for c in pubs:
        c.refill = True
        if c.publisher is not None:
            c.send(c.publisher.window)
    await asyncio.sleep(seconds)
    for c in pubs:
        c.refill = False


async def _settle(counters: Counters, pubs: list[MqttConn], fan: int, qos: int, drain: float) -> None:
    """Wait (bounded) for outstanding acks, then until every expected delivery arrived or `drain` passed."""
    deadline = time.perf_counter() + ACK_WAIT_S
    while time.perf_counter() < deadline and any(
            c.publisher is not None and c.publisher.inflight > 0 for c in pubs):
        await asyncio.sleep(0.01)
    deadline = time.perf_counter() + drain
    while time.perf_counter() < deadline:
        expected = (counters.acked if qos else counters.sent) * fan
        if counters.received - counters.dup >= expected:
            return
        await asyncio.sleep(0.01)


async def _phase(server: Server, name: str, counters: Counters, pubs: list[MqttConn], fan: int, qos: int,
                 p: Params, seconds: float, msg_rate: float | None) -> Result:
    """One measured run: paced if msg_rate is given, else window mode; then settle and count."""
    counters.reset()
    meter = _Meter(server)
    skipped = 0
    if msg_rate is not None:
        skipped = await _paced(pubs, msg_rate, seconds)
    else:
        await _windowed(pubs, seconds)
    received_in_time = counters.received
    duration, load_cpu, server_cpu = meter.stop()
    await _settle(counters, pubs, fan, qos, p.drain)
    expected = (counters.acked if qos else counters.sent) * fan
    p50, p99, p999 = percentiles(counters.latencies_ns)
    extra: dict[str, float] = {"qos": qos, "subscribers_per_msg": fan, "core0_other_cpu": meter.other_cpu}
    if qos:
        extra["acked"] = counters.acked
    if skipped:
        extra["skipped_window_full"] = skipped
    if msg_rate is not None:
        extra["target_msgs_per_s"] = msg_rate
    return Result(
        scenario=name, server=server.label, rate=received_in_time / duration, sent=counters.sent,
        received=counters.received, lost=max(0, expected - (counters.received - counters.dup)),
        dup=counters.dup, p50_ms=p50, p99_ms=p99, p999_ms=p999, duration_s=duration,
        load_cpu=load_cpu, server_cpu=server_cpu, extra=extra)


async def _pubsub(server: Server, name: str, p: Params, qos: int, sub_topics: list[str],
                  pub_topics: list[str], fan: int, window: int | None, msg_rate: float | None) -> Result:
    """Connect and subscribe everyone, attach publishers, run one phase, close everything."""
    counters = Counters()
    prefix = _prefix(name)
    ep = endpoint_for(server, p)
    subs, _ = await open_many(ep, len(sub_topics), prefix + "-s", counters, p.open_concurrency)
    pubs: list[MqttConn] = []
    try:
        pubs, _ = await open_many(ep, len(pub_topics), prefix + "-p", counters, p.open_concurrency)
        await subscribe_all(subs, sub_topics, qos)
        for i, (c, topic) in enumerate(zip(pubs, pub_topics, strict=True)):
            c.publisher = Publisher(counters, topic, qos, i + 1, p.payload, window or 65000)
        if name == "fanout" and msg_rate is not None and math.isinf(msg_rate):
            return await _ramp(server, counters, pubs, fan, qos, p)
        return await _phase(server, name, counters, pubs, fan, qos, p, p.seconds, msg_rate)
    finally:
        await close_all(subs + pubs)


async def _ramp(server: Server, counters: Counters, pubs: list[MqttConn], fan: int, qos: int,
                p: Params) -> Result:
    """Find the highest sustainable fanout rate: go up by RAMP_FACTOR while a step passes, or down while
    the first steps fail. A step fails on loss, p99 > max_p99_ms, or missing the target rate."""
    rate = p.ramp_start
    best: Result | None = None
    failed: Result | None = None
    steps = 0
    for steps in range(1, max(1, p.max_steps) + 1):  # noqa: B007 - reported below
        r = await _phase(server, "fanout", counters, pubs, fan, qos, p, p.step_seconds, rate / fan)
        r.extra["target_deliveries_per_s"] = rate
        ok = (r.lost == 0 and (r.p99_ms or 0.0) <= p.max_p99_ms and r.rate >= 0.95 * rate
              and "skipped_window_full" not in r.extra)
        if ok:
            best = r
            if failed is not None:
                break  # came down from a failure: this is the answer
            rate *= RAMP_FACTOR
        else:
            failed = r
            if best is not None:
                break
            rate /= RAMP_FACTOR
    out = best or failed
    assert out is not None
    out.extra["max_search_steps"] = steps
    out.extra["sustainable"] = 1.0 if best is not None else 0.0
    if failed is not None and failed is not out:
        out.extra["failed_at_target"] = failed.extra["target_deliveries_per_s"]
        out.extra["failed_p99_ms"] = failed.p99_ms or 0.0
        out.extra["failed_lost"] = failed.lost
    return out


async def fanout(server: Server, p: Params) -> Result:
    qos = 0 if p.qos is None else p.qos
    rate = 80_000.0 if p.rate is None else p.rate
    n = p.subscribers
    msg_rate = math.inf if math.isinf(rate) else rate / n
    return await _pubsub(server, "fanout", p, qos, ["bench/fanout"] * n, ["bench/fanout"], n, None, msg_rate)


async def fanin(server: Server, p: Params) -> Result:
    qos = 1 if p.qos is None else p.qos
    pub_topics = [f"bench/{i}/data" for i in range(p.publishers)]
    return await _pubsub(server, "fanin", p, qos, ["bench/+/data"], pub_topics, 1, p.window or 100, None)


async def pairs(server: Server, p: Params) -> Result:
    qos = 1 if p.qos is None else p.qos
    topics = [f"bench/pair/{i}" for i in range(p.pairs)]
    return await _pubsub(server, "pairs", p, qos, topics, topics, 1, p.window or 10, None)


async def latency(server: Server, p: Params) -> Result:
    qos = 1 if p.qos is None else p.qos
    rate = 1000.0 if p.rate is None or math.isinf(p.rate) else p.rate
    return await _pubsub(server, "latency", p, qos, ["bench/latency"], ["bench/latency"], 1, None, rate)


async def idle(server: Server, p: Params) -> Result:
    """Open idle connections (keepalive 600) and report the server's RSS growth per connection."""
    rss0 = server.rss_kb()
    counters = Counters()
    t0 = time.perf_counter()
    conns, failed = await open_many(endpoint_for(server, p), p.connections, _prefix("idle"), counters,
                                    p.open_concurrency, keepalive=600, strict=False)
    open_s = time.perf_counter() - t0
    try:
        await asyncio.sleep(1.0)  # let the server finish per-connection setup before sampling
        rss1 = server.rss_kb()
    finally:
        await close_all(conns)
    per_conn = (rss1 - rss0) / max(1, len(conns))
    return Result(
        scenario="idle", server=server.label, rate=per_conn, unit="KB/conn", duration_s=open_s,
        extra={"connections": len(conns), "failed": failed, "rss_before_kb": rss0, "rss_after_kb": rss1,
               "open_conns_per_s": len(conns) / max(open_s, 1e-9)})


async def connect_rate(server: Server, p: Params) -> Result:
    """Concurrent connect (+ TLS handshake) + CONNECT/CONNACK + DISCONNECT loops; reports connections/s and
    the latency from opening the socket to CONNACK. Only accepted CONNACKs count: a refused one (wrong
    password, server busy) is an error, so a broken setup shows as errors, not as speed."""
    counters = Counters()
    prefix = _prefix("connect")
    ep = endpoint_for(server, p)
    lat: list[int] = []
    errors: list[BaseException] = []
    refused = attempts = first_refusal = slow_closes = 0
    meter = _Meter(server)
    deadline = time.perf_counter() + p.seconds

    async def worker(w: int) -> None:
        nonlocal refused, attempts, first_refusal, slow_closes
        i = 0
        while time.perf_counter() < deadline and len(errors) < MAX_CONNECT_ERRORS:
            i += 1
            attempts += 1  # also picks the user: consecutive attempts log in as different users
            t = time.perf_counter_ns()
            try:
                conn = await ep.connect(f"{prefix}-{w}-{i}", counters, index=attempts, keepalive=60)
            except ConnackRefused as e:
                refused += 1
                first_refusal = first_refusal or e.code
                errors.append(e)
                continue
            except (OSError, TimeoutError, ConnectionError) as e:
                errors.append(e)
                continue
            lat.append(time.perf_counter_ns() - t)
            if not await disconnect(conn, DISCONNECT_WAIT_S):
                slow_closes += 1  # the wait caps this loop's rate: shown, so it is not mistaken for slow connects

    await asyncio.gather(*(worker(w) for w in range(max(1, p.concurrency))))
    duration, load_cpu, server_cpu = meter.stop()
    p50, p99, p999 = percentiles(lat)
    return Result(
        scenario="connect", server=server.label, rate=len(lat) / duration, unit="conns/s", sent=len(lat),
        received=len(lat), p50_ms=p50, p99_ms=p99, p999_ms=p999, duration_s=duration, load_cpu=load_cpu,
        server_cpu=server_cpu,
        extra={"errors": len(errors), "refused": refused, "first_refused_code": first_refusal,
               "slow_closes": slow_closes, "concurrency": p.concurrency, "core0_other_cpu": meter.other_cpu})


async def storm(server: Server, p: Params) -> Result:
    """What a connect storm costs the clients already connected: the `latency` stream (QoS 1 at `--rate`,
    1k/s by default) measured while `--concurrency` loops connect and disconnect as fast as they can, with
    `--auth`/`--tls` as set (password checks and handshakes included). Compare with `latency` alone."""
    connects = asyncio.create_task(connect_rate(server, p))
    stream = await latency(server, p)
    storm_result = await connects
    return dataclasses.replace(stream, scenario="storm", extra={
        **stream.extra, "storm_conns_per_s": storm_result.rate, "storm_connack_p99_ms": storm_result.p99_ms or 0.0,
        "storm_errors": storm_result.extra.get("errors", 0)})


ScenarioFn = Callable[[Server, Params], Awaitable[Result]]
SCENARIOS: Mapping[str, ScenarioFn] = MappingProxyType({
    "fanout": fanout, "fanin": fanin, "pairs": pairs, "latency": latency, "idle": idle,
    "connect": connect_rate, "storm": storm,
})
