"""MQTT 5 features end to end: subscription options and identifiers, topic aliases, message expiry, forwarded
properties, packet size and receive maximum both ways, server DISCONNECT reasons, session expiry, will delay,
and the enhanced-authentication flow (SCRAM-SHA-256 over AUTH packets).
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.subscribeoptions import SubscribeOptions

from tests.integration.conftest import Gateway, PahoClient, PahoFactory, v5_props
from tests.integration.rawmqtt import ConnectionClosed, RawClient
from tidewire.gateway.protocols.mqtt.codec import (
    Connack,
    Disconnect,
    Puback,
    Publish,
    Suback,
    Subscribe,
    SubscriptionRequest,
    encode,
)

RECEIVE_MAXIMUM = 0x21
TOPIC_ALIAS_MAXIMUM = 0x22
TOPIC_ALIAS = 0x23
MAXIMUM_PACKET_SIZE = 0x27
SESSION_EXPIRY = 0x11
REASON_STRING = 0x1F
AUTH_METHOD = 0x15
AUTH_DATA = 0x16


def client(gateway: Gateway, paho_factory: PahoFactory, client_id: str, **connect: Any) -> PahoClient:
    c = paho_factory(gateway.port, client_id, version=5)
    c.connect(**connect)
    return c


def sub_opts(c: PahoClient, topic: str, sub_id: int | None = None, **options: Any) -> list[int]:
    """Subscribe with v5 options (SubscribeOptions keywords) and an optional subscription identifier."""
    props = v5_props(PacketTypes.SUBSCRIBE, SubscriptionIdentifier=sub_id) if sub_id is not None else None
    _, mid = c.client.subscribe(topic, options=SubscribeOptions(**options), properties=props)
    assert mid is not None
    return list(c.wait_ack(mid))


def raw_subscriber(gateway: Gateway, client_id: str, topic: str, qos: int = 1,
                   properties: dict[int, Any] | None = None) -> tuple[RawClient, Connack]:
    raw = RawClient(gateway.port, level=5)
    ack = raw.connect(client_id, properties=properties)
    raw.send(Subscribe(packet_id=1, subscriptions=[SubscriptionRequest(topic, qos)]))
    assert raw.expect(Suback).reason_codes == [qos]
    return raw, ack


# -- subscription options --------------------------------------------------------------------------

def test_no_local_suppresses_own_messages_only(gateway: Gateway, paho_factory: PahoFactory) -> None:
    me = client(gateway, paho_factory, "nl-me")
    other = client(gateway, paho_factory, "nl-other")
    assert sub_opts(me, "nl/t", qos=1, noLocal=True) == [1]
    assert sub_opts(other, "nl/t", qos=1) == [1]
    me.publish("nl/t", b"mine", qos=1)
    assert other.get().payload == b"mine"
    me.assert_nothing(0.5)
    other.publish("nl/t", b"theirs", qos=1)  # no local is about the publisher, not the topic
    assert me.get().payload == b"theirs"


def test_retain_as_published(gateway: Gateway, paho_factory: PahoFactory) -> None:
    rap = client(gateway, paho_factory, "rap-yes")
    plain = client(gateway, paho_factory, "rap-no")
    sub_opts(rap, "rap/t", qos=1, retainAsPublished=True)
    sub_opts(plain, "rap/t", qos=1)
    pub = client(gateway, paho_factory, "rap-pub")
    pub.publish("rap/t", b"r", qos=1, retain=True)
    pub.publish("rap/t", b"n", qos=1)
    assert [(m.payload, m.retain) for m in rap.expect(2)] == [(b"r", True), (b"n", False)]
    assert [(m.payload, m.retain) for m in plain.expect(2)] == [(b"r", False), (b"n", False)]
    pub.publish("rap/t", b"", qos=1, retain=True)  # clean up the retained message


@pytest.mark.parametrize(("handling", "first", "again"), [(0, True, True), (1, True, False), (2, False, False)])
def test_retain_handling(gateway: Gateway, paho_factory: PahoFactory, handling: int, first: bool,
                         again: bool) -> None:
    pub = client(gateway, paho_factory, f"rh-pub{handling}")
    pub.publish(f"rh{handling}/t", b"kept", qos=1, retain=True)
    sub = client(gateway, paho_factory, f"rh-sub{handling}")
    for expected in (first, again):  # the second SUBSCRIBE replaces an existing subscription
        sub_opts(sub, f"rh{handling}/t", qos=1, retainHandling=handling)
        if expected:
            msg = sub.get()
            assert (msg.payload, msg.retain) == (b"kept", True)
        sub.assert_nothing(0.4)
    pub.publish(f"rh{handling}/t", b"live", qos=1)  # the subscription itself works in every mode
    assert sub.get().payload == b"live"


# -- subscription identifiers ----------------------------------------------------------------------

def test_subscription_identifier_forwarded(gateway: Gateway, paho_factory: PahoFactory) -> None:
    with_id = client(gateway, paho_factory, "sid-with")
    without = client(gateway, paho_factory, "sid-without")
    sub_opts(with_id, "sid/+/x", sub_id=77, qos=1)
    sub_opts(without, "sid/+/x", qos=1)
    pub = client(gateway, paho_factory, "sid-pub")
    pub.publish("sid/a/x", b"m", qos=1)
    assert with_id.get().properties.get("SubscriptionIdentifier") == [77]
    assert "SubscriptionIdentifier" not in without.get().properties
    sub_opts(with_id, "sid/+/x", sub_id=78, qos=1)  # re-subscribing replaces the identifier
    pub.publish("sid/b/x", b"m2", qos=1)
    assert with_id.get().properties.get("SubscriptionIdentifier") == [78]


@pytest.mark.tidewire_only  # Mosquitto sends one copy per matching subscription
def test_overlapping_subscriptions_one_copy_with_every_identifier(gateway: Gateway,
                                                                  paho_factory: PahoFactory) -> None:
    sub = client(gateway, paho_factory, "sid-overlap")
    sub_opts(sub, "ov/#", sub_id=1, qos=1)
    sub_opts(sub, "ov/+", sub_id=2, qos=1)
    pub = client(gateway, paho_factory, "sid-ov-pub")
    pub.publish("ov/x", b"both", qos=1)
    msg = sub.get()
    assert sorted(msg.properties.get("SubscriptionIdentifier", [])) == [1, 2], msg
    sub.assert_nothing(0.5)
    pub.publish("ov/x/y", b"one", qos=1)  # only ov/# matches
    assert sub.get().properties.get("SubscriptionIdentifier") == [1]


# -- topic aliases ---------------------------------------------------------------------------------

def test_topic_alias_client_to_server(gateway: Gateway, paho_factory: PahoFactory) -> None:
    sub = client(gateway, paho_factory, "ta-in-sub")
    sub.subscribe("ta/in/#", 1)
    pub = paho_factory(gateway.port, "ta-in-pub", version=5)
    ack = pub.connect()
    assert ack.properties.get("TopicAliasMaximum", 0) > 0, ack
    alias = v5_props(PacketTypes.PUBLISH, TopicAlias=1)
    assert pub.publish("ta/in/long/topic", b"first", qos=1, properties=alias) == 0
    assert pub.publish("", b"second", qos=1, properties=v5_props(PacketTypes.PUBLISH, TopicAlias=1)) == 0
    # re-mapping the same alias to another topic
    pub.publish("ta/in/other", b"third", qos=1, properties=v5_props(PacketTypes.PUBLISH, TopicAlias=1))
    pub.publish("", b"fourth", qos=1, properties=v5_props(PacketTypes.PUBLISH, TopicAlias=1))
    got = [(m.topic, m.payload) for m in sub.expect(4)]
    assert got == [("ta/in/long/topic", b"first"), ("ta/in/long/topic", b"second"),
                   ("ta/in/other", b"third"), ("ta/in/other", b"fourth")]


def test_topic_alias_never_sent_to_client_without_maximum(gateway: Gateway, paho_factory: PahoFactory) -> None:
    raw, _ = raw_subscriber(gateway, "ta-none", "ta/none")
    pub = client(gateway, paho_factory, "ta-none-pub")
    for i in range(4):
        pub.publish("ta/none", str(i).encode(), qos=1)
    for i in range(4):
        p = raw.expect(Publish)
        assert (p.topic, p.payload, TOPIC_ALIAS in p.properties) == ("ta/none", str(i).encode(), False), p
        raw.send(Puback(packet_id=p.packet_id))


def test_topic_alias_server_to_client_paho(gateway: Gateway, paho_factory: PahoFactory) -> None:
    # paho 2.2 hands inbound aliased messages to the application unresolved (empty topic + TopicAlias
    # property), so the resolution the gateway's alias use requires is done here, as a receiver must.
    sub = client(gateway, paho_factory, "ta-out-paho",
                 properties=v5_props(PacketTypes.CONNECT, TopicAliasMaximum=2))
    sub.subscribe("ta/out/#", 1)
    pub = client(gateway, paho_factory, "ta-out-paho-pub")
    topics = [f"ta/out/{t}" for t in "aabcabca"]
    for i, t in enumerate(topics):
        pub.publish(t, str(i).encode(), qos=1)
    aliases: dict[int, str] = {}
    resolved = []
    for m in sub.expect(len(topics)):
        alias = m.properties.get("TopicAlias")
        if alias is not None:
            assert 1 <= alias <= 2, f"alias {alias} above the client's maximum 2"
            if m.topic:
                aliases[alias] = m.topic
        resolved.append((m.topic or aliases.get(alias or 0, "<unknown alias>"), m.payload))
    assert resolved == [(t, str(i).encode()) for i, t in enumerate(topics)]


@pytest.mark.tidewire_only  # Mosquitto 2.0 never assigns topic aliases towards clients
def test_topic_alias_server_to_client_on_the_wire(gateway: Gateway, paho_factory: PahoFactory) -> None:
    raw, _ = raw_subscriber(gateway, "ta-out-raw", "ta/wire/#", properties={TOPIC_ALIAS_MAXIMUM: 2})
    pub = client(gateway, paho_factory, "ta-wire-pub")
    topics = [f"ta/wire/{t}" for t in "aabbccab"]
    for i, t in enumerate(topics):
        pub.publish(t, str(i).encode(), qos=1)
    aliases: dict[int, str] = {}
    wire: list[tuple[str, int | None]] = []
    for i, t in enumerate(topics):
        p = raw.expect(Publish)
        raw.send(Puback(packet_id=p.packet_id))
        alias = p.properties.get(TOPIC_ALIAS)
        wire.append((p.topic, alias))
        assert p.payload == str(i).encode()
        if alias is not None:
            assert 1 <= alias <= 2, f"alias {alias} above the client's maximum 2"
            if p.topic:
                aliases[alias] = p.topic
            assert aliases.get(alias) == t, f"alias {alias} resolves to {aliases.get(alias)}, sent for {t}"
        else:
            assert p.topic == t
    # the 2nd message on ta/wire/a goes as alias only
    assert wire[1][0] == "" and wire[1][1] is not None, wire


# -- message expiry --------------------------------------------------------------------------------

@pytest.mark.slow  # waits out a protocol timer (make test-slow)
def test_expired_queued_message_not_delivered_remaining_interval_forwarded(gateway: Gateway,
                                                                           paho_factory: PahoFactory) -> None:
    sub = paho_factory(gateway.port, "exp-sub", version=5, clean=False)
    sub.connect(clean_start=True, session_expiry=60)
    sub.subscribe("exp/t", 1)
    sub.disconnect()
    pub = client(gateway, paho_factory, "exp-pub")
    pub.publish("exp/t", b"short", qos=1, properties=v5_props(PacketTypes.PUBLISH, MessageExpiryInterval=1))
    pub.publish("exp/t", b"long", qos=1, properties=v5_props(PacketTypes.PUBLISH, MessageExpiryInterval=60))
    time.sleep(2.2)  # the behaviour under test: "short" expires (1 s) while queued
    again = paho_factory(gateway.port, "exp-sub", version=5, clean=False)
    assert again.connect(clean_start=False, session_expiry=60).session_present
    msg = again.get()
    assert msg.payload == b"long"
    remaining = msg.properties.get("MessageExpiryInterval")
    assert remaining is not None and 50 <= remaining <= 58, f"remaining expiry {remaining}, sent 60 ~2s ago"
    again.assert_nothing(0.5)


@pytest.mark.slow  # waits out a protocol timer (make test-slow)
def test_retained_message_expiry(gateway: Gateway, paho_factory: PahoFactory) -> None:
    pub = client(gateway, paho_factory, "rexp-pub")
    pub.publish("rexp/keep", b"k", qos=1, retain=True,
                properties=v5_props(PacketTypes.PUBLISH, MessageExpiryInterval=30))
    pub.publish("rexp/gone", b"g", qos=1, retain=True,
                properties=v5_props(PacketTypes.PUBLISH, MessageExpiryInterval=1))
    time.sleep(2.2)  # the behaviour under test: the retained "rexp/gone" expires (1 s)
    sub = client(gateway, paho_factory, "rexp-sub")
    sub.subscribe("rexp/+", 1)
    msg = sub.get()
    assert (msg.topic, msg.retain) == ("rexp/keep", True)
    remaining = msg.properties.get("MessageExpiryInterval")
    assert remaining is not None and 20 <= remaining <= 28, f"remaining expiry {remaining}, sent 30 ~2s ago"
    sub.assert_nothing(0.5)


# -- forwarded properties --------------------------------------------------------------------------

def test_publish_properties_forwarded_unchanged(gateway: Gateway, paho_factory: PahoFactory) -> None:
    sub = client(gateway, paho_factory, "props-sub")
    sub.subscribe("props/t", 1)
    pub = client(gateway, paho_factory, "props-pub")
    users = [("k", "1"), ("a", "x"), ("k", "1"), ("k", "2"), ("ü", "€")]
    props = v5_props(PacketTypes.PUBLISH, PayloadFormatIndicator=1, ContentType="application/json",
                     ResponseTopic="props/reply", CorrelationData=b"\x00\x01corr\xff", UserProperty=users)
    pub.publish("props/t", b'{"a": 1}', qos=1, properties=props)
    got = sub.get().properties
    assert got.get("PayloadFormatIndicator") == 1
    assert got.get("ContentType") == "application/json"
    assert got.get("ResponseTopic") == "props/reply"
    assert got.get("CorrelationData") == b"\x00\x01corr\xff".hex()
    assert got.get("UserProperty") == users, "user properties: order and duplicates must be kept"


@pytest.mark.tidewire_only  # Mosquitto never sends Response Information
def test_request_response_information(gateway: Gateway, paho_factory: PahoFactory) -> None:
    asked = paho_factory(gateway.port, "rri-yes", version=5)
    ack = asked.connect(properties=v5_props(PacketTypes.CONNECT, RequestResponseInformation=1))
    info = ack.properties.get("ResponseInformation")
    assert isinstance(info, str) and info, ack
    plain = paho_factory(gateway.port, "rri-no", version=5)
    assert "ResponseInformation" not in plain.connect().properties


# -- maximum packet size and receive maximum -------------------------------------------------------

def test_client_maximum_packet_size_skips_only_that_client(gateway: Gateway, paho_factory: PahoFactory) -> None:
    small = client(gateway, paho_factory, "mps-small",
                   properties=v5_props(PacketTypes.CONNECT, MaximumPacketSize=100))
    big = client(gateway, paho_factory, "mps-big")
    small.subscribe("mps/t", 1)
    big.subscribe("mps/t", 1)
    pub = client(gateway, paho_factory, "mps-pub")
    pub.publish("mps/t", b"x" * 500, qos=1)
    pub.publish("mps/t", b"tiny", qos=1)
    assert [m.payload for m in big.expect(2)] == [b"x" * 500, b"tiny"]
    assert small.get().payload == b"tiny"
    small.assert_nothing(0.3)
    assert small.disconnects.empty(), "the small client must not be disconnected"


def _blast(raw: RawClient, n: int, qos: int) -> None:
    raw.send_raw(b"".join(encode(Publish(topic="rm/in", payload=b"p", qos=qos, packet_id=i + 1), 5)
                          for i in range(n)))


def _expect_disconnect(raw: RawClient, reason: int) -> Disconnect:
    try:
        got = raw.until_closed(3.0)
    except ConnectionClosed:
        got = []
    disc = [p for p in got if isinstance(p, Disconnect)]
    assert disc and disc[-1].reason_code == reason, f"expected DISCONNECT 0x{reason:02X}, got {got[-5:]}"
    return disc[-1]


@pytest.mark.tidewire_only  # Mosquitto 2.0.11 answers PUBREC 0x97 instead of DISCONNECT 0x93 (MQTT-3.3.4-9)
def test_server_receive_maximum_exceeded_qos2(gateway: Gateway) -> None:
    raw = RawClient(gateway.port, level=5)
    n = raw.connect("rm-q2").properties.get(RECEIVE_MAXIMUM, 65535)
    assert n < 65535, "the server should advertise a Receive Maximum"
    _blast(raw, n + 1, qos=2)  # no PUBREL: all n+1 stay in flight
    _expect_disconnect(raw, 0x93)


@pytest.mark.tidewire_only  # Mosquitto acks QoS 1 at once and never counts them against its quota
def test_server_receive_maximum_exceeded_qos1(gateway: Gateway) -> None:
    raw = RawClient(gateway.port, level=5)
    n = raw.connect("rm-q1").properties.get(RECEIVE_MAXIMUM, 65535)
    _blast(raw, n + 1, qos=1)  # one write, before any PUBACK could have arrived
    _expect_disconnect(raw, 0x93)


def _window_subscriber(gateway: Gateway, paho_factory: PahoFactory, name: str, n: int) -> RawClient:
    raw, _ = raw_subscriber(gateway, name, f"{name}/t", properties={RECEIVE_MAXIMUM: 5})
    pub = client(gateway, paho_factory, f"{name}-pub")
    for i in range(n):
        pub.publish(f"{name}/t", str(i).encode(), qos=1, wait=False)
    return raw


def test_client_receive_maximum_initial_window(gateway: Gateway, paho_factory: PahoFactory) -> None:
    raw = _window_subscriber(gateway, paho_factory, "rmwin", 20)
    first = [raw.expect(Publish) for _ in range(5)]
    assert [int(p.payload) for p in first] == list(range(5))
    raw.nothing(1.0)  # 5 unacked: the client's window is full


@pytest.mark.tidewire_only  # Mosquitto 2.0.11 sends 5 more after a single PUBACK (9 unacked, maximum 5)
def test_client_receive_maximum_kept_as_acks_arrive(gateway: Gateway, paho_factory: PahoFactory) -> None:
    raw = _window_subscriber(gateway, paho_factory, "rmacks", 20)
    got = [raw.expect(Publish) for _ in range(5)]
    raw.nothing(0.5)
    for i in range(15):  # each PUBACK opens exactly one slot
        raw.send(Puback(packet_id=got[i].packet_id))
        got.append(raw.expect(Publish))
        raw.nothing(0.15)
    assert [int(p.payload) for p in got] == list(range(20))


# -- server DISCONNECT, session expiry at DISCONNECT, will delay -----------------------------------

@pytest.mark.tidewire_only  # Mosquitto 2.0.11 closes the old connection without a DISCONNECT
def test_takeover_disconnect_reason_0x8e(gateway: Gateway, paho_factory: PahoFactory) -> None:
    old = RawClient(gateway.port, level=5)
    old.connect("takeover-5")
    client(gateway, paho_factory, "takeover-5")
    _expect_disconnect(old, 0x8E)


@pytest.mark.tidewire_only  # Mosquitto sends no reason strings
def test_server_disconnect_has_reason_string(gateway: Gateway, paho_factory: PahoFactory) -> None:
    old = RawClient(gateway.port, level=5)
    old.connect("takeover-rs")
    client(gateway, paho_factory, "takeover-rs")
    disc = _expect_disconnect(old, 0x8E)
    assert isinstance(disc.properties.get(REASON_STRING), str) and disc.properties[REASON_STRING]


def test_session_expiry_zero_to_nonzero_at_disconnect_is_protocol_error(gateway: Gateway) -> None:
    raw = RawClient(gateway.port, level=5)
    raw.connect("sx-zero", clean_start=True)
    raw.send(Disconnect(reason_code=0, properties={SESSION_EXPIRY: 60}))
    _expect_disconnect(raw, 0x82)
    again = RawClient(gateway.port, level=5)
    assert again.connect("sx-zero", clean_start=False, properties={SESSION_EXPIRY: 60}).session_present is False


def test_session_expiry_set_to_zero_at_disconnect_ends_session(gateway: Gateway) -> None:
    raw, _ = raw_subscriber(gateway, "sx-sixty", "sx/t", properties={SESSION_EXPIRY: 60})
    raw.send(Disconnect(reason_code=0, properties={SESSION_EXPIRY: 0}))
    raw.until_closed()  # the server has handled the DISCONNECT
    raw.close()
    again = RawClient(gateway.port, level=5)
    assert again.connect("sx-sixty", clean_start=False, properties={SESSION_EXPIRY: 60}).session_present is False
    # control: without the change the session survives
    keep, _ = raw_subscriber(gateway, "sx-keep", "sx/t", properties={SESSION_EXPIRY: 60})
    keep.send(Disconnect(reason_code=0))
    keep.until_closed()  # the server has handled the DISCONNECT
    keep.close()
    back = RawClient(gateway.port, level=5)
    assert back.connect("sx-keep", clean_start=False, properties={SESSION_EXPIRY: 60}).session_present is True


def test_will_sent_at_session_expiry_when_shorter_than_will_delay(gateway: Gateway,
                                                                  paho_factory: PahoFactory) -> None:
    w = client(gateway, paho_factory, "wd-watch")
    w.subscribe("wd/t", 1)
    c = paho_factory(gateway.port, "wd-client", version=5, clean=False)
    c.client.will_set("wd/t", b"gone", qos=1, properties=v5_props(PacketTypes.WILLMESSAGE, WillDelayInterval=30))
    c.connect(session_expiry=1)
    c.drop()
    start = time.monotonic()
    assert w.get(5.0).payload == b"gone"
    elapsed = time.monotonic() - start
    assert 0.5 <= elapsed <= 3.5, f"will after {elapsed:.2f}s; session expiry 1s, will delay 30s"
