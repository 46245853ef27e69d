"""The bridge's sans-IO MQTT client core alone (as h11's tests): the server's bytes are built with Tidewire's codec,
and what the core sends is parsed back with the codec's server-side parser."""

from __future__ import annotations

from typing import Any

import pytest

from tidewire.bridges.mqtt.client import ClientCore, ClientOptions
from tidewire.bridges.mqtt.events import (
    Acked,
    ClientProtocolError,
    ClientStateError,
    Connected,
    Incoming,
    KeepaliveTimeout,
    PacketTooLarge,
    Refused,
    ServerDisconnect,
    Subscribed,
    Unsubscribed,
)
from tidewire.gateway.protocols.mqtt.codec import (
    PINGRESP,
    Connack,
    Connect,
    Disconnect,
    Packet,
    Parser,
    Pingreq,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Unsuback,
    Unsubscribe,
    Will,
    encode,
    encode_properties,
)
from tidewire.gateway.protocols.mqtt.codec import PropertyId as P
from tidewire.gateway.protocols.mqtt.connect import BRIDGE_PROPERTY

T0 = 1000.0


def sent(data: bytes, level: int = 4) -> list[Packet]:
    """What the core sent, as the server's parser reads it (after its CONNECT)."""
    return Parser(protocol_level=5 if level == 5 else 4).feed(data)


def connected(level: int = 4, connack: Connack | None = None, **options: Any) -> ClientCore:
    core = ClientCore(ClientOptions("bridge-1", level=level, **options))
    core.connect(T0)
    events = core.receive(encode(connack or Connack(), level), T0)
    assert isinstance(events[0], Connected)
    return core


def reconnect(core: ClientCore, session_present: bool, props: dict[int, Any] | None = None) -> list[Any]:
    core.connection_lost()
    core.connect(T0)
    return core.receive(encode(Connack(session_present, 0, props or {}), core.options.level), T0)


def acked_tokens(events: list[Any]) -> list[object]:
    return [t for e in events if isinstance(e, Acked) for t in e.tokens]


# --- CONNECT ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("level", "name", "byte"), [(3, b"MQIsdp", 3), (4, b"MQTT", 4), (5, b"MQTT", 5)])
def test_connect_per_level_parses_back(level: int, name: bytes, byte: int) -> None:
    will = Will("bridge/state", b"0", 1, True, {P.CONTENT_TYPE: "text/plain"})
    core = ClientCore(ClientOptions("b1", level=level, clean_start=False, keepalive=30, username="u",
                                    password=b"p", will=will, session_expiry=300, receive_maximum=50))
    data = core.connect(T0)
    assert data[2:4 + len(name)] == len(name).to_bytes(2, "big") + name
    assert data[4 + len(name)] == byte
    [packet] = Parser().feed(data)
    assert isinstance(packet, Connect)
    assert (packet.client_id, packet.clean_start, packet.keepalive, packet.username, packet.password) == \
        ("b1", False, 30, "u", b"p")
    assert packet.will is not None and (packet.will.topic, packet.will.payload, packet.will.qos,
                                        packet.will.retain) == ("bridge/state", b"0", 1, True)
    if level == 5:
        assert packet.properties == {P.SESSION_EXPIRY_INTERVAL: 300, P.RECEIVE_MAXIMUM: 50}
        assert packet.will.properties == {P.CONTENT_TYPE: "text/plain"}
    else:
        assert packet.properties == {} and packet.will.properties == {}


@pytest.mark.parametrize(("level", "prefix"), [(3, b"\x00\x06MQIsdp\x83"), (4, b"\x00\x04MQTT\x84")])
def test_try_private_sets_the_bridge_bit_at_3x(level: int, prefix: bytes) -> None:
    data = ClientCore(ClientOptions("b1", level=level, try_private=True)).connect(T0)
    assert data[2:2 + len(prefix)] == prefix
    [packet] = Parser().feed(data)  # Tidewire's server side reads it as a bridge
    assert isinstance(packet, Connect) and packet.bridge and packet.protocol_level == 4


