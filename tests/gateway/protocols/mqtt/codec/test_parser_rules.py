"""Targeted parser rules: each invalid input maps to the right reason code; edge forms decode."""

from __future__ import annotations

import time

import pytest

from tidewire.gateway.protocols.mqtt.codec import (
    Auth,
    Connack,
    Connect,
    Disconnect,
    Parser,
    ProtocolError,
    Puback,
    Publish,
    Pubrec,
    Pubrel,
    ReasonCode,
    Subscribe,
    SubscriptionRequest,
    decode_properties,
    encode,
    encode_varint,
)

RC = ReasonCode


def s(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return len(raw).to_bytes(2, "big") + raw


def frame(first: int, body: bytes) -> bytes:
    return bytes((first,)) + encode_varint(len(body)) + body


def connect_body(name: str = "MQTT", level: int = 4, flags: int = 0x02, rest: bytes | None = None) -> bytes:
    props = b"\x00" if level == 5 else b""
    return s(name) + bytes((level, flags)) + b"\x00\x3c" + props + (s("cid") if rest is None else rest)


def connected(level: int) -> Parser:
    parser = Parser()
    assert parser.feed(frame(0x10, connect_body(level=level))) == [Connect("cid", level)]
    return parser


def reject(data: bytes, code: int, level: int | None = None, **kw: int) -> ProtocolError:
    parser = Parser(**kw) if level is None else connected(level)
    with pytest.raises(ProtocolError) as info:
        parser.feed(data)
    assert info.value.reason_code == code, info.value
    return info.value


# -- stream-level rules ---------------------------------------------------------------------------


def test_first_packet_must_be_connect_even_before_body_arrives() -> None:
    reject(b"\x30\x10", RC.PROTOCOL_ERROR)  # only a PUBLISH fixed header


def test_second_connect_is_protocol_error() -> None:
    reject(frame(0x10, connect_body()), RC.PROTOCOL_ERROR, level=4)


def test_remaining_length_over_four_bytes_is_malformed() -> None:
    reject(b"\x30\xff\xff\xff\xff\x01", RC.MALFORMED_PACKET, level=4)


def test_max_varint_header_waits_for_body_and_one_more_is_too_large() -> None:
    header = b"\x30\xff\xff\xff\x7f"  # 268435455: total packet 268435460 bytes = default maximum
    assert connected(4).feed(header) == []
    parser = Parser(max_packet_size=268435459, protocol_level=4)
    with pytest.raises(ProtocolError) as info:
        parser.feed(header)
    assert info.value.reason_code == RC.PACKET_TOO_LARGE


def test_packet_too_large_raised_on_fixed_header_alone() -> None:
    reject(b"\x30\x80\x08", RC.PACKET_TOO_LARGE, max_packet_size=1000, protocol_level=4)  # rl = 1024


def test_packet_exactly_max_size_is_accepted() -> None:
    pkt = encode(Publish("t", b"x" * 20), 4)
    assert Parser(max_packet_size=len(pkt), protocol_level=4).feed(pkt) == [Publish("t", b"x" * 20)]
    reject(pkt, RC.PACKET_TOO_LARGE, max_packet_size=len(pkt) - 1, protocol_level=4)


def test_reserved_packet_type_and_auth_in_311_are_malformed() -> None:
    reject(b"\x00\x00", RC.MALFORMED_PACKET, level=4)
    reject(b"\xf0\x00", RC.MALFORMED_PACKET, level=4)


def test_big_publish_in_small_chunks_is_linear() -> None:
    payload = bytes(range(256)) * (8 * 4096)  # 8 MiB
    data = encode(Publish("big/one", payload, 1, packet_id=9), 4)
    parser = connected(4)
    start = time.perf_counter()
    out = []
    for i in range(0, len(data), 1024):
        out += parser.feed(data[i : i + 1024])
    elapsed = time.perf_counter() - start
    assert out == [Publish("big/one", payload, 1, packet_id=9)]
    assert elapsed < 3.0  # quadratic re-copying of the buffer would take tens of seconds


def test_client_side_parser_by_assigning_protocol_level() -> None:
    parser = Parser()
    parser.protocol_level = 5
    assert parser.feed(encode(Connack(True, 0, {0x21: 10}), 5)) == [Connack(True, 0, {0x21: 10})]


# -- CONNECT ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "level"), [("MQTT", 3), ("MQTT", 6), ("MQIsdp", 4), ("HTTP", 4),
                                            ("MQTT", 0x83), ("MQTT", 0x86), ("MQTT", 0x80), ("MQIsdp", 0x84)])
