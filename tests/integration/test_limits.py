"""Limits end to end against the running gateway: connection rate and count, inbound publish rate, subscriptions
per client, topic length and depth, 3.1.1 session expiration, and shedding CONNECTs when authentication is slow.

Of these, Mosquitto 2.0.11 has only `max_connections`, and it refuses by closing the socket at accept instead
of answering CONNACK; everything else is marked tidewire_only.
"""

from __future__ import annotations

import json
import selectors
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType

import pytest

from tests.integration.conftest import TARGET, GatewayFactory, PahoClient, PahoFactory
from tests.integration.rawmqtt import RawClient
from tidewire.gateway.protocols.mqtt.codec import (
    Connack,
    Connect,
    Packet,
    Pingreq,
    Pingresp,
    Puback,
    Publish,
    Suback,
    Subscribe,
    SubscriptionRequest,
    Unsuback,
    Unsubscribe,
    encode,
)

BUSY = {5: 0x89, 4: 3}  # Server busy / 3.1.1 "server unavailable"
RATE_EXCEEDED = {5: 0x9F, 4: 3}
RTT_LIMIT = 0.2  # s: an innocent client's publish -> receive round trip while another client is limited


# -- raw helpers ---------------------------------------------------------------------------------------------

def send_connect(raw: RawClient, client_id: str, username: str | None = None, password: bytes | None = None,
                 clean: bool = True) -> None:
    try:
        raw.send(Connect(client_id=client_id, protocol_level=raw.level, clean_start=clean, username=username,
                         password=password))
    except OSError:
        pass  # the server may refuse at accept (Mosquitto) before our CONNECT is written; reading shows it


def first_packets(clients: list[RawClient], timeout: float) -> list[tuple[Packet | None, float]]:
    """Each client's first packet from the server (None: closed first) and when it arrived, read concurrently."""
    start = time.monotonic()
    out: dict[int, tuple[Packet | None, float]] = {}
    with selectors.DefaultSelector() as sel:
        for i, c in enumerate(clients):
            if c.pending:
                out[i] = (c.pending.popleft(), 0.0)
            else:
                sel.register(c.sock, selectors.EVENT_READ, i)
        while len(out) < len(clients):
            left = start + timeout - time.monotonic()
            if left <= 0:
                missing = sorted(set(range(len(clients))) - set(out))
                raise AssertionError(f"clients {missing} got nothing within {timeout}s")
            for key, _ in sel.select(left):
                i = key.data
                c = clients[i]
                try:
                    data = c.sock.recv(65536)
                except (ConnectionResetError, BrokenPipeError):
                    data = b""
                now = time.monotonic() - start
                if not data:
                    c.eof = True
                    out[i] = (None, now)
                else:
                    c.pending.extend(c.parser.feed(data))
                    if not c.pending:
                        continue
                    out[i] = (c.pending.popleft(), now)
                sel.unregister(c.sock)
    return [out[i] for i in range(len(clients))]


def assert_refused(raw: RawClient, code: int, packet: Packet | None = None) -> None:
    """The server refused with CONNACK `code` and closed; Mosquitto may instead close without a CONNACK."""
    got = raw.until_closed(2.0)
    if packet is not None:
        got.insert(0, packet)
    raw.close()  # a refused socket must not keep counting against the limits of the next steps
    if not got and TARGET == "mosquitto":
        return
    assert len(got) == 1 and isinstance(got[0], Connack), f"expected one refusing CONNACK, got {got}"
    assert got[0].reason_code == code, f"CONNACK {got[0].reason_code:#x}, expected {code:#x}"


def ping(raw: RawClient) -> None:
    raw.send(Pingreq())
    raw.expect(Pingresp)


def subscribe(raw: RawClient, packet_id: int, filters: list[str], qos: int = 1) -> list[int]:
    raw.send(Subscribe(packet_id, [SubscriptionRequest(f, qos) for f in filters]))
    ack = raw.expect(Suback)
    assert ack.packet_id == packet_id
    return list(ack.reason_codes)


def connect_eventually(port: int, client_id: str, timeout: float) -> RawClient:
    """Connect, retrying while the server still counts a client that just left."""
    deadline = time.monotonic() + timeout
    while True:
        raw = RawClient(port, level=5)
        send_connect(raw, client_id)
        try:
            packet = raw.recv(1.0)
        except Exception:
            packet = None
        if isinstance(packet, Connack) and packet.reason_code == 0:
            return raw
        raw.close()
        if time.monotonic() > deadline:
            raise AssertionError(f"{client_id} still refused after {timeout}s: {packet}")
        time.sleep(0.1)  # the retry interval of this wait


