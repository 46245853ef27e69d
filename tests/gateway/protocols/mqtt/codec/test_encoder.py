"""Encoder: known byte vectors, 3.1.1 shapes, varint limits and the fan-out helpers."""

from __future__ import annotations

import pytest

from tidewire.gateway.protocols.mqtt.codec import (
    PINGRESP,
    Connect,
    Disconnect,
    Parser,
    Pingresp,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Unsuback,
    encode,
    encode_properties,
    encode_varint,
    puback,
    pubcomp,
    publish_parts,
    pubrec,
    pubrel,
)


def test_connect_known_vector() -> None:
    expected = bytes.fromhex("100f00044d5154540402003c0003616263")
    assert encode(Connect("abc"), 4) == expected


@pytest.mark.parametrize(
    ("n", "raw"),
    [
        (0, b"\x00"),
        (127, b"\x7f"),
        (128, b"\x80\x01"),
        (16383, b"\xff\x7f"),
        (16384, b"\x80\x80\x01"),
        (2097151, b"\xff\xff\x7f"),
        (2097152, b"\x80\x80\x80\x01"),
        (268435455, b"\xff\xff\xff\x7f"),
    ],
)
def test_varint_boundaries(n: int, raw: bytes) -> None:
    assert encode_varint(n) == raw


@pytest.mark.parametrize("n", [-1, 268435456])
def test_varint_out_of_range(n: int) -> None:
    with pytest.raises(ValueError):
        encode_varint(n)


@pytest.mark.parametrize("size", [0, 1, 120, 16_000, 70_000])
def test_remaining_length_sizes_round_trip(size: int) -> None:
    pkt = Publish("a/b", b"z" * size, 1, packet_id=3)
    assert Parser(protocol_level=4).feed(encode(pkt, 4)) == [pkt]


@pytest.mark.parametrize("level", [4, 5])
@pytest.mark.parametrize("qos", [0, 1, 2])
@pytest.mark.parametrize("props", [{}, {0x01: 1, 0x0B: [5, 300], 0x26: [("a", "b")]}])
def test_publish_parts_matches_encode(level: int, qos: int, props: dict[int, object]) -> None:
    if level == 4:
        props = {}
    pid = 0x1234 if qos else 0
    for retain in (False, True):
        pkt = Publish("dev/1/tele", b"payload" * 30, qos, retain, False, pid, props)
        head, tail = publish_parts(pkt.topic, pkt.payload, qos, retain, encode_properties(props), level)
        full = head + pid.to_bytes(2, "big") + tail if qos else head + tail
        assert full == encode(pkt, level)
        if qos:  # DUP is set by the caller OR-ing 0x08 into the first byte
            pkt.dup = True
            assert bytes((head[0] | 0x08,)) + full[1:] == encode(pkt, level)
            assert Parser(protocol_level=level).feed(encode(pkt, level)) == [pkt]


@pytest.mark.parametrize("level", [4, 5])
def test_ack_helpers(level: int) -> None:
    for fn, cls in ((puback, Puback), (pubrec, Pubrec), (pubrel, Pubrel), (pubcomp, Pubcomp)):
        raw = fn(0xBEEF)
        assert len(raw) == 4
        assert raw == encode(cls(0xBEEF), level)
        assert Parser(protocol_level=level).feed(raw) == [cls(0xBEEF)]


def test_pingresp_constant() -> None:
    assert encode(Pingresp(), 4) == PINGRESP == b"\xd0\x00"


def test_level4_omits_properties_and_reason_codes() -> None:
    assert encode(Puback(7, 0x10, {0x1F: "why"}), 4) == puback(7)
    assert encode(Disconnect(0x8E, {0x1F: "x"}), 4) == b"\xe0\x00"
    assert encode(Unsuback(2, [0x11]), 4) == b"\xb0\x02\x00\x02"
    assert encode(Suback(2, [0, 1, 2, 0x80], {0x1F: "x"}), 4) == b"\x90\x06\x00\x02\x00\x01\x02\x80"


def test_level5_reason_code_forms() -> None:
    assert encode(Puback(7), 5) == b"\x40\x02\x00\x07"
    assert encode(Puback(7, 0x10), 5) == b"\x40\x03\x00\x07\x10"
    assert encode(Disconnect(), 5) == b"\xe0\x00"
    assert encode(Disconnect(4), 5) == b"\xe0\x01\x04"
    assert encode(Suback(2, [0x80], {}), 5) == b"\x90\x04\x00\x02\x00\x80"


def test_encode_rejects_non_packets() -> None:
    with pytest.raises(TypeError):
        encode("PUBLISH", 4)  # type: ignore[arg-type]