def test_try_private_is_a_user_property_at_5() -> None:
    [packet] = Parser().feed(ClientCore(ClientOptions("b1", level=5, try_private=True)).connect(T0))
    assert isinstance(packet, Connect) and packet.protocol_level == 5 and not packet.bridge
    assert packet.properties[P.USER_PROPERTY] == [BRIDGE_PROPERTY]


def test_options_are_checked() -> None:
    with pytest.raises(ValueError, match="level"):
        ClientOptions("b", level=6)
    with pytest.raises(ValueError, match="user name"):
        ClientOptions("b", level=4, password=b"p")
    ClientOptions("b", level=5, password=b"p")  # MQTT 5 allows a password alone


def test_refusals() -> None:
    core = ClientCore(ClientOptions("b1", level=4, try_private=True))
    core.connect(T0)
    [event] = core.receive(encode(Connack(False, 1), 4), T0)
    assert event == Refused(1, "unacceptable protocol version (1)")
    assert core.credit() == 0 and core.receive(b"\x20\x02\x00\x00", T0) == []  # nothing after a refusal
    core = ClientCore(ClientOptions("b1", level=5))
    core.connect(T0)
    [event] = core.receive(encode(Connack(False, 0x86, {P.REASON_STRING: "who?"}), 5), T0)
    assert event == Refused(0x86, "bad user name or password (134): who?")


# --- publishing ---------------------------------------------------------------------------------------------------
def test_publish_qos_1_and_2_flows() -> None:
    core = connected()
    assert sent(core.publish("a/b", b"zero", 0, False, "t0")) == [Publish("a/b", b"zero")]
    [p1] = sent(core.publish("a/b", b"one", 1, True, "t1"))
    [p2] = sent(core.publish("a/b", b"two", 2, False, "t2"))
    assert isinstance(p1, Publish) and isinstance(p2, Publish)
    assert (p1.qos, p1.retain, p1.dup, p2.qos) == (1, True, False, 2) and p1.packet_id != p2.packet_id
    assert core.unacked() == ["t1", "t2"]
    assert core.receive(encode(Puback(p1.packet_id), 4), T0) == [Acked(["t1"])]
    assert core.receive(encode(Pubrec(p2.packet_id), 4), T0) == []
    assert sent(core.data_to_send()) == [Pubrel(p2.packet_id)]
    assert core.receive(encode(Pubrec(p2.packet_id), 4), T0) == []  # our PUBREL was lost: sent again
    assert sent(core.data_to_send()) == [Pubrel(p2.packet_id)]
    assert core.receive(encode(Pubcomp(p2.packet_id), 4), T0) == [Acked(["t2"])]
    assert core.unacked() == []


def test_acks_in_one_read_make_one_event() -> None:
    core = connected()
    pids = [sent(core.publish("a", b"", 1, False, n))[0].packet_id for n in range(3)]  # type: ignore[union-attr]
    assert core.receive(b"".join(encode(Puback(p), 4) for p in pids), T0) == [Acked([0, 1, 2])]


def test_mqtt5_refusing_acks_are_failed() -> None:
    core = connected(5)
    [p1] = sent(core.publish("a", b"1", 1, False, "t1"), 5)
    [p2] = sent(core.publish("a", b"2", 2, False, "t2"), 5)
    [p3] = sent(core.publish("a", b"3", 1, False, "t3"), 5)
    data = encode(Puback(p1.packet_id, 0x87), 5) + encode(Pubrec(p2.packet_id, 0x97), 5)  # type: ignore[union-attr]
    data += encode(Puback(p3.packet_id, 0x10), 5)  # type: ignore[union-attr]
    # No matching subscribers (0x10) is a success; a PUBREC >= 0x80 ends the QoS 2 flow (no PUBREL).
    assert core.receive(data, T0) == [Acked(["t1", "t2", "t3"], {"t1": 0x87, "t2": 0x97})]
    assert core.data_to_send() == b"" and core.unacked() == []