class RoundTrips:
    """Times one client's publish -> receive round trips in a thread while the test does something else."""

    def __init__(self, client: PahoClient, topic: str) -> None:
        self.client = client
        self.topic = topic
        self.samples: list[float] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> RoundTrips:
        self.client.subscribe(self.topic, 1)
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        i = 0
        try:
            while not self._stop.is_set():
                tag = f"rt{i}".encode()
                t0 = time.monotonic()
                self.client.publish(self.topic, tag, qos=1, wait=False)
                msg = self.client.get(2.0)
                self.samples.append(time.monotonic() - t0)
                assert msg.payload == tag, f"round trip got {msg.payload!r}, sent {tag!r}"
                i += 1
                self._stop.wait(0.05)
        except BaseException as exc:
            self.error = exc

    def check(self, min_samples: int) -> None:
        if self.error is not None:
            raise AssertionError(f"innocent client failed: {self.error!r}")
        assert len(self.samples) >= min_samples, f"only {len(self.samples)} round trips"
        worst = max(self.samples)
        assert worst < RTT_LIMIT, f"innocent round trip {worst * 1000:.0f} ms (samples {len(self.samples)})"


# -- connection rate and count ----------------------------------------------------------------------------

@pytest.mark.tidewire_only  # Mosquitto has no connection rate limit
def test_connection_rate_token_bucket(gateway_factory: GatewayFactory) -> None:
    gw = gateway_factory(env={"TIDEWIRE_MAX_CONNECTION_RATE": "2", "TIDEWIRE_CONNECTION_RATE_BURST": "3"})
    clients = [RawClient(gw.port, level=5 if i % 2 == 0 else 4) for i in range(8)]
    for i, c in enumerate(clients):
        send_connect(c, f"rate-{i}")
    firsts = first_packets(clients, 3.0)
    accepted = [c for c, (p, _) in zip(clients, firsts, strict=True) if isinstance(p, Connack) and not p.reason_code]
    assert len(accepted) == 3, f"burst 3 must admit exactly 3 of 8: {firsts}"
    for c, (p, _) in zip(clients, firsts, strict=True):
        if c not in accepted:
            assert_refused(c, RATE_EXCEEDED[c.level], p)
    # the admitted clients are unaffected by the refusals around them
    subscribe(accepted[0], 1, ["rate/t"], qos=0)
    accepted[1].publish("rate/t", b"still here")
    assert accepted[0].expect(Publish).payload == b"still here"
    # the bucket refills at 2/s: after ~1 s a new CONNECT is admitted again
    time.sleep(1.1)  # the behaviour under test: time refills the bucket
    late = RawClient(gw.port, level=5)
    late.connect("rate-late")
    for c in [*accepted, late]:
        ping(c)
        c.close()


@pytest.mark.parametrize("form", [pytest.param("listener", marks=pytest.mark.tidewire_only), "node"])
def test_max_connections(gateway_factory: GatewayFactory, form: str) -> None:
    if form == "listener":
        env = {"TIDEWIRE_LISTENERS": json.dumps({"mqtt": {"max_connections": 2}})}
    else:
        env = {"TIDEWIRE_MAX_CONNECTIONS": "2"}
    gw = gateway_factory(env=env)
    a = RawClient(gw.port, level=5)
    a.connect("max-a")
    b = RawClient(gw.port, level=4)
    b.connect("max-b")
    for level in (5, 4):
        extra = RawClient(gw.port, level=level)
        send_connect(extra, f"max-extra-{level}")
        assert_refused(extra, BUSY[level])
    ping(a)
    ping(b)
    b.disconnect()
    c = connect_eventually(gw.port, "max-c", 3.0)
    ping(a)
    ping(c)
    a.close()
    c.close()


# -- inbound rate ------------------------------------------------------------------------------------------

