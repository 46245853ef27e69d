"""Retained messages under caps and at scale: a retained flood is refused (0x97) past `max_retained_*`, counted
by the `tidewire_dropped{reason="retained_quota"}` metric, and what is stored stays within the caps across a
restart; a wildcard subscribe over many retained messages is answered at once and streamed page by page to a
slow consumer, every one of them once, while the node holds a page, not the match."""

from __future__ import annotations

import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from loadtest.servers import rss_kb
from tests.integration.conftest import Gateway, GatewayFactory, PahoFactory
from tests.integration.rawmqtt import RawClient
from tests.waiting import wait_until
from tidewire.gateway.protocols.mqtt.codec import (
    PropertyId,
    Puback,
    Publish,
    Suback,
    Subscribe,
    SubscriptionRequest,
    encode,
)

pytestmark = pytest.mark.tidewire_only

QUOTA_EXCEEDED = 0x97
# The overload guard off: these tests count refusals by the caps, not the 0x89s of a machine busy elsewhere.
STEADY = {"TIDEWIRE_OVERLOAD_LOOP_LAG_MS": "0"}


def dropped(gateway: Gateway, reason: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{gateway.admin_port}/metrics", timeout=5.0).text
    return sum(s.value for family in text_string_to_metric_families(text) for s in family.samples
               if s.name == "tidewire_dropped_total" and s.labels.get("reason") == reason)


def retained_topics(paho_factory: PahoFactory, gateway: Gateway, n: int, name: str,
                    topic_filter: str = "rq/#") -> list[str]:
    sub = paho_factory(gateway.port, name)
    sub.connect()
    sub.subscribe(topic_filter, 1)
    got = sorted(m.topic for m in sub.expect(n, timeout=10))
    sub.assert_nothing(0.5)
    sub.disconnect()
    return got


def test_retained_caps_refuse_the_newest_with_quota_exceeded(gateway_factory: GatewayFactory,
                                                             paho_factory: PahoFactory) -> None:
    """15 retained topics against a cap of 10 messages: the first 10 are stored, the last 5 get PUBACK 0x97
    and are counted; a payload over the per-message cap is refused too; a delete frees a place; a restart keeps
    the stored ones. Before the caps every retained publish was taken (15 stored, none refused)."""
    gw = gateway_factory(env={**STEADY, "TIDEWIRE_MAX_RETAINED_MESSAGES": "10", "TIDEWIRE_MAX_RETAINED_PAYLOAD": "100",
                              "TIDEWIRE_SYS_INTERVAL": "3600"},  # no $SYS statistics (retained) meanwhile
                         admin=True)
    pub = paho_factory(gw.port, "rq-pub")
    pub.connect()
    codes = [pub.publish(f"rq/{i:02d}", b"x" * 10, qos=1, retain=True) for i in range(15)]
    assert codes == [0] * 10 + [QUOTA_EXCEEDED] * 5
    assert pub.publish("rq/big", b"x" * 101, qos=1, retain=True) == QUOTA_EXCEEDED
    assert pub.publish("rq/live", b"x" * 101, qos=1) == 0  # not retained: no retained cap applies
    assert dropped(gw, "retained_quota") == 6
    assert retained_topics(paho_factory, gw, 10, "rq-sub1") == [f"rq/{i:02d}" for i in range(10)]

    assert pub.publish("rq/00", b"", qos=1, retain=True) == 0  # a delete always passes
    assert pub.publish("rq/10", b"y", qos=1, retain=True) == 0  # and frees a place
    assert pub.publish("rq/11", b"y", qos=1, retain=True) == QUOTA_EXCEEDED
    pub.disconnect()
    gw.restart()
    want = [f"rq/{i:02d}" for i in range(1, 11)]
    assert retained_topics(paho_factory, gw, 10, "rq-sub2") == want
    pub = paho_factory(gw.port, "rq-pub2")
    pub.connect()
    assert pub.publish("rq/12", b"y", qos=1, retain=True) == QUOTA_EXCEEDED  # the count outlived the restart
    pub.disconnect()


def test_retained_bytes_cap_counts_qos0_and_311_refusals(gateway_factory: GatewayFactory,
                                                         paho_factory: PahoFactory) -> None:
    """A byte cap of 4000 (the node's own `$SYS` retained messages count too): 500-byte payloads (~560 bytes
    stored) are taken until the next would not fit, then refused; from a 3.1.1 publisher QoS 1 past the cap gets
    a plain PUBACK and QoS 0 nothing, the message dropped either way (3.1.1 has no reason codes); every refusal
    is counted."""
    gw = gateway_factory(env={**STEADY, "TIDEWIRE_MAX_RETAINED_BYTES": "4000"}, admin=True)
    pub = paho_factory(gw.port, "rb-pub")
    pub.connect()
    codes = [pub.publish(f"rb/{i}", b"z" * 500, qos=1, retain=True) for i in range(10)]
    k = codes.count(0)
    assert 5 <= k <= 7 and codes == [0] * k + [QUOTA_EXCEEDED] * (10 - k), codes
    old = paho_factory(gw.port, "rb-old", version=4)
    old.connect()
    assert old.publish("rb/x", b"z" * 500, qos=1, retain=True) == 0  # refused: a plain PUBACK
    old.publish("rb/y", b"z" * 500, qos=0, retain=True)
    wait_until(lambda: dropped(gw, "retained_quota") == 10 - k + 2, 5.0, what="every refusal counted")
    assert retained_topics(paho_factory, gw, k, "rb-sub", "rb/#") == [f"rb/{i}" for i in range(k)]


def _flood(port: int, topics: list[str], payload: bytes) -> None:
    """Retained QoS 0 publishes pipelined, then one QoS 1: its PUBACK comes after every one before it is stored."""
    pub = RawClient(port, level=5, timeout=60.0)
    pub.connect("flood")
    chunk: list[bytes] = []
    for topic in topics:
        chunk.append(encode(Publish(topic=topic, payload=payload, retain=True), 5))
        if len(chunk) == 500:
            pub.send_raw(b"".join(chunk))
            chunk = []
    pub.send_raw(b"".join(chunk))
    pub.publish("flood/done", b"", qos=1, packet_id=1)
    assert pub.expect(Puback).packet_id == 1
    pub.disconnect()


def _drain(sub: RawClient, n: int) -> list[str]:
    """Read and acknowledge PUBLISHes until `n` arrived; their topics in arrival order."""
    topics: list[str] = []
    while len(topics) < n:
        packet = sub.recv()
        assert isinstance(packet, Publish), packet
        assert packet.retain
        topics.append(packet.topic)
        if packet.qos:
            sub.send(Puback(packet.packet_id))
    return topics


def _slow_subscriber(port: int, receive_maximum: int) -> RawClient:
    sub = RawClient(port, level=5, timeout=60.0)
    sub.connect("slow", properties={PropertyId.RECEIVE_MAXIMUM: receive_maximum})
    started = time.monotonic()
    sub.send(Subscribe(1, [SubscriptionRequest("big/#", qos=1)]))
    assert sub.expect(Suback).reason_codes == [1]
    assert time.monotonic() - started < 2.0  # answered without waiting for the retained messages
    return sub


@pytest.mark.slow
def test_wildcard_over_20000_retained_reaches_a_window_of_10_all_once(gateway_factory: GatewayFactory) -> None:
    """20,000 retained messages to a subscriber with Receive Maximum 10 that acks one by one: every one
    arrives, once, in topic order (the pages follow each other), never more than 10 unacked."""
    gateway = gateway_factory(env=STEADY)
    n = 20_000
    topics = [f"big/{i // 100:03d}/{i % 100:02d}" for i in range(n)]
    _flood(gateway.port, topics, b"p")
    sub = _slow_subscriber(gateway.port, 10)
    got = _drain(sub, n)
    assert got == sorted(topics)  # none lost, none twice
    sub.nothing(0.5)
    sub.disconnect()


@pytest.mark.slow
def test_a_slow_consumer_of_64mb_retained_holds_a_page_not_the_match(gateway_factory: GatewayFactory) -> None:
    """640 retained messages of 100 KB (64 MB) to a subscriber that does not read for a while: the node's RSS
    grows by a page and its socket buffers, not by the match (before the streaming it read all 64 MB from the
    store at once: +70 MB and more); then every message arrives once."""
    gateway = gateway_factory(env=STEADY)
    n = 640
    topics = [f"big/{i:04d}" for i in range(n)]
    _flood(gateway.port, topics, b"m" * 100_000)
    assert gateway.proc is not None
    pid = gateway.proc.pid
    before = rss_kb(pid)
    sub = _slow_subscriber(gateway.port, 10)
    peak = before
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:  # the subscriber reads nothing: the node fills its window and stops
        peak = max(peak, rss_kb(pid))
        time.sleep(0.05)
    assert (peak - before) < 24 * 1024, f"RSS grew {(peak - before) // 1024} MB for a consumer that reads nothing"
    assert _drain(sub, n) == topics
    sub.disconnect()
