"""Graceful drain on SIGTERM, end to end: a real gateway process, real paho clients and raw sockets.

MQTT 5 clients get DISCONNECT 0x8B (or 0x9C with the Server Reference when one is configured), 3.1.1 clients see
the connection closed, the process exits 0 within `drain_timeout`, nothing a publisher got a PUBACK for is lost
(delivered after the restart to a persistent session), and wills are handled as `gateway.ops.drain` says: due ones
stored and delivered, a delayed one kept.
"""

from __future__ import annotations

import json
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from paho.mqtt.packettypes import PacketTypes

from tests.integration.conftest import TARGET, Gateway, GatewayFactory, PahoClient, PahoFactory, props_dict, v5_props
from tests.integration.rawmqtt import RawClient
from tests.store import redis_server
from tests.waiting import wait_until
from tidewire.gateway.protocols.mqtt.codec import Disconnect, PropertyId, ReasonCode

pytestmark = pytest.mark.skipif(TARGET != "tidewire", reason="Tidewire's drain (Mosquitto is the bench's subject)")

DRAIN_TIMEOUT = 5.0  # s: the node's drain_timeout in these tests
EXPIRY = 300  # s: session expiry of the persistent clients


def sigterm(gw: Gateway) -> tuple[int, float]:
    """SIGTERM; (exit code, seconds until the process exited)."""
    assert gw.proc is not None
    t0 = time.monotonic()
    gw.proc.send_signal(signal.SIGTERM)
    try:
        code = gw.proc.wait(DRAIN_TIMEOUT + 10)
    except subprocess.TimeoutExpired:
        gw.kill9()
        raise AssertionError(f"still running {DRAIN_TIMEOUT + 10}s after SIGTERM:\n{gw.stderr[-3000:]}") from None
    return code, time.monotonic() - t0


def log_event(gw: Gateway, event: str) -> dict[str, str]:
    """The fields of the last `event=<event>` line of the gateway's log (logfmt)."""
    lines = [line for line in gw.stderr.splitlines() if f"event={event} " in line or line.endswith(f"event={event}")]
    assert lines, f"no {event} in the log:\n{gw.stderr[-3000:]}"
    return {k: v.strip('"') for k, v in re.findall(r'(\w+)=("[^"]*"|\S+)', lines[-1])}


def watch_disconnect(c: PahoClient) -> queue.Queue[tuple[int, dict[str, Any]]]:
    """(reason code, properties) of each disconnect paho reports (the wrapper keeps only the code)."""
    got: queue.Queue[tuple[int, dict[str, Any]]] = queue.Queue()

    def on_disconnect(client: Any, userdata: Any, flags: Any, rc: Any, props: Any) -> None:
        got.put((int(rc.value), props_dict(props)))

    c.client.on_disconnect = on_disconnect
    return got


def test_sigterm_sends_0x8b_to_mqtt5_closes_311_and_exits_0_in_time(gateway_factory: GatewayFactory,
                                                                     paho_factory: PahoFactory) -> None:
    gw = gateway_factory(env={"TIDEWIRE_DRAIN_TIMEOUT": str(DRAIN_TIMEOUT)})
    v5 = paho_factory(gw.port, "drain-v5")
    v5_disconnects = watch_disconnect(v5)
    v5.connect()
    v3 = paho_factory(gw.port, "drain-v3", version=4)
    v3.connect()
    raw3 = RawClient(gw.port, level=4)
    raw3.connect("drain-raw3")
    try:
        code, took = sigterm(gw)
        assert code == 0, gw.stderr[-3000:]
        assert took < DRAIN_TIMEOUT, f"exited {took:.2f}s after SIGTERM (drain_timeout {DRAIN_TIMEOUT}s)"
        rc, props = v5_disconnects.get(timeout=3)
        assert rc == ReasonCode.SERVER_SHUTTING_DOWN, f"DISCONNECT {rc:#x}"
        assert "ServerReference" not in props
        v3.wait_disconnect()  # 3.1.1 has no server DISCONNECT: the connection is closed
        assert raw3.until_closed(1.0) == [], "a 3.1.1 client got a packet before the close"
    finally:
        raw3.close()
    started, done = log_event(gw, "drain.started"), log_event(gw, "drain.done")
    assert (started["connections"], started["mqtt5"], started["mqtt311"]) == ("3", "1", "2")
    assert done["left_online"] == "0" and done["cut"] == "none", done
    assert int(done["elapsed_ms"]) < DRAIN_TIMEOUT * 1000