def test_unsupported_protocol(name: str, level: int) -> None:
    reject(frame(0x10, connect_body(name, level)), RC.UNSUPPORTED_PROTOCOL_VERSION)


@pytest.mark.parametrize(("name", "byte", "level"), [("MQTT", 0x84, 4), ("MQIsdp", 0x83, 4), ("MQTT", 0x85, 5)])
def test_the_level_bytes_top_bit_marks_a_bridge(name: str, byte: int, level: int) -> None:
    """Mosquitto's try_private: the level's top bit says the client is another broker's bridge."""
    props = b"\x00" if level == 5 else b""
    data = frame(0x10, s(name) + bytes((byte, 0x02)) + b"\x00\x3c" + props + s("cid"))
    parser = Parser()
    (pkt,) = parser.feed(data)
    assert parser.protocol_level == level
    assert pkt == Connect("cid", level, protocol_name=name, bridge=True)
    assert encode(pkt, level) == data


def test_mqisdp_level_3_is_treated_as_4() -> None:
    parser = Parser()
    (pkt,) = parser.feed(frame(0x10, connect_body("MQIsdp", 3)))
    assert parser.protocol_level == 4
    assert pkt == Connect("cid", 4, protocol_name="MQIsdp")
    assert encode(pkt, 4) == frame(0x10, connect_body("MQIsdp", 3))


@pytest.mark.parametrize(
    "flags",
    [
        0x03,  # reserved bit
        0x02 | 0x04 | 0x18,  # will qos 3
        0x02 | 0x08,  # will qos without will flag
        0x02 | 0x20,  # will retain without will flag
    ],
)
def test_bad_connect_flags(flags: int) -> None:
    rest = s("cid") + s("w") + s(b"p")
    reject(frame(0x10, connect_body(flags=flags, rest=rest)), RC.MALFORMED_PACKET)


def test_password_without_username() -> None:
    rest = s("cid") + s(b"secret")
    reject(frame(0x10, connect_body(level=4, flags=0x42, rest=rest)), RC.MALFORMED_PACKET)
    (pkt,) = Parser().feed(frame(0x10, connect_body(level=5, flags=0x42, rest=rest)))
    assert pkt == Connect("cid", 5, password=b"secret")


def test_connect_flags_in_fixed_header_and_trailing_bytes() -> None:
    reject(frame(0x11, connect_body()), RC.MALFORMED_PACKET)
    reject(frame(0x10, connect_body() + b"\x00"), RC.MALFORMED_PACKET)


def test_will_topic_with_wildcard() -> None:
    rest = s("cid") + s("a/+") + s(b"p")
    reject(frame(0x10, connect_body(flags=0x06, rest=rest)), RC.TOPIC_NAME_INVALID)


@pytest.mark.parametrize("raw", [b"\xff", b"a\x00b", b"\xed\xa0\x80", b"\xc3"])
def test_bad_utf8_client_id(raw: bytes) -> None:
    reject(frame(0x10, connect_body(rest=s(raw))), RC.MALFORMED_PACKET)


def test_string_length_beyond_packet() -> None:
    reject(frame(0x10, connect_body(rest=b"\x00\x09abc")), RC.MALFORMED_PACKET)


