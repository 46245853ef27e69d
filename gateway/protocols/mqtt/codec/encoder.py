"""Encode MQTT packets to bytes for protocol level 4 (3.1.1) or 5 (5.0), plus hot-path helpers."""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from .packets import (
    Auth,
    Connack,
    Connect,
    Disconnect,
    Packet,
    Pingreq,
    Pingresp,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Unsuback,
    Unsubscribe,
)
from .primitives import enc_bin, enc_str, encode_varint
from .properties import encode_properties

PINGRESP = b"\xd0\x00"
PINGREQ = b"\xc0\x00"

_ACK = struct.Struct(">BBH")


def puback(packet_id: int) -> bytes:
    return _ACK.pack(0x40, 2, packet_id)


def pubrec(packet_id: int) -> bytes:
    return _ACK.pack(0x50, 2, packet_id)


def pubrel(packet_id: int) -> bytes:
    return _ACK.pack(0x62, 2, packet_id)


def pubcomp(packet_id: int) -> bytes:
    return _ACK.pack(0x70, 2, packet_id)


def _props_block(props: Properties) -> bytes:
    if not props:
        return b"\x00"
    raw = encode_properties(props)
    return encode_varint(len(raw)) + raw


def _frame(first: int, body: bytes) -> bytes:
    return bytes((first,)) + encode_varint(len(body)) + body


def publish_parts(
    topic: str, payload: bytes, qos: int, retain: bool, properties: bytes, protocol_level: int
) -> tuple[bytes, bytes]:
    """Split a PUBLISH around its packet id: full packet = head + pid (qos > 0 only) + tail."""
    t = topic.encode("utf-8")
    tl = len(t)
    if protocol_level == 5:
        plen = len(properties)
        pv = encode_varint(plen)
        tail = pv + properties + payload if plen else b"\x00" + payload
    else:
        tail = payload
    rl = 2 + tl + len(tail) + (2 if qos else 0)
    head = bytes((0x30 | (qos << 1) | (1 if retain else 0),)) + encode_varint(rl) + tl.to_bytes(2, "big") + t
    return head, tail


def _publish(p: Publish, level: int) -> bytes:
    head, tail = publish_parts(
        p.topic,
        p.payload,
        p.qos,
        p.retain,
        encode_properties(p.properties) if level == 5 else b"",
        level,
    )
    if p.dup:
        head = bytes((head[0] | 0x08,)) + head[1:]
    if p.qos:
        return head + p.packet_id.to_bytes(2, "big") + tail
    return head + tail


def _connect(p: Connect, level: int) -> bytes:
    lvl_byte = 3 if p.protocol_name == "MQIsdp" and p.protocol_level == 4 else p.protocol_level
    if p.bridge:
        lvl_byte |= 0x80
    flags = 0x02 if p.clean_start else 0
    will = p.will
    if will is not None:
        flags |= 0x04 | (will.qos << 3) | (0x20 if will.retain else 0)
    if p.password is not None:
        flags |= 0x40
    if p.username is not None:
        flags |= 0x80
    five = p.protocol_level == 5
    parts = [enc_str(p.protocol_name), bytes((lvl_byte, flags)), p.keepalive.to_bytes(2, "big")]
    if five:
        parts.append(_props_block(p.properties))
    parts.append(enc_str(p.client_id))
    if will is not None:
        if five:
            parts.append(_props_block(will.properties))
        parts.append(enc_str(will.topic))
        parts.append(enc_bin(will.payload))
    if p.username is not None:
        parts.append(enc_str(p.username))
    if p.password is not None:
        parts.append(enc_bin(p.password))
    return _frame(0x10, b"".join(parts))


def _connack(p: Connack, level: int) -> bytes:
    body = bytes((1 if p.session_present else 0, p.reason_code))
    if level == 5:
        body += _props_block(p.properties)
    return _frame(0x20, body)


def _ack(first: int) -> Callable[[Any, int], bytes]:
    def enc(p: Any, level: int) -> bytes:
        pid = p.packet_id.to_bytes(2, "big")
        if level != 5 or (not p.reason_code and not p.properties):
            return bytes((first, 2)) + pid
        if not p.properties:
            return bytes((first, 3)) + pid + bytes((p.reason_code,))
        return _frame(first, pid + bytes((p.reason_code,)) + _props_block(p.properties))

    return enc


def _subscribe(p: Subscribe, level: int) -> bytes:
    parts = [p.packet_id.to_bytes(2, "big")]
    if level == 5:
        parts.append(_props_block(p.properties))
    for s in p.subscriptions:
        opts = s.qos
        if level == 5:
            opts |= (4 if s.no_local else 0) | (8 if s.retain_as_published else 0) | (s.retain_handling << 4)
        parts.append(enc_str(s.topic_filter))
        parts.append(bytes((opts,)))
    return _frame(0x82, b"".join(parts))


def _suback(p: Suback, level: int) -> bytes:
    props = _props_block(p.properties) if level == 5 else b""
    return _frame(0x90, p.packet_id.to_bytes(2, "big") + props + bytes(p.reason_codes))


def _unsubscribe(p: Unsubscribe, level: int) -> bytes:
    parts = [p.packet_id.to_bytes(2, "big")]
    if level == 5:
        parts.append(_props_block(p.properties))
    parts.extend(enc_str(f) for f in p.topic_filters)
    return _frame(0xA2, b"".join(parts))


def _unsuback(p: Unsuback, level: int) -> bytes:
    if level != 5:  # 3.1.1 UNSUBACK has no payload
        return _frame(0xB0, p.packet_id.to_bytes(2, "big"))
    body = p.packet_id.to_bytes(2, "big") + _props_block(p.properties) + bytes(p.reason_codes)
    return _frame(0xB0, body)


def _pingreq(p: Pingreq, level: int) -> bytes:
    return PINGREQ


def _pingresp(p: Pingresp, level: int) -> bytes:
    return PINGRESP


def _reason_props(first: int) -> Callable[[Any, int], bytes]:
    def enc(p: Any, level: int) -> bytes:
        if level != 5 or (not p.reason_code and not p.properties):
            return bytes((first, 0))
        if not p.properties:
            return bytes((first, 1, p.reason_code))
        return _frame(first, bytes((p.reason_code,)) + _props_block(p.properties))

    return enc


_ENCODERS: dict[type, Callable[[Any, int], bytes]] = {
    Publish: _publish,
    Puback: _ack(0x40),
    Pubrec: _ack(0x50),
    Pubrel: _ack(0x62),
    Pubcomp: _ack(0x70),
    Connect: _connect,
    Connack: _connack,
    Subscribe: _subscribe,
    Suback: _suback,
    Unsubscribe: _unsubscribe,
    Unsuback: _unsuback,
    Pingreq: _pingreq,
    Pingresp: _pingresp,
    Disconnect: _reason_props(0xE0),
    Auth: _reason_props(0xF0),
}


def encode(packet: Packet, protocol_level: int) -> bytes:
    """Encode any packet. Level 5 writes properties and reason codes; any other level writes 3.1.1 forms.

    CONNECT is encoded per its own `protocol_level` field (the connection has no level before it).
    """
    try:
        enc = _ENCODERS[type(packet)]
    except KeyError:
        raise TypeError(f"not an MQTT packet: {packet!r}") from None
    return enc(packet, protocol_level)