@pytest.mark.tidewire_only  # Mosquitto has no per-client inbound rate limit
@pytest.mark.parametrize("kind", ["messages", "bytes"])
def test_inbound_rate_slows_publisher_loses_nothing(gateway_factory: GatewayFactory, paho_factory: PahoFactory,
                                                    kind: str) -> None:
    topic = "rate/in"
    if kind == "messages":
        rate, size, n = 50, 8, 150
        env = {"TIDEWIRE_MAX_INBOUND_RATE": str(rate)}
        # burst = one second's worth, then `rate` per second
        expected = (n - rate) / rate
    else:
        rate, size, n = 50_000, 500, 300
        env = {"TIDEWIRE_MAX_INBOUND_BYTES_RATE": str(rate)}
        packet = len(encode(Publish(topic=topic, payload=b"x" * size, qos=1, packet_id=1), 5))
        expected = (n * packet - rate) / rate
    gw = gateway_factory(env=env)
    sub = paho_factory(gw.port, "rate-sub")
    sub.connect()
    sub.subscribe(topic, 1)
    pub = paho_factory(gw.port, "rate-pub")
    pub.connect()
    other = paho_factory(gw.port, "rate-other")
    other.connect()
    payloads = [f"{i:06d}".encode().ljust(size, b".") for i in range(n)]
    with RoundTrips(other, "rate/other") as rtts:
        start = time.monotonic()
        mids = [pub.publish(topic, p, qos=1, wait=False) for p in payloads]
        got = sub.expect(n, timeout=2 * expected + 3)
        elapsed = time.monotonic() - start
    for mid in mids:
        pub.wait_ack(mid)
    assert [m.payload for m in got] == payloads, "messages lost or reordered under the inbound rate limit"
    assert elapsed >= 0.9 * expected, f"{n} publishes took {elapsed:.2f}s; the limit allows no less than {expected:.2f}"
    assert elapsed <= 1.5 * expected + 1.0, f"{n} publishes took {elapsed:.2f}s; expected about {expected:.2f}s"
    rtts.check(min_samples=10)


# -- subscriptions and topics ---------------------------------------------------------------------------------

@pytest.mark.tidewire_only  # Mosquitto has no per-client subscription limit
@pytest.mark.parametrize("level", [4, 5])
def test_max_subscriptions(gateway_factory: GatewayFactory, level: int) -> None:
    gw = gateway_factory(env={"TIDEWIRE_MAX_SUBSCRIPTIONS": "2"})
    quota = 0x97 if level == 5 else 0x80
    c = RawClient(gw.port, level=level)
    c.connect(f"subs-{level}")
    assert subscribe(c, 1, ["s/a", "s/b", "s/c"]) == [1, 1, quota]
    assert subscribe(c, 2, ["s/a"]) == [1], "re-subscribing an existing filter is not a new subscription"
    assert subscribe(c, 3, ["s/b", "s/c"]) == [1, quota]
    c.publish("s/c", b"refused filter")
    c.nothing(0.4)
    c.send(Unsubscribe(4, ["s/b"]))
    assert c.expect(Unsuback).packet_id == 4
    assert subscribe(c, 5, ["s/c"]) == [1]
    c.publish("s/c", b"fits now")
    assert c.expect(Publish).payload == b"fits now"
    c.close()


@pytest.mark.tidewire_only  # Mosquitto 2.0.11 has no topic length or depth setting
@pytest.mark.parametrize("level", [4, 5])
def test_topic_length_and_levels(gateway_factory: GatewayFactory, level: int) -> None:
    gw = gateway_factory(env={"TIDEWIRE_MAX_TOPIC_LENGTH": "32", "TIDEWIRE_MAX_TOPIC_LEVELS": "4"})
    watcher = RawClient(gw.port, level=5)
    watcher.connect("topics-watch")
    assert subscribe(watcher, 1, ["#"], qos=0) == [0]
    c = RawClient(gw.port, level=level)
    c.connect(f"topics-{level}")
    too_long, too_deep = "t/" + "x" * 31, "a/b/c/d/e"  # 33 bytes; 5 levels
    longest, deepest = "t/" + "x" * 30, "a/b/c/d"  # exactly at the limits
    for pid, topic in enumerate([too_long, too_deep], 1):
        c.publish(topic, b"refused", qos=1, packet_id=pid)
        ack = c.expect(Puback)
        assert ack.packet_id == pid
        assert ack.reason_code == (0x90 if level == 5 else 0), f"{topic}: PUBACK {ack.reason_code:#x}"
    watcher.nothing(0.3)
    for pid, topic in enumerate([longest, deepest], 10):
        c.publish(topic, b"fits", qos=1, packet_id=pid)
        ack = c.expect(Puback)
        assert (ack.packet_id, ack.reason_code) == (pid, 0), f"{topic}: {ack}"
        msg = watcher.expect(Publish)
        assert (msg.topic, msg.payload) == (topic, b"fits")
    bad_filter = 0x8F if level == 5 else 0x80
    codes = subscribe(c, 20, ["f/" + "y" * 31, "a/b/c/d/#", "a/+/c/#", "f/" + "y" * 30])
    assert codes == [bad_filter, bad_filter, 1, 1]
    ping(c)
    c.close()
    watcher.close()


# -- 3.1.1 session expiration -------------------------------------------------------------------------------