# -- fixed header flags ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        b"\x60\x02\x00\x01",  # PUBREL must be 0b0010
        b"\x42\x02\x00\x01",  # PUBACK must be 0
        b"\x80\x06\x00\x01" + s("a") + b"\x00",  # SUBSCRIBE must be 0b0010
        b"\xa0\x05\x00\x01" + s("a"),  # UNSUBSCRIBE must be 0b0010
        b"\xc1\x00",  # PINGREQ must be 0
        b"\xe8\x00",  # DISCONNECT must be 0
    ],
)
def test_wrong_fixed_header_flags(data: bytes) -> None:
    reject(data, RC.MALFORMED_PACKET, level=4)


# -- PUBLISH ---------------------------------------------------------------------------------------


def test_publish_qos3() -> None:
    reject(frame(0x36, s("t") + b"\x00\x01"), RC.MALFORMED_PACKET, level=4)


def test_publish_qos0_dup() -> None:
    reject(frame(0x38, s("t") + b"\x00"), RC.MALFORMED_PACKET, level=5)
    assert connected(4).feed(frame(0x38, s("t") + b"x")) == [Publish("t", b"x", dup=True)]


@pytest.mark.parametrize("topic", ["a/+/b", "a/#", "#", "+"])
@pytest.mark.parametrize("level", [4, 5])
def test_publish_wildcard_topic(topic: str, level: int) -> None:
    props = b"\x00" if level == 5 else b""
    reject(frame(0x30, s(topic) + props), RC.TOPIC_NAME_INVALID, level=level)


def test_publish_empty_topic() -> None:
    reject(frame(0x30, s("") + b"x"), RC.TOPIC_NAME_INVALID, level=4)
    reject(frame(0x30, s("") + b"\x00x"), RC.TOPIC_NAME_INVALID, level=5)
    alias = b"\x03\x23\x00\x07"
    assert connected(5).feed(frame(0x30, s("") + alias + b"x")) == [Publish("", b"x", properties={0x23: 7})]


@pytest.mark.parametrize("level", [4, 5])
def test_publish_packet_id_zero(level: int) -> None:
    props = b"\x00" if level == 5 else b""
    err = reject(frame(0x32, s("t") + b"\x00\x00" + props), RC.MALFORMED_PACKET, level=level)
    assert "packet id" in err.message


@pytest.mark.parametrize("raw", [b"\xff", b"a\x00", b"\xed\xb0\x80"])
def test_publish_bad_utf8_topic(raw: bytes) -> None:
    reject(frame(0x30, s(raw)), RC.MALFORMED_PACKET, level=4)


def test_publish_topic_beyond_packet() -> None:
    reject(frame(0x30, b"\x00\x05ab"), RC.MALFORMED_PACKET, level=4)


def test_publish_5_without_property_length() -> None:
    reject(frame(0x32, s("t") + b"\x00\x01"), RC.MALFORMED_PACKET, level=5)


# -- SUBSCRIBE / UNSUBSCRIBE -----------------------------------------------------------------------


@pytest.mark.parametrize("level", [4, 5])
def test_subscribe_and_unsubscribe_without_filters(level: int) -> None:
    props = b"\x00" if level == 5 else b""
    reject(frame(0x82, b"\x00\x01" + props), RC.PROTOCOL_ERROR, level=level)
    reject(frame(0xA2, b"\x00\x01" + props), RC.PROTOCOL_ERROR, level=level)


@pytest.mark.parametrize(
    ("level", "opts"), [(4, 0x03), (4, 0x04), (4, 0x80), (5, 0x03), (5, 0x30), (5, 0x40), (5, 0x80)]
)
def test_bad_subscription_options(level: int, opts: int) -> None:
    props = b"\x00" if level == 5 else b""
    reject(frame(0x82, b"\x00\x01" + props + s("a/b") + bytes((opts,))), RC.MALFORMED_PACKET, level=level)


def test_subscribe_filter_validity_is_not_parsers_job() -> None:
    data = frame(0x82, b"\x00\x01\x00" + s("a/#/b") + b"\x2e")
    (pkt,) = connected(5).feed(data)
    assert pkt == Subscribe(1, [SubscriptionRequest("a/#/b", 2, True, True, 2)])