def test_properties_go_as_they_are_at_5_and_not_at_4() -> None:
    block = encode_properties({P.CONTENT_TYPE: "text/plain", P.USER_PROPERTY: [("k", "v")]})
    [p5] = sent(connected(5).publish("a", b"x", 1, False, 1, block, expiry=30), 5)
    assert isinstance(p5, Publish)
    assert p5.properties == {P.CONTENT_TYPE: "text/plain", P.USER_PROPERTY: [("k", "v")],
                             P.MESSAGE_EXPIRY_INTERVAL: 30}
    [p4] = sent(connected(4).publish("a", b"x", 1, False, 1, block, expiry=30))
    assert isinstance(p4, Publish) and p4.payload == b"x"


def test_server_limits_at_5() -> None:
    limits: dict[int, Any] = {P.RETAIN_AVAILABLE: 0, P.MAXIMUM_QOS: 1, P.MAXIMUM_PACKET_SIZE: 40,
                              P.TOPIC_ALIAS_MAXIMUM: 10}
    core = connected(5, Connack(False, 0, limits))
    [p] = sent(core.publish("a/b", b"x", 2, True, "t"), 5)
    assert isinstance(p, Publish) and (p.qos, p.retain) == (1, False)  # capped, retain stripped, no alias
    assert P.TOPIC_ALIAS not in p.properties
    assert core.qos_for(2) == 1
    with pytest.raises(PacketTooLarge, match="limit is 40"):
        core.publish("a/b", b"x" * 40, 1, False, "big")
    assert core.unacked() == ["t"]  # the refused one took no slot


def test_our_own_max_packet_size_and_bad_topics() -> None:
    core = connected(4, max_packet_size=20)
    core.publish("a", b"x" * 15, 0, False, None)  # 2 + 2 + 1 + 15 = 20 bytes
    with pytest.raises(PacketTooLarge):
        core.publish("a", b"x" * 14, 1, False, None)  # 22 with its packet id
    for topic in ("", "a/+", "a/#"):
        with pytest.raises(ValueError):
            core.publish(topic, b"", 0, False, None)


def test_no_publish_while_not_connected() -> None:
    core = ClientCore(ClientOptions("b1"))
    with pytest.raises(ClientStateError):
        core.publish("a", b"", 0, False, None)
    core.connect(T0)
    assert core.credit() == 0
    with pytest.raises(ClientStateError):
        core.publish("a", b"", 1, False, None)


# --- credit -------------------------------------------------------------------------------------------------------
def test_receive_maximum_is_the_credit() -> None:
    core = connected(5, Connack(False, 0, {P.RECEIVE_MAXIMUM: 2}), max_inflight=10)
    assert core.credit() == 2
    first = sent(core.publish("a", b"", 1, False, 1), 5)[0]
    core.publish("a", b"", 2, False, 2)
    assert core.credit() == 0
    with pytest.raises(ClientStateError, match="credit"):
        core.publish("a", b"", 1, False, 3)
    core.publish("a", b"", 0, False, 4)  # QoS 0 takes no credit
    core.receive(encode(Puback(first.packet_id), 5), T0)  # type: ignore[union-attr]
    assert core.credit() == 1


def test_max_inflight_is_the_credit_at_3x() -> None:
    core = connected(4, max_inflight=3)
    for n in range(3):
        core.publish("a", b"", 1, False, n)
    assert core.credit() == 0


def test_packet_ids_skip_those_in_use() -> None:
    core = connected(4, max_inflight=3)
    core._next_id = 65534  # near the wrap
    pids = [sent(core.publish("a", b"", 1, False, n))[0].packet_id for n in range(2)]  # type: ignore[union-attr]
    assert pids == [65535, 1]
    sub_pid, _ = core.subscribe([("x", 0, False, False)])
    assert sub_pid == 2


