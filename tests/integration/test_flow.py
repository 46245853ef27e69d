"""Flow control end to end: a slow QoS 1 consumer (withholding acks, or not reading its socket at all) does
not slow other subscribers of the same topic, and the gateway's memory stays bounded while messages pile up
for it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.integration.conftest import Gateway, PahoClient, PahoFactory
from tests.integration.rawmqtt import RawClient
from tidewire.gateway.protocols.mqtt.codec import Suback, Subscribe, SubscriptionRequest

RECEIVE_MAXIMUM = 0x21
MB = 1024 * 1024


def rss_bytes(gateway: Gateway) -> int:
    assert gateway.proc is not None
    for line in Path(f"/proc/{gateway.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc status")


def stuck_subscriber(gateway: Gateway, client_id: str, topic: str, receive_max: int | None) -> RawClient:
    """Subscribes at QoS 1, then never acks (and never reads: its TCP window fills up too)."""
    raw = RawClient(gateway.port, level=5)
    raw.connect(client_id, properties={RECEIVE_MAXIMUM: receive_max} if receive_max else {})
    raw.send(Subscribe(packet_id=1, subscriptions=[SubscriptionRequest(topic, 1)]))
    assert raw.expect(Suback).reason_codes == [1]
    return raw


def publish_and_time(pub: PahoClient, fast: PahoClient, topic: str, n: int, payload: bytes,
                     timeout: float) -> float:
    start = time.monotonic()
    mids = [pub.publish(topic, payload, qos=1, wait=False) for _ in range(n)]
    got = fast.expect(n, timeout=timeout)
    elapsed = time.monotonic() - start
    assert len(got) == n
    for mid in mids:
        pub.wait_ack(mid, timeout=timeout)
    return elapsed


def test_slow_consumer_does_not_slow_other_subscribers(gateway: Gateway, paho_factory: PahoFactory) -> None:
    n = 2000
    fast = paho_factory(gateway.port, "flow-fast", version=5)
    fast.connect()
    fast.subscribe("flow/base", 1)
    fast.subscribe("flow/slow", 1)
    pub = paho_factory(gateway.port, "flow-pub", version=5)
    pub.connect()
    baseline = publish_and_time(pub, fast, "flow/base", n, b"b" * 64, timeout=30)
    stuck = [stuck_subscriber(gateway, "flow-stuck-window", "flow/slow", 10),
             stuck_subscriber(gateway, "flow-stuck-unread", "flow/slow", None)]
    with_slow = publish_and_time(pub, fast, "flow/slow", n, b"s" * 64, timeout=30)
    assert with_slow < 3 * baseline + 1.0, (
        f"{n} messages took {with_slow:.2f}s with stuck consumers vs {baseline:.2f}s without")
    for s in stuck:
        s.close()


@pytest.mark.slow  # long: `make test-slow` (CI runs it after `make test`)
def test_memory_bounded_while_messages_pile_up(gateway: Gateway, paho_factory: PahoFactory) -> None:
    n = 20_000
    payload = b"m" * 1024
    fast = paho_factory(gateway.port, "mem-fast", version=5)
    fast.connect()
    fast.subscribe("mem/t", 1)
    pub = paho_factory(gateway.port, "mem-pub", version=5)
    pub.connect()
    publish_and_time(pub, fast, "mem/t", 500, payload, timeout=20)  # warm up caches and buffers
    time.sleep(0.3)  # no event to wait on: the process settles before its RSS is measured
    before = rss_bytes(gateway)
    stuck = [stuck_subscriber(gateway, "mem-stuck-window", "mem/t", 10),
             stuck_subscriber(gateway, "mem-stuck-unread", "mem/t", None)]
    publish_and_time(pub, fast, "mem/t", n, payload, timeout=60)
    time.sleep(0.5)  # no event to wait on: the process settles before its RSS is measured
    growth = rss_bytes(gateway) - before
    assert gateway.alive
    assert growth < 50 * MB, f"RSS grew {growth / MB:.1f} MB while {n} x 1 KB messages piled up"
    for s in stuck:
        s.close()