# -- properties ------------------------------------------------------------------------------------


def test_property_not_allowed_on_packet() -> None:
    reject(frame(0x40, b"\x00\x01\x00\x03\x23\x00\x01"), RC.MALFORMED_PACKET, level=5)  # TOPIC_ALIAS


def test_duplicate_property() -> None:
    props = b"\x0a\x02\x00\x00\x00\x01\x02\x00\x00\x00\x02"
    reject(frame(0x30, s("t") + props), RC.PROTOCOL_ERROR, level=5)


def test_repeatable_properties() -> None:
    props = b"\x0c" + b"\x0b\x01" + b"\x0b\x80\x01" + b"\x26" + s("k") + s("v")
    (pkt,) = connected(5).feed(frame(0x30, s("t") + props + b"pl"))
    assert pkt == Publish("t", b"pl", properties={0x0B: [1, 128], 0x26: [("k", "v")]})


def test_two_subscription_identifiers_on_subscribe() -> None:
    reject(frame(0x82, b"\x00\x01\x04\x0b\x01\x0b\x02" + s("a") + b"\x00"), RC.PROTOCOL_ERROR, level=5)


def test_subscription_identifier_zero() -> None:
    reject(frame(0x30, s("t") + b"\x02\x0b\x00"), RC.PROTOCOL_ERROR, level=5)


def test_unknown_property_id() -> None:
    reject(frame(0x30, s("t") + b"\x02\x7f\x00"), RC.MALFORMED_PACKET, level=5)


def test_property_length_beyond_packet() -> None:
    reject(frame(0x30, s("t") + b"\x09\x01\x00"), RC.MALFORMED_PACKET, level=5)
    reject(frame(0x30, s("t") + b"\x02\x02\x00"), RC.MALFORMED_PACKET, level=5)  # u32 cut short


@pytest.mark.parametrize("raw", [b"\x7f", b"\x02\x00", b"\x03" + s("\udc80".encode("utf-8", "surrogatepass"))])
def test_decode_properties_rejects_bad_input(raw: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode_properties(raw)


# -- short forms and 3.1.1 shapes ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "packet"),
    [
        (b"\xe0\x00", Disconnect()),
        (b"\xe0\x01\x04", Disconnect(4)),
        (b"\xe0\x02\x8e\x00", Disconnect(0x8E)),
        (b"\x40\x02\x00\x05", Puback(5)),
        (b"\x40\x03\x00\x05\x10", Puback(5, 0x10)),
        (b"\x40\x04\x00\x05\x10\x00", Puback(5, 0x10)),
        (b"\x62\x03\x00\x05\x92", Pubrel(5, 0x92)),
        (b"\xf0\x00", Auth()),
        (b"\xf0\x01\x18", Auth(0x18)),
    ],
)
def test_v5_short_forms(data: bytes, packet: object) -> None:
    assert connected(5).feed(data) == [packet]


@pytest.mark.parametrize(
    "data",
    [
        b"\x40\x03\x00\x05\x10",  # 3.1.1 PUBACK has no reason code
        b"\x62\x03\x00\x05\x00",
        b"\xe0\x01\x00",  # 3.1.1 DISCONNECT has no body
        b"\xc0\x01\x00",  # PINGREQ has no body
        b"\xb0\x03\x00\x01\x00",  # 3.1.1 UNSUBACK has no payload
        b"\x20\x03\x00\x00\x00",  # CONNACK trailing byte
        b"\x20\x02\x02\x00",  # CONNACK reserved ack flag
    ],
)
def test_trailing_or_extra_bytes_in_311(data: bytes) -> None:
    reject(data, RC.MALFORMED_PACKET, level=4)


def test_311_acks_have_reason_code_zero() -> None:
    assert connected(4).feed(b"\x40\x02\x00\x05\x50\x02\x00\x06") == [Puback(5), Pubrec(6)]
