"""SUBSCRIBE/UNSUBSCRIBE end to end: wildcards, `$` topics, overlapping filters, UNSUBACK, invalid filters."""

from __future__ import annotations

import pytest

from tests.integration.conftest import Gateway, PahoFactory
from tests.integration.rawmqtt import ConnectionClosed, RawClient
from tidewire.gateway.protocols.mqtt.codec import Suback, Subscribe, SubscriptionRequest

TOPICS = ["sport/tennis/player1", "sport/tennis/player1/ranking", "sport/tennis", "sport", "sport/",
          "/finance", "sport/golf/player1"]

CASES = [
    ("sport/tennis/player1/#", {"sport/tennis/player1", "sport/tennis/player1/ranking"}),
    ("sport/#", {"sport/tennis/player1", "sport/tennis/player1/ranking", "sport/tennis", "sport", "sport/",
                 "sport/golf/player1"}),
    ("sport/+", {"sport/tennis", "sport/"}),
    ("sport/+/player1", {"sport/tennis/player1", "sport/golf/player1"}),
    ("+/+", {"sport/tennis", "sport/", "/finance"}),
    ("/+", {"/finance"}),
    ("+", {"sport"}),
    ("#", set(TOPICS)),
    ("sport/tennis", {"sport/tennis"}),
]


@pytest.mark.parametrize(("flt", "expected"), CASES)
def test_wildcard_matching(gateway: Gateway, paho_factory: PahoFactory, flt: str, expected: set[str]) -> None:
    sub = paho_factory(gateway.port, "wild-sub", version=5)
    sub.connect()
    assert sub.subscribe(flt, 1) == [1]
    pub = paho_factory(gateway.port, "wild-pub", version=5)
    pub.connect()
    for t in TOPICS:
        pub.publish(t, t.encode(), qos=1)
    got = [m.topic for m in sub.expect(len(expected))]
    sub.assert_nothing(0.3)
    assert sorted(got) == sorted(expected)


# Client publishes to $SYS are refused (the broker's namespace, as in Mosquitto): check with another `$` topic.
# Mosquitto 2.0.11 takes any filter starting with "$share" for a shared subscription, so that case is ours only.
@pytest.mark.parametrize("prefix", ["$app", pytest.param("$share-not", marks=pytest.mark.tidewire_only)])
def test_dollar_topics_not_matched_by_leading_wildcards(gateway: Gateway, paho_factory: PahoFactory,
                                                        prefix: str) -> None:
    hash_sub = paho_factory(gateway.port, "sys-hash", version=4)
    plus_sub = paho_factory(gateway.port, "sys-plus", version=4)
    sys_sub = paho_factory(gateway.port, "sys-sys", version=4)
    for c, flt in ((hash_sub, "#"), (plus_sub, "+/x"), (sys_sub, f"{prefix}/#")):
        c.connect()
        c.subscribe(flt, 0)
    pub = paho_factory(gateway.port, "sys-pub", version=4)
    pub.connect()
    pub.publish(f"{prefix}/x", b"sys", qos=1)
    pub.publish("marker/x", b"marker", qos=1)
    # the broker's own $SYS messages may arrive too: look for ours only
    seen: list[str] = []
    for _ in range(100):
        m = sys_sub.get(3.0)
        seen.append(m.topic)
        if m.topic == f"{prefix}/x":
            break
    assert f"{prefix}/x" in seen
    # "marker/x" was published after the `$` message: once it arrived, the `$` one would have too
    assert [m.topic for m in hash_sub.expect(1)] == ["marker/x"]
    assert [m.topic for m in plus_sub.expect(1)] == ["marker/x"]
    hash_sub.assert_nothing(0.3)
    plus_sub.assert_nothing(0.1)


# MQTT 5 allows one copy per matching subscription (Mosquitto does that); Tidewire promises one copy.
@pytest.mark.parametrize("version", [4, pytest.param(5, marks=pytest.mark.tidewire_only)])
def test_overlapping_subscriptions_deliver_once_at_max_qos(gateway: Gateway, paho_factory: PahoFactory,
                                                          version: int) -> None:
    sub = paho_factory(gateway.port, f"overlap-{version}", version=version)
    sub.connect()
    assert sub.subscribe([("a/#", 1), ("a/b", 2)]) == [1, 2]
    pub = paho_factory(gateway.port, f"overlap-pub-{version}", version=version)
    pub.connect()
    pub.publish("a/b", b"once", qos=2)
    msg = sub.get()
    assert (msg.topic, msg.payload, msg.qos) == ("a/b", b"once", 2)
    sub.assert_nothing(0.7)


@pytest.mark.parametrize("version", [4, 5])
def test_unsubscribe_stops_delivery(gateway: Gateway, paho_factory: PahoFactory, version: int) -> None:
    sub = paho_factory(gateway.port, f"unsub-{version}", version=version)
    sub.connect()
    sub.subscribe([("u/1", 1), ("w/+", 0)])
    pub = paho_factory(gateway.port, f"unsub-pub-{version}", version=version)
    pub.connect()
    pub.publish("u/1", b"before", qos=1)
    assert sub.get().payload == b"before"
    rcs = sub.unsubscribe("u/1")
    if version == 5:
        assert rcs == [0]
    pub.publish("u/1", b"after", qos=1)
    pub.publish("w/x", b"other", qos=1)
    msg = sub.get()
    assert (msg.topic, msg.payload, msg.qos) == ("w/x", b"other", 0)  # other subscription unaffected
    sub.assert_nothing(0.3)
    sub.unsubscribe("w/+")
    pub.publish("w/x", b"after", qos=1)
    sub.assert_nothing(0.5)


@pytest.mark.tidewire_only  # Mosquitto 2.0.11 answers UNSUBACK 0x00 for a filter that was never subscribed
def test_v5_unsuback_0x11_for_unknown_filter(gateway: Gateway, paho_factory: PahoFactory) -> None:
    c = paho_factory(gateway.port, "unsub-none", version=5)
    c.connect()
    c.subscribe("known/t", 0)
    assert c.unsubscribe("never/subscribed") == [0x11]
    assert c.unsubscribe("known/t") == [0]


@pytest.mark.tidewire_only  # Mosquitto 2.0.11 answers DISCONNECT 0x81 (malformed) instead
def test_v5_invalid_filter_gets_suback_0x8f(gateway: Gateway, paho_factory: PahoFactory) -> None:
    raw = RawClient(gateway.port, level=5)
    raw.connect("badfilter5")
    raw.send(Subscribe(packet_id=3, subscriptions=[SubscriptionRequest("ok/t", 1),
                                                   SubscriptionRequest("a/#/b", 1)]))
    ack = raw.expect(Suback)
    assert (ack.packet_id, ack.reason_codes) == (3, [1, 0x8F])
    # the connection stays usable
    raw.send(Subscribe(packet_id=4, subscriptions=[SubscriptionRequest("ok/u", 0)]))
    assert raw.expect(Suback).reason_codes == [0]


def test_311_invalid_filter_closes_or_0x80(gateway: Gateway, paho_factory: PahoFactory) -> None:
    raw = RawClient(gateway.port, level=4)
    raw.connect("badfilter4")
    raw.send(Subscribe(packet_id=3, subscriptions=[SubscriptionRequest("a/#/b", 1)]))
    try:
        packet = raw.recv(2.0)
    except ConnectionClosed:
        return
    assert isinstance(packet, Suback) and packet.reason_codes == [0x80], packet