@pytest.mark.slow  # waits out a protocol timer (make test-slow)
@pytest.mark.tidewire_only  # Mosquitto's persistent_client_expiration counts in hours at least
def test_persistent_client_expiration(gateway_factory: GatewayFactory, paho_factory: PahoFactory) -> None:
    gw = gateway_factory(env={"TIDEWIRE_PERSISTENT_CLIENT_EXPIRATION": "2"})
    pub = paho_factory(gw.port, "pce-pub")
    pub.connect()
    old = paho_factory(gw.port, "pce-311", version=4, clean=False)
    new = paho_factory(gw.port, "pce-5", version=5, clean=False)
    assert old.connect().session_present is False
    old.subscribe("pce/311", 1)
    old.disconnect()
    pub.publish("pce/311", b"queued-1", qos=1)
    assert old.connect().session_present is True, "a 3.1.1 session must outlive a short absence"
    assert old.get().payload == b"queued-1"
    assert new.connect(session_expiry=60).session_present is False
    new.subscribe("pce/5", 1)
    old.disconnect()
    new.disconnect()
    pub.publish("pce/311", b"queued-2", qos=1)
    pub.publish("pce/5", b"queued-5", qos=1)
    time.sleep(3.0)  # the behaviour under test: expiration 2 s plus slack for the expiry sweep
    assert old.connect().session_present is False, "the 3.1.1 session outlived persistent_client_expiration"
    old.assert_nothing(0.3)
    res = new.connect(session_expiry=60)
    assert res.session_present is True, "a 5.0 session expires by its own Session Expiry Interval"
    assert new.get().payload == b"queued-5"


# -- overload -----------------------------------------------------------------------------------------------

AUTH_DELAY = 1.5


class SlowAuthServer(ThreadingHTTPServer):
    """An HTTP auth service that answers allow after AUTH_DELAY; records each request body."""

    daemon_threads = False  # server_close() joins the handler threads: nothing leaks past the test

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), SlowAllowHandler)
        self.bodies: list[bytes] = []
        self.lock = threading.Lock()


class SlowAllowHandler(BaseHTTPRequestHandler):
    server: SlowAuthServer

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with self.server.lock:
            self.server.bodies.append(body)
        time.sleep(AUTH_DELAY)  # a slow auth service
        answer = b'{"result": "allow"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def slow_auth() -> Iterator[SlowAuthServer]:
    server = SlowAuthServer()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(5)


@pytest.mark.tidewire_only  # Mosquitto has no HTTP auth hook nor a limit on CONNECTs in authentication
@pytest.mark.slow  # seconds long: `make test-slow` keeps `make test` under its 10 minutes
def test_pending_connects_shed_at_once(gateway_factory: GatewayFactory, paho_factory: PahoFactory,
                                       slow_auth: SlowAuthServer) -> None:
    gw = gateway_factory(env={"TIDEWIRE_MAX_PENDING_CONNECTS": "2", "TIDEWIRE_ALLOW_ANONYMOUS": "true",
                              "TIDEWIRE_HTTP_AUTH_URL": f"http://127.0.0.1:{slow_auth.server_port}/auth",
                              "TIDEWIRE_HTTP_AUTH_CACHE_TTL": "0"})
    steady = paho_factory(gw.port, "steady", username="steady")
    steady.connect(timeout=AUTH_DELAY + 3)
    levels = [5, 4, 5, 4, 5]
    storm = [RawClient(gw.port, level=lv, timeout=AUTH_DELAY + 3) for lv in levels]
    with RoundTrips(steady, "steady/rt") as rtts:
        for i, c in enumerate(storm):
            send_connect(c, f"storm-{i}", username=f"storm{i}", password=b"pw")
        firsts = first_packets(storm, AUTH_DELAY + 3)
    accepted = [c for c, (p, _) in zip(storm, firsts, strict=True) if isinstance(p, Connack) and not p.reason_code]
    assert len(accepted) == 2, f"2 pending CONNECTs allowed, got {firsts}"
    for c, (p, at) in zip(storm, firsts, strict=True):
        if c in accepted:
            assert at >= AUTH_DELAY * 0.8, f"accepted after {at:.2f}s, before the auth service answered"
        else:
            assert at < 0.5, f"shed CONNECT answered after {at:.2f}s; must be refused at once"
            assert_refused(c, BUSY[c.level], p)
    rtts.check(min_samples=10)
    with slow_auth.lock:
        storm_asked = [b for b in slow_auth.bodies if b"storm" in b]
    assert len(storm_asked) == 2, f"shed CONNECTs must not reach the auth service: {storm_asked}"
    for c in accepted:
        ping(c)
        c.close()
