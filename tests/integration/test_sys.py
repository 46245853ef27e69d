"""$SYS topics end to end: client lifecycle events with JSON payloads and periodic broker statistics under
`$SYS/brokers/<node>/`; `#` never matches them, `$SYS/#` does."""

from __future__ import annotations

import json
import queue
import time
from typing import Any

import pytest

from tests.integration.conftest import Gateway, GatewayFactory, PahoClient, PahoFactory, Received
from tests.waiting import wait_until

pytestmark = pytest.mark.tidewire_only  # Mosquitto's $SYS layout differs ($SYS/broker/..., no events)

PREFIX = "$SYS/brokers/node1"


@pytest.fixture
def sys_gateway(gateway_factory: GatewayFactory) -> Gateway:
    return gateway_factory(env={"TIDEWIRE_SYS_INTERVAL": "1"})


def watcher(gw: Gateway, paho_factory: PahoFactory, name: str, flt: str) -> PahoClient:
    w = paho_factory(gw.port, name, version=5)
    w.connect()
    w.subscribe(flt, 0)
    return w


def collect(w: PahoClient, seconds: float) -> list[Received]:
    out: list[Received] = []
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        try:
            out.append(w.messages.get(timeout=left))
        except queue.Empty:
            break
    return out


def event(w: PahoClient, client_id: str, kind: str, timeout: float = 3.0) -> dict[str, Any]:
    topic = f"{PREFIX}/clients/{client_id}/{kind}"
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        try:
            m = w.get(max(0.01, deadline - time.monotonic()))
        except AssertionError:
            break
        seen.append(m.topic)
        if m.topic == topic:
            body = json.loads(m.payload)
            assert isinstance(body, dict), body
            return body
    raise AssertionError(f"no {topic} within {timeout}s; seen {seen}")


def check_common(body: dict[str, Any], client_id: str) -> None:
    assert body.get("clientid") == client_id, body
    ts = body.get("ts")
    assert isinstance(ts, int | float), body
    now_ms = time.time() * 1000
    assert now_ms - 10_000 < ts <= now_ms + 1000, f"ts {ts} is not epoch milliseconds of about now"


def test_client_lifecycle_events(sys_gateway: Gateway, paho_factory: PahoFactory) -> None:
    w = watcher(sys_gateway, paho_factory, "sys-watch", f"{PREFIX}/clients/#")
    c = paho_factory(sys_gateway.port, "sys-c1", version=5, keepalive=33)
    c.connect()
    body = event(w, "sys-c1", "connected")
    check_common(body, "sys-c1")
    assert "127.0.0.1" in str(body.get("address")), body
    assert body.get("proto_ver", body.get("proto_level")) == 5, body
    assert body.get("keepalive") == 33, body

    c.subscribe("sys/some/+", 1)
    check_common(event(w, "sys-c1", "subscribed"), "sys-c1")
    c.unsubscribe("sys/some/+")
    check_common(event(w, "sys-c1", "unsubscribed"), "sys-c1")

    c.disconnect()
    body = event(w, "sys-c1", "disconnected")
    check_common(body, "sys-c1")
    assert body.get("reason"), f"disconnected event without a reason: {body}"


def test_abnormal_disconnect_and_takeover_events(sys_gateway: Gateway, paho_factory: PahoFactory) -> None:
    w = watcher(sys_gateway, paho_factory, "sys-watch2", f"{PREFIX}/clients/#")
    old = paho_factory(sys_gateway.port, "sys-c2", version=4)
    old.connect()
    body = event(w, "sys-c2", "connected")
    assert body.get("proto_ver", body.get("proto_level")) == 4, body
    paho_factory(sys_gateway.port, "sys-c2", version=5).connect()
    check_common(event(w, "sys-c2", "takeover"), "sys-c2")
    dropper = paho_factory(sys_gateway.port, "sys-c3", version=5)
    dropper.connect()
    event(w, "sys-c3", "connected")
    dropper.drop()
    body = event(w, "sys-c3", "disconnected")
    check_common(body, "sys-c3")
    assert body.get("reason") and body.get("reason") != "normal", f"abnormal close reason: {body}"


@pytest.mark.slow  # seconds long: `make test-slow` keeps `make test` under its 10 minutes
def test_stats_published_periodically(sys_gateway: Gateway, paho_factory: PahoFactory) -> None:
    w = watcher(sys_gateway, paho_factory, "sys-stats", f"{PREFIX}/stats/#")
    pub = paho_factory(sys_gateway.port, "sys-pub", version=5)
    pub.connect()
    pub.subscribe("sys/load", 1)
    for _ in range(5):
        pub.publish("sys/load", b"x" * 100, qos=1)
    got = collect(w, 2.6)
    values: dict[str, list[float]] = {}
    for m in got:
        values.setdefault(m.topic[len(PREFIX) + len("/stats/"):], []).append(float(m.payload))
    for name in ("clients/connected", "messages/in", "messages/out", "bytes/in", "bytes/out",
                 "subscriptions/count", "messages/dropped", "uptime"):
        assert name in values, f"no {PREFIX}/stats/{name}; got {sorted(values)}"
    assert len(values["uptime"]) >= 2, f"stats not periodic with interval 1s: uptime {values['uptime']}"
    assert max(values["clients/connected"]) >= 2
    assert max(values["messages/in"]) >= 5
    assert max(values["messages/out"]) >= 5
    assert max(values["bytes/in"]) >= 500
    assert max(values["subscriptions/count"]) >= 2
    assert values["uptime"] == sorted(values["uptime"])


def test_hash_does_not_match_sys_but_sys_hash_does(sys_gateway: Gateway, paho_factory: PahoFactory) -> None:
    everything = watcher(sys_gateway, paho_factory, "sys-hash", "#")
    plus = watcher(sys_gateway, paho_factory, "sys-plus", "+/brokers/#")
    sys_all = watcher(sys_gateway, paho_factory, "sys-all", "$SYS/#")
    c = paho_factory(sys_gateway.port, "sys-churn", version=5)
    c.connect()
    c.publish("plain/topic", b"p", qos=1)
    c.disconnect()
    seen_all: list[str] = []

    def both_seen() -> bool:  # the client's events and the next statistics (every 1 s)
        seen_all.extend(m.topic for m in collect(sys_all, 0.05))
        return (any(t.startswith(f"{PREFIX}/clients/sys-churn/") for t in seen_all)
                and any(t.startswith(f"{PREFIX}/stats/") for t in seen_all))

    wait_until(both_seen, timeout=3, what=lambda: f"sys-churn's events and statistics on $SYS/#: {seen_all[:20]}",
               interval=0)
    seen_hash = [m.topic for m in collect(everything, 0.3)]
    assert seen_hash == ["plain/topic"], f"'#' must not match $SYS topics: {seen_hash[:10]}"
    plus.assert_nothing(0.2)