# --- reconnecting -------------------------------------------------------------------------------------------------
def _three_in_flight(core: ClientCore) -> tuple[int, int, int]:
    """QoS 1, QoS 1, QoS 2 (released: PUBREC received)."""
    p1, p2, p3 = (sent(core.publish("a", bytes([n]), q, n == 0, n))[0] for n, q in enumerate((1, 1, 2)))
    assert isinstance(p1, Publish) and isinstance(p2, Publish) and isinstance(p3, Publish)
    core.receive(encode(Pubrec(p3.packet_id), 4), T0)
    core.data_to_send()
    return p1.packet_id, p2.packet_id, p3.packet_id


def test_session_present_resends_with_dup_and_pubrel() -> None:
    core = connected(4, clean_start=False)
    a, b, c = _three_in_flight(core)
    events = reconnect(core, session_present=True)
    assert events == [Connected(True, {})]
    assert sent(core.data_to_send()) == [Publish("a", b"\x00", 1, True, True, a), Publish("a", b"\x01", 1, False,
                                                                                            True, b), Pubrel(c)]
    assert core.unacked() == [0, 1, 2] and core.credit() == 97
    core.receive(encode(Pubcomp(c), 4) + encode(Puback(a), 4), T0)
    assert core.unacked() == [1]


def test_no_session_resends_as_new_publishes() -> None:
    core = connected(4, clean_start=False)
    a, b, c = _three_in_flight(core)
    reconnect(core, session_present=False)
    assert sent(core.data_to_send()) == [Publish("a", b"\x00", 1, True, False, a),
                                         Publish("a", b"\x01", 1, False, False, b),
                                         Publish("a", b"\x02", 2, False, False, c)]
    assert core.receive(encode(Pubrec(c), 4), T0) == []  # the QoS 2 flow starts over
    assert sent(core.data_to_send()) == [Pubrel(c)]


def test_a_smaller_receive_maximum_after_a_reconnect_holds_resends_back() -> None:
    core = connected(5, clean_start=False, session_expiry=60)
    a, b, c = _three_in_flight(core)
    reconnect(core, session_present=True, props={P.RECEIVE_MAXIMUM: 1})
    assert sent(core.data_to_send(), 5) == [Publish("a", b"\x00", 1, True, True, a)]
    assert core.credit() == 0
    assert core.receive(encode(Puback(a), 5), T0) == [Acked([0])]
    assert sent(core.data_to_send(), 5) == [Publish("a", b"\x01", 1, False, True, b)]
    core.receive(encode(Puback(b), 5), T0)
    assert sent(core.data_to_send(), 5) == [Pubrel(c)]


def test_new_limits_end_resends_that_no_longer_fit() -> None:
    core = connected(5, clean_start=False, session_expiry=60)
    core.publish("a", b"x" * 100, 1, False, "big")
    core.publish("a", b"y", 2, False, "two")
    events = reconnect(core, session_present=False, props={P.MAXIMUM_PACKET_SIZE: 50, P.MAXIMUM_QOS: 0})
    assert events == [Connected(False, {P.MAXIMUM_PACKET_SIZE: 50, P.MAXIMUM_QOS: 0}),
                      Acked(["big", "two"], {"big": 0x95})]
    assert sent(core.data_to_send(), 5) == [Publish("a", b"y")]  # as QoS 0: done once written
    assert core.unacked() == []


# --- receiving ----------------------------------------------------------------------------------------------------
def test_incoming_qos_1_is_acked_only_once_stored() -> None:
    core = connected()
    [event] = core.receive(encode(Publish("in/a", b"m", 1, False, False, 7), 4), T0)
    assert event == Incoming("in/a", b"m", 1, False, 7)
    assert core.data_to_send() == b""
    assert core.receive(encode(Publish("in/a", b"m", 1, False, True, 7), 4), T0) == []  # still being stored
    assert core.incoming_stored(7) == encode(Puback(7), 4)
    assert core.incoming_stored(7) == b""  # once