@pytest.mark.slow  # seconds long: `make test-slow` keeps `make test` under its 10 minutes
def test_server_reference_is_sent_with_0x9c(gateway_factory: GatewayFactory, paho_factory: PahoFactory) -> None:
    gw = gateway_factory(env={"TIDEWIRE_SERVER_REFERENCE": "other:1883",
                              "TIDEWIRE_DRAIN_TIMEOUT": str(DRAIN_TIMEOUT)})
    c = paho_factory(gw.port, "drain-ref")
    disconnects = watch_disconnect(c)
    c.connect()
    raw = RawClient(gw.port, level=5)
    raw.connect("drain-ref-raw")
    try:
        code, _ = sigterm(gw)
        assert code == 0, gw.stderr[-3000:]
        rc, props = disconnects.get(timeout=3)
        assert rc == ReasonCode.USE_ANOTHER_SERVER, f"DISCONNECT {rc:#x}"
        assert props.get("ServerReference") == "other:1883", props
        packets = raw.until_closed(1.0)
    finally:
        raw.close()
    assert len(packets) == 1 and isinstance(packets[0], Disconnect), packets
    assert packets[0].reason_code == ReasonCode.USE_ANOTHER_SERVER
    assert packets[0].properties[PropertyId.SERVER_REFERENCE] == "other:1883"


class Stream(threading.Thread):
    """QoS 1 publishes, pipelined (acks not awaited), 1 ms apart, until the connection goes."""

    def __init__(self, pub: PahoClient, first: int) -> None:
        super().__init__(daemon=True)
        self.pub, self.next = pub, first
        self.sent: dict[int, int] = {}  # mid -> message number
        self.running = True

    def run(self) -> None:
        while self.running and self.pub.client.is_connected():
            self.sent[self.pub.client.publish(f"drain/q/{self.next % 4}", str(self.next).encode(), qos=1).mid] = (
                self.next)
            self.next += 1
            time.sleep(0.001)  # pacing: a stream still running when the drain begins

    def acked(self) -> set[int]:
        return {self.sent[mid] for mid, rc in self.pub.acks_snapshot().items() if mid in self.sent and rc < 0x80}


def test_acked_publishes_survive_the_drain_and_reach_a_persistent_session(
        gateway_factory: GatewayFactory, paho_factory: PahoFactory) -> None:
    gw = gateway_factory(env={"TIDEWIRE_DRAIN_TIMEOUT": str(DRAIN_TIMEOUT)})
    sub = paho_factory(gw.port, "drain-sub", clean=False)
    sub.connect(session_expiry=EXPIRY)
    assert sub.subscribe("drain/#", 1) == [1]
    sub.disconnect()  # offline: everything below waits in its session
    pub = paho_factory(gw.port, "drain-pub")
    pub.connect()
    burst = [pub.publish(f"drain/b/{i % 4}", str(i).encode(), qos=1, wait=False) for i in range(200)]
    for mid in burst:
        assert pub.wait_ack(mid) == 0
    stream = Stream(pub, first=200)
    stream.start()  # still publishing when SIGTERM arrives
    wait_until(lambda: len(stream.acked()) > 50, what="50 streamed publishes acked")
    code, _ = sigterm(gw)
    stream.running = False
    stream.join(3)
    assert code == 0, gw.stderr[-3000:]
    acked = set(range(200)) | stream.acked()
    assert len(stream.acked()) > 50, f"only {len(stream.acked())} streamed publishes acked before the drain"
    gw.start()
    sub.connect(clean_start=False, session_expiry=EXPIRY)
    got: list[int] = []
    deadline = time.monotonic() + 10
    while not acked <= set(got) and time.monotonic() < deadline:
        try:
            got.append(int(sub.get(timeout=max(0.01, deadline - time.monotonic())).payload))
        except AssertionError:
            break
    missing = sorted(acked - set(got))
    assert not missing, f"{len(missing)} acknowledged publishes lost in the drain, first {missing[:10]}"


def _stored(data_dir: Path) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-m", "tidewire", "store", "dump", "--data-dir", str(data_dir), "--wills",
                          "--sessions", "--json"], capture_output=True, text=True, timeout=30, check=True)
    value: dict[str, Any] = json.loads(out.stdout)
    return value


