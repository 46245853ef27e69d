"""Redis store vs embedded store on one node: throughput of each (median of fresh servers) and what Redis does
per message. Run through `python -m loadtest.cluster_bench store` (see its docstring for the numbers).

Measures (QoS 1 unless said; fan-in is 10 publishers → one `bench/+/data` subscriber):
- `fanin`: every publisher keeps `window` publishes unacked; headline = deliveries within the run, plus how
  many publishes/s were acknowledged (a store can accept faster than it delivers).
- `fanin-max`: paced fan-in, stepped up by 1.3x until a step (tried twice) loses, misses its rate or has
  p99 > 50 ms.
- `fanout-max`: 1 → `subscribers` (QoS `fanout_qos`), the highest sustainable deliveries/s, found the same way.
- `fanin-cmds`, `fanout-cmds`: a paced run at a rate both stores sustain, with Redis `INFO commandstats` and
  `INFO stats` read before and after: commands, EVALSHA/FCALL calls and round trips (`total_reads_processed`,
  one per read event on a client socket) per message.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import secrets
import statistics
import sys
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from loadtest import servers
from loadtest.client import Counters, MqttConn, Publisher
from loadtest.redis_proc import RedisCounters, delta
from loadtest.scenarios import RAMP_FACTOR, SCENARIOS, Params, Result, _phase, close_all, open_many, subscribe_all

T = TypeVar("T")
MEASURES = ("fanin", "fanin-max", "fanout-max", "fanin-cmds", "fanout-cmds")
RATIO_MEASURES = ("fanin", "fanin-max", "fanout-max")


def run(coro: Coroutine[Any, Any, T]) -> T:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return asyncio.run(coro)
    return uvloop.run(coro)


@dataclass(slots=True)
class StoreConfig:
    seconds: float = 5.0  # fanin run length
    publishers: int = 10
    window: int = 100  # fanin: unacked publishes per publisher
    subscribers: int = 200  # fanout
    fanout_qos: int = 0
    fanin_ramp_start: float = 8_000.0  # msgs/s
    fanout_ramp_start: float = 20_000.0  # deliveries/s; low: the first steps warm the node up
    step_seconds: float = 2.0
    max_steps: int = 16  # 1.3^15 = 50x the first rate
    cmd_fanin_rate: float = 3_000.0  # msgs/s of fanin-cmds
    cmd_fanout_rate: float = 100.0  # msgs/s of fanout-cmds (each delivered to every subscriber)
    cmd_seconds: float = 3.0
    drain: float = 2.0


@dataclass(slots=True)
class StoreRun:
    result: Result
    redis: RedisCounters | None  # what Redis did during the run (None: embedded store, or not asked for)

    def messages(self) -> int:
        """Messages published (at QoS 1: acknowledged) in the run."""
        return int(self.result.extra.get("acked", self.result.sent))


async def ramp(server: servers.Server, name: str, counters: Counters, pubs: list[MqttConn], fan: int, qos: int,
               p: Params) -> Result:
    """The highest sustainable deliveries/s: up by RAMP_FACTOR while a step passes (no loss, p99 within
    max_p99_ms, 95% of the target rate), down while the first steps fail. Unlike scenarios' ramp a failed step
    is tried once more: one stall of a shared machine must not end the search."""
    rate, best, failed, retried, steps = p.ramp_start, None, None, False, 0
    for steps in range(1, max(1, p.max_steps) + 1):  # noqa: B007 - reported below
        r = await _phase(server, name, counters, pubs, fan, qos, p, p.step_seconds, rate / fan)
        r.extra["target_deliveries_per_s"] = rate
        if (r.lost == 0 and (r.p99_ms or 0.0) <= p.max_p99_ms and r.rate >= 0.95 * rate
                and "skipped_window_full" not in r.extra):
            best, retried = r, False
            if failed is not None:
                break  # came down from a failure: this is the answer
            rate *= RAMP_FACTOR
        elif not retried:
            retried = True
        else:
            failed, retried = r, False
            if best is not None:
                break
            rate /= RAMP_FACTOR
    out = best or failed
    assert out is not None
    out.extra.update({"max_search_steps": steps, "sustainable": float(best is not None)})
    if failed is not None and failed is not out:
        out.extra.update({"failed_at_target": failed.extra["target_deliveries_per_s"],
                          "failed_p99_ms": failed.p99_ms or 0.0, "failed_lost": failed.lost})
    return out


async def paced(server: servers.Server, p: Params, kind: str) -> Result:
    """`fanin` (publishers → one `bench/+/data` subscriber, QoS 1) or `fanout` (one publisher → p.subscribers,
    QoS p.qos) at p.rate deliveries/s, or (rate inf) the highest sustainable rate."""
    counters = Counters()
    prefix = f"lt-{kind}-{secrets.token_hex(3)}"
    ep = server.endpoint()
    fanin = kind == "fanin"
    qos = 1 if fanin or p.qos is None else p.qos
    n_subs, n_pubs = (1, p.publishers) if fanin else (p.subscribers, 1)
    subs, _ = await open_many(ep, n_subs, prefix + "-s", counters, p.open_concurrency)
    pubs: list[MqttConn] = []
    try:
        pubs, _ = await open_many(ep, n_pubs, prefix + "-p", counters, p.open_concurrency)
        await subscribe_all(subs, ["bench/+/data" if fanin else "bench/fanout"] * n_subs, qos)
        for i, c in enumerate(pubs):
            c.publisher = Publisher(counters, f"bench/{i}/data" if fanin else "bench/fanout", qos, i + 1, p.payload)
        rate = math.inf if p.rate is None else p.rate
        if math.isinf(rate):
            return await ramp(server, f"{kind}-max", counters, pubs, n_subs, qos, p)
        return await _phase(server, f"{kind}-paced", counters, pubs, n_subs, qos, p, p.seconds, rate / n_subs)
    finally:
        await close_all(subs + pubs)


async def fanin_paced(server: servers.Server, p: Params) -> Result:
    return await paced(server, p, "fanin")


async def fanout_paced(server: servers.Server, p: Params) -> Result:
    return await paced(server, p, "fanout")


Measure = Callable[[servers.Server, Params], Awaitable[Result]]


def measure_plan(cfg: StoreConfig) -> dict[str, tuple[Measure, Params]]:
    base = Params(publishers=cfg.publishers, subscribers=cfg.subscribers, drain=cfg.drain,
                  step_seconds=cfg.step_seconds, max_steps=cfg.max_steps)

    def p(**kw: Any) -> Params:
        return dataclasses.replace(base, **kw)

    return {
        "fanin": (SCENARIOS["fanin"], p(seconds=cfg.seconds, qos=1, window=cfg.window)),
        "fanin-max": (fanin_paced, p(rate=math.inf, ramp_start=cfg.fanin_ramp_start)),
        "fanout-max": (fanout_paced, p(qos=cfg.fanout_qos, rate=math.inf, ramp_start=cfg.fanout_ramp_start)),
        "fanin-cmds": (fanin_paced, p(seconds=cfg.cmd_seconds, rate=cfg.cmd_fanin_rate)),
        "fanout-cmds": (fanout_paced, p(seconds=cfg.cmd_seconds, qos=cfg.fanout_qos,
                                               rate=cfg.cmd_fanout_rate * cfg.subscribers)),
    }


async def _measure_all(server: servers.Server, measures: list[str], cfg: StoreConfig) -> dict[str, StoreRun]:
    plan = measure_plan(cfg)
    out: dict[str, StoreRun] = {}
    for name in measures:
        fn, p = plan[name]
        counting = server.redis is not None and name.endswith("-cmds")
        before = server.redis.counters() if counting and server.redis is not None else None
        r = await fn(server, p)
        after = server.redis.counters() if counting and server.redis is not None else None
        out[name] = StoreRun(r, delta(before, after) if before is not None and after is not None else None)
    return out


def store_run(store: str, measures: list[str], cfg: StoreConfig, pin: bool) -> dict[str, StoreRun]:
    """One fresh node on `store` (embedded, redis) running every measure in turn."""
    with servers.start("tidewire", core=servers.SERVER_CORE if pin else None, store=store) as server:
        return run(_measure_all(server, measures, cfg))


def redis_line(measure: str, runs: list[StoreRun], top: int = 6) -> str:
    """Commands, EVALSHA/FCALL and round trips per message (and per delivery): the median over the runs."""
    per: dict[str, list[float]] = {}
    for r in runs:
        m = r.messages()
        if r.redis is None or not m:
            continue
        per.setdefault("commands", []).append(r.redis.commands / m)
        per.setdefault("round trips", []).append(r.redis.reads / m)
        per.setdefault("evalsha", []).append(r.redis.calls.get("evalsha", 0) / m)
        per.setdefault("fcall", []).append(r.redis.calls.get("fcall", 0) / m)
        per.setdefault("per delivery", []).append(r.redis.commands / max(1, r.result.received))
        for cmd, calls in r.redis.calls.items():
            per.setdefault(f"cmd {cmd}", []).append(calls / m)
    if not per:
        return f"redis        {measure}: no Redis counters"
    med = {k: statistics.median(v) for k, v in per.items()}
    cmds = sorted(((k[4:], v) for k, v in med.items() if k.startswith("cmd ")), key=lambda kv: -kv[1])[:top]
    return (f"redis        {measure}: {med['commands']:.2f} commands/msg ({med['per delivery']:.3f}/delivery), "
            f"{med['evalsha']:.2f} evalsha/msg, {med['fcall']:.2f} fcall/msg, {med['round trips']:.2f} round "
            "trips/msg; top per msg: " + ", ".join(f"{c} {v:.2f}" for c, v in cmds))


def store_line(measure: str, store: str, runs: list[StoreRun]) -> str:
    rates = [r.result.rate for r in runs]
    mid = sorted(runs, key=lambda r: r.result.rate)[len(runs) // 2].result
    published = statistics.median(r.messages() / max(r.result.duration_s, 1e-9) for r in runs)
    sustainable = "" if "sustainable" not in mid.extra else f", sustainable {int(mid.extra['sustainable'])}"
    other = statistics.median(r.result.extra.get("core0_other_cpu", 0.0) for r in runs)
    return (f"store        {measure} {store}: median {statistics.median(rates):,.0f} {mid.unit} delivered "
            f"(runs {', '.join(f'{x:,.0f}' for x in rates)}), {published:,.0f} msgs/s published; median run: "
            f"p50 {mid.p50_ms or 0:.2f} ms, p99 {mid.p99_ms or 0:.2f} ms, lost {mid.lost:,}, "
            f"server cpu {mid.server_cpu:.0%}, other processes on core 0 {other:.0%}{sustainable}")


def compare_stores(stores: list[str], measures: list[str], cfg: StoreConfig, runs: int, pin: bool) -> bool:
    """Print one line per measure and store, the redis/embedded ratios and the Redis per-message costs."""
    ok = True
    results: dict[str, dict[str, list[StoreRun]]] = {m: {} for m in measures}
    for store in stores:
        for _ in range(runs):
            try:
                for m, r in store_run(store, measures, cfg, pin).items():
                    results[m].setdefault(store, []).append(r)
            except Exception as e:  # one broken store must not hide the other's numbers
                ok = False
                print(f"error        {store}: {str(e)[:1500]}", file=sys.stderr, flush=True)
    for m in measures:
        medians: dict[str, float] = {}
        for store, rs in results[m].items():
            medians[store] = statistics.median(r.result.rate for r in rs)
            print(store_line(m, store, rs), flush=True)
            if store == "redis" and m.endswith("-cmds"):
                print(redis_line(m, rs), flush=True)
        if m in RATIO_MEASURES and medians.get("embedded") and "redis" in medians:
            print(f"ratio        {m} redis/embedded = {medians['redis'] / medians['embedded']:.2f} (aim >= 0.5)",
                  flush=True)
        waits = sorted(s for s in medians if s.startswith(servers.REPLICA_WAIT_STORE))
        if len(waits) > 1 and medians[waits[0]]:  # what waiting for replicas costs, against the fewest waits
            for store in waits[1:]:
                print(f"ratio        {m} {store}/{waits[0]} = {medians[store] / medians[waits[0]]:.2f}", flush=True)
    return ok