def test_incoming_qos_2_exactly_once() -> None:
    core = connected()
    publish = encode(Publish("in/a", b"m", 2, True, False, 9), 4)
    [event] = core.receive(publish, T0)
    assert isinstance(event, Incoming) and (event.qos, event.retain, event.packet_id) == (2, True, 9)
    assert core.receive(publish, T0) == [] and core.data_to_send() == b""  # not stored yet: no answer
    assert core.incoming_stored(9) == encode(Pubrec(9), 4)
    assert core.receive(encode(Publish("in/a", b"m", 2, True, True, 9), 4), T0) == []  # PUBREC lost: again
    assert sent(core.data_to_send()) == [Pubrec(9)]
    assert core.receive(encode(Pubrel(9), 4), T0) == []
    assert sent(core.data_to_send()) == [Pubcomp(9)]
    [event] = core.receive(publish, T0)  # the id is free again: a new message
    assert isinstance(event, Incoming)


def test_stored_between_connections_and_resent_in_a_kept_session() -> None:
    core = connected(4, clean_start=False)
    core.receive(encode(Publish("in", b"q2", 2, False, False, 3), 4), T0)
    core.receive(encode(Publish("in", b"q1", 1, False, False, 4), 4), T0)
    core.connection_lost()
    assert core.incoming_stored(3) == b""  # nowhere to send it; the state moves on
    reconnect(core, session_present=True)
    resent = encode(Publish("in", b"q2", 2, False, True, 3), 4) + encode(Publish("in", b"q1", 1, False, True, 4), 4)
    assert core.receive(resent, T0) == []  # the QoS 2 is stored, the QoS 1 still being stored
    assert sent(core.data_to_send()) == [Pubrec(3)]
    assert core.incoming_stored(4) == encode(Puback(4), 4)


def test_a_lost_session_does_not_let_an_old_store_ack_a_new_message() -> None:
    core = connected(4, clean_start=False)
    core.receive(encode(Publish("in", b"old", 1, False, False, 1), 4), T0)
    reconnect(core, session_present=False)
    [event] = core.receive(encode(Publish("in", b"new", 1, False, False, 1), 4), T0)
    assert isinstance(event, Incoming) and event.payload == b"new"
    assert core.incoming_stored(1) == b""  # whichever store ends first, the PUBACK waits for both
    assert core.incoming_stored(1) == encode(Puback(1), 4)


def test_incoming_properties_are_the_stored_block() -> None:
    core = connected(5)
    props: dict[int, Any] = {P.CONTENT_TYPE: "t", P.MESSAGE_EXPIRY_INTERVAL: 60, P.SUBSCRIPTION_IDENTIFIER: [4],
             P.USER_PROPERTY: [("a", "b")]}
    [event] = core.receive(encode(Publish("in", b"m", 0, False, False, 0, props), 5), T0)
    assert isinstance(event, Incoming) and event.expiry == 60
    assert event.properties == encode_properties({P.CONTENT_TYPE: "t", P.USER_PROPERTY: [("a", "b")]})


def test_our_receive_maximum_is_enforced_at_5() -> None:
    core = connected(5, receive_maximum=2)
    core.receive(encode(Publish("in", b"", 1, False, False, 1), 5) + encode(Publish("in", b"", 2, False, False, 2),
                                                                          5), T0)
    with pytest.raises(ClientProtocolError) as caught:
        core.receive(encode(Publish("in", b"", 1, False, False, 3), 5), T0)
    assert caught.value.reason_code == 0x93