@pytest.mark.slow  # waits out a protocol timer (make test-slow)
def test_due_wills_are_stored_by_the_drain_and_a_delayed_one_is_kept(gateway_factory: GatewayFactory,
                                                                       paho_factory: PahoFactory) -> None:
    gw = gateway_factory(env={"TIDEWIRE_DRAIN_TIMEOUT": str(DRAIN_TIMEOUT)})
    if gw.redis is not None:
        pytest.skip("reads the embedded data directory")
    watcher = paho_factory(gw.port, "drain-watcher", clean=False)
    watcher.connect(session_expiry=EXPIRY)
    assert watcher.subscribe("wills/#", 1) == [1]
    watcher.disconnect()
    w3 = paho_factory(gw.port, "drain-w3", version=4)  # 3.1.1: no delay, published by the drain
    w3.client.will_set("wills/w3", b"w3 gone", qos=1)
    w3.connect()
    w5 = paho_factory(gw.port, "drain-w5", clean=False)  # 5.0, delay 0: published by the drain
    w5.client.will_set("wills/w5", b"w5 gone", qos=1)
    w5.connect(session_expiry=EXPIRY)
    delayed = paho_factory(gw.port, "drain-delayed", clean=False)  # 5.0, delay 60 s: kept for its return
    delayed.client.will_set("wills/delayed", b"delayed gone", qos=1,
                            properties=v5_props(PacketTypes.WILLMESSAGE, WillDelayInterval=60))
    delayed.connect(session_expiry=EXPIRY)
    soon = paho_factory(gw.port, "drain-soon", clean=False)  # 5.0, delay 2 s: published 2 s after its disconnect
    soon.client.will_set("wills/soon", b"soon gone", qos=1,
                         properties=v5_props(PacketTypes.WILLMESSAGE, WillDelayInterval=2))
    soon.connect(session_expiry=EXPIRY)
    code, _ = sigterm(gw)
    stopped = time.monotonic()
    assert code == 0, gw.stderr[-3000:]
    stored = _stored(gw.data_dir)
    assert sorted(w["client_id"] for w in stored["wills"]) == ["drain-delayed", "drain-soon"], stored["wills"]
    assert not [s for s in stored["sessions"] if s["online"]], f"a session left online: {stored['sessions']}"
    gw.start()
    watcher.connect(clean_start=False, session_expiry=EXPIRY)
    topics: list[str] = []
    arrived: dict[str, float] = {}
    while True:  # a restart keeps what is left of a will's delay, counted from the disconnect
        try:
            message = watcher.messages.get(timeout=4.0)
        except queue.Empty:
            break
        topics.append(message.topic)
        arrived.setdefault(message.topic, time.monotonic() - stopped)
    assert topics.count("wills/w3") == 1 and topics.count("wills/w5") == 1, topics
    assert topics.count("wills/soon") == 1 and arrived["wills/soon"] >= 1.9, (topics, arrived)
    assert "wills/delayed" not in topics, topics  # 60 s: not yet (a reconnect within it cancels it, as ever)


@pytest.mark.skipif(not redis_server.available(), reason="needs redis-server")
def test_a_store_gone_down_does_not_hold_the_exit_beyond_drain_timeout(
        gateway_factory: GatewayFactory, paho_factory: PahoFactory, tmp_path: Path) -> None:
    redis = redis_server.RedisServer(tmp_path / "redis")
    redis.start()
    try:
        gw = gateway_factory(env={"TIDEWIRE_DRAIN_TIMEOUT": "2"}, extra_args=["--store", redis.url])
        subs = []
        for i in range(3):
            sub = paho_factory(gw.port, f"drain-down{i}", clean=False)  # its record and offsets are to be written
            sub.connect(session_expiry=EXPIRY)
            assert sub.subscribe("down/#", 1) == [1]
            subs.append(sub)
        redis.kill()
        code, took = sigterm(gw)
        assert code == 0, gw.stderr[-3000:]
        assert took < 2.0 + 1.5, f"exited {took:.2f}s after SIGTERM with drain_timeout 2s"  # + Python's exit
        for sub in subs:
            sub.wait_disconnect()
        assert int(log_event(gw, "drain.done")["elapsed_ms"]) <= 2100
    finally:
        redis.stop()