def test_subscribe_and_unsubscribe() -> None:
    core = connected(5)
    pid, data = core.subscribe([("in/#", 2, True, True), ("x", 0, False, False)])
    [packet] = Parser(protocol_level=5).feed(data)
    assert isinstance(packet, Subscribe) and packet.packet_id == pid
    assert [(s.topic_filter, s.qos, s.no_local, s.retain_as_published) for s in packet.subscriptions] == \
        [("in/#", 2, True, True), ("x", 0, False, False)]
    assert core.receive(encode(Suback(pid, [2, 0x87]), 5), T0) == [Subscribed(pid, [2, 0x87])]
    pid, data = core.unsubscribe(["in/#"])
    assert Parser(protocol_level=5).feed(data) == [Unsubscribe(pid, ["in/#"])]
    assert core.receive(encode(Unsuback(pid, [0]), 5), T0) == [Unsubscribed(pid, [0])]
    # 3.1.1 has no subscription options: the bits are not sent
    core = connected(4)
    pid, data = core.subscribe([("in/#", 1, True, True)])
    assert data.endswith(b"in/#\x01")


def test_server_disconnect_at_5() -> None:
    core = connected(5)
    [event] = core.receive(encode(Disconnect(0x8B, {P.REASON_STRING: "bye"}), 5), T0)
    assert event == ServerDisconnect(0x8B, "bye")
    assert core.credit() == 0


# --- violations ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("data", "code"), [
    (b"\x36\x05\x00\x01a\x00\x01", 0x81),  # PUBLISH with QoS 3
    (b"\x20\x02\x02\x00", 0x81),  # a CONNACK with reserved flags (after the first)
    (encode(Pingreq(), 4), 0x82),  # servers do not ping
    (encode(Connack(), 4), 0x82),  # a second CONNACK
    (b"\x30\xff\xff\xff\xff\x01", 0x81),  # a remaining length of 5 bytes
    (b"\x40\x03\x00\x01\x00", 0x81),  # a 3.1.1 PUBACK one byte too long
])
def test_malformed_or_unexpected_packets(data: bytes, code: int) -> None:
    core = connected()
    with pytest.raises(ClientProtocolError) as caught:
        core.receive(data, T0)
    assert caught.value.reason_code == code


def test_only_a_connack_comes_first() -> None:
    core = ClientCore(ClientOptions("b1"))
    core.connect(T0)
    with pytest.raises(ClientProtocolError, match="before CONNACK"):
        core.receive(encode(Publish("a", b""), 4), T0)


def test_topic_aliases_are_refused() -> None:
    core = connected(5)
    with pytest.raises(ClientProtocolError) as caught:
        core.receive(encode(Publish("a", b"", 0, False, False, 0, {P.TOPIC_ALIAS: 1}), 5), T0)
    assert caught.value.reason_code == 0x94


def test_a_packet_split_across_reads() -> None:
    core = connected()
    data = encode(Publish("in/split", b"x" * 300, 1, False, False, 5), 4)
    assert core.receive(data[:1], T0) == [] and core.receive(data[1:100], T0) == []
    [event] = core.receive(data[100:], T0)
    assert isinstance(event, Incoming) and event.payload == b"x" * 300


# --- keepalive ----------------------------------------------------------------------------------------------------
def test_keepalive_pings_and_times_out() -> None:
    core = connected(keepalive=10)
    assert core.next_deadline() == T0 + 10
    assert core.tick(T0 + 9.9) == b""
    core.sent(T0 + 5)  # something else was written: the ping moves
    assert core.next_deadline() == T0 + 15 and core.tick(T0 + 10) == b""
    assert core.tick(T0 + 15) == encode(Pingreq(), 4)
    assert core.next_deadline() == T0 + 20  # the PINGRESP is due within half the keepalive
    assert core.tick(T0 + 19) == b""
    core.receive(PINGRESP, T0 + 19)
    assert core.next_deadline() == T0 + 25
    assert core.tick(T0 + 25) == encode(Pingreq(), 4)
    with pytest.raises(KeepaliveTimeout):
        core.tick(T0 + 30)


def test_server_keep_alive_replaces_ours_and_zero_means_none() -> None:
    core = connected(5, Connack(False, 0, {P.SERVER_KEEP_ALIVE: 4}), keepalive=60)
    assert core.next_deadline() == T0 + 4
    core = connected(4, keepalive=0)
    assert core.next_deadline() is None and core.tick(T0 + 1e6) == b""
