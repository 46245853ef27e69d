"""MQTT 5 property blocks: the type of each property, which packets may carry it, encoding and decoding.

Value types: int for byte / 2-byte / 4-byte / varint properties, str for UTF-8 strings, bytes for binary
data, list[tuple[str, str]] for USER_PROPERTY and list[int] for SUBSCRIPTION_IDENTIFIER.
"""

from __future__ import annotations

from typing import Any

from .errors import PacketType, PropertyId, malformed, protocol_error
from .primitives import enc_bin, enc_str, encode_varint, read_bin, read_str, read_varint

Properties = dict[int, Any]

# Wire types.
BYTE, U16, U32, VARINT, STR, BIN, PAIR = range(7)

P = PropertyId
PROPERTY_TYPES: dict[int, int] = {
    P.PAYLOAD_FORMAT_INDICATOR: BYTE,
    P.MESSAGE_EXPIRY_INTERVAL: U32,
    P.CONTENT_TYPE: STR,
    P.RESPONSE_TOPIC: STR,
    P.CORRELATION_DATA: BIN,
    P.SUBSCRIPTION_IDENTIFIER: VARINT,
    P.SESSION_EXPIRY_INTERVAL: U32,
    P.ASSIGNED_CLIENT_IDENTIFIER: STR,
    P.SERVER_KEEP_ALIVE: U16,
    P.AUTHENTICATION_METHOD: STR,
    P.AUTHENTICATION_DATA: BIN,
    P.REQUEST_PROBLEM_INFORMATION: BYTE,
    P.WILL_DELAY_INTERVAL: U32,
    P.REQUEST_RESPONSE_INFORMATION: BYTE,
    P.RESPONSE_INFORMATION: STR,
    P.SERVER_REFERENCE: STR,
    P.REASON_STRING: STR,
    P.RECEIVE_MAXIMUM: U16,
    P.TOPIC_ALIAS_MAXIMUM: U16,
    P.TOPIC_ALIAS: U16,
    P.MAXIMUM_QOS: BYTE,
    P.RETAIN_AVAILABLE: BYTE,
    P.USER_PROPERTY: PAIR,
    P.MAXIMUM_PACKET_SIZE: U32,
    P.WILDCARD_SUBSCRIPTION_AVAILABLE: BYTE,
    P.SUBSCRIPTION_IDENTIFIER_AVAILABLE: BYTE,
    P.SHARED_SUBSCRIPTION_AVAILABLE: BYTE,
}
# Properties decoded into lists because they may repeat.
MULTI = frozenset({P.USER_PROPERTY, P.SUBSCRIPTION_IDENTIFIER})

# Pseudo packet type for the will properties inside CONNECT.
WILL = 0
T = PacketType
_ALL = frozenset(PROPERTY_TYPES)
_REASON_ONLY = frozenset({P.REASON_STRING, P.USER_PROPERTY})
ALLOWED: dict[int, frozenset[int]] = {
    WILL: frozenset(
        {
            P.PAYLOAD_FORMAT_INDICATOR,
            P.MESSAGE_EXPIRY_INTERVAL,
            P.CONTENT_TYPE,
            P.RESPONSE_TOPIC,
            P.CORRELATION_DATA,
            P.WILL_DELAY_INTERVAL,
            P.USER_PROPERTY,
        }
    ),
    T.CONNECT: frozenset(
        {
            P.SESSION_EXPIRY_INTERVAL,
            P.AUTHENTICATION_METHOD,
            P.AUTHENTICATION_DATA,
            P.REQUEST_PROBLEM_INFORMATION,
            P.REQUEST_RESPONSE_INFORMATION,
            P.RECEIVE_MAXIMUM,
            P.TOPIC_ALIAS_MAXIMUM,
            P.USER_PROPERTY,
            P.MAXIMUM_PACKET_SIZE,
        }
    ),
    T.CONNACK: frozenset(
        {
            P.SESSION_EXPIRY_INTERVAL,
            P.ASSIGNED_CLIENT_IDENTIFIER,
            P.SERVER_KEEP_ALIVE,
            P.AUTHENTICATION_METHOD,
            P.AUTHENTICATION_DATA,
            P.RESPONSE_INFORMATION,
            P.SERVER_REFERENCE,
            P.REASON_STRING,
            P.RECEIVE_MAXIMUM,
            P.TOPIC_ALIAS_MAXIMUM,
            P.MAXIMUM_QOS,
            P.RETAIN_AVAILABLE,
            P.USER_PROPERTY,
            P.MAXIMUM_PACKET_SIZE,
            P.WILDCARD_SUBSCRIPTION_AVAILABLE,
            P.SUBSCRIPTION_IDENTIFIER_AVAILABLE,
            P.SHARED_SUBSCRIPTION_AVAILABLE,
        }
    ),
    T.PUBLISH: frozenset(
        {
            P.PAYLOAD_FORMAT_INDICATOR,
            P.MESSAGE_EXPIRY_INTERVAL,
            P.CONTENT_TYPE,
            P.RESPONSE_TOPIC,
            P.CORRELATION_DATA,
            P.SUBSCRIPTION_IDENTIFIER,
            P.TOPIC_ALIAS,
            P.USER_PROPERTY,
        }
    ),
    T.PUBACK: _REASON_ONLY,
    T.PUBREC: _REASON_ONLY,
    T.PUBREL: _REASON_ONLY,
    T.PUBCOMP: _REASON_ONLY,
    T.SUBSCRIBE: frozenset({P.SUBSCRIPTION_IDENTIFIER, P.USER_PROPERTY}),
    T.SUBACK: _REASON_ONLY,
    T.UNSUBSCRIBE: frozenset({P.USER_PROPERTY}),
    T.UNSUBACK: _REASON_ONLY,
    T.DISCONNECT: frozenset(
        {P.SESSION_EXPIRY_INTERVAL, P.SERVER_REFERENCE, P.REASON_STRING, P.USER_PROPERTY}
    ),
    T.AUTH: frozenset({P.AUTHENTICATION_METHOD, P.AUTHENTICATION_DATA, P.REASON_STRING, P.USER_PROPERTY}),
}
_SUB_ID = int(P.SUBSCRIPTION_IDENTIFIER)


def encode_properties(props: Properties) -> bytes:
    """Encode a property block's content (without its length prefix), in dict insertion order."""
    if not props:
        return b""
    out = bytearray()
    for pid, value in props.items():
        kind = PROPERTY_TYPES.get(pid)
        if kind is None:
            raise ValueError(f"unknown property id {pid!r}")
        if kind == PAIR:
            for k, v in value:
                out.append(pid)
                out += enc_str(k)
                out += enc_str(v)
        elif kind == VARINT:
            for n in [value] if isinstance(value, int) else value:
                out.append(pid)
                out += encode_varint(n)
        else:
            out.append(pid)
            if kind == BYTE:
                out.append(value)
            elif kind == U16:
                out += value.to_bytes(2, "big")
            elif kind == U32:
                out += value.to_bytes(4, "big")
            elif kind == STR:
                out += enc_str(value)
            else:
                out += enc_bin(value)
    return bytes(out)


def read_properties(data: bytes, pos: int, end: int, allowed: frozenset[int]) -> tuple[Properties, int]:
    """Read a length-prefixed property block at `pos` (bounded by `end`); return (props, position after)."""
    length, pos = read_varint(data, pos, end)
    if not length:
        return {}, pos
    stop = pos + length
    if stop > end:
        raise malformed("property block runs past the packet end")
    return decode_block(data, pos, stop, allowed), stop


def decode_block(data: bytes, pos: int, end: int, allowed: frozenset[int]) -> Properties:
    """Decode property block content data[pos:end] exactly."""
    props: Properties = {}
    value: Any
    while pos < end:
        pid = data[pos]
        pos += 1
        kind = PROPERTY_TYPES.get(pid)
        if kind is None:
            raise malformed(f"unknown property id 0x{pid:02X}")
        if pid not in allowed:
            raise malformed(f"property {PropertyId(pid).name} not allowed on this packet")
        if kind == BYTE:
            if pos >= end:
                raise malformed("property runs past the block end")
            value = data[pos]
            pos += 1
        elif kind == U16:
            if pos + 2 > end:
                raise malformed("property runs past the block end")
            value = (data[pos] << 8) | data[pos + 1]
            pos += 2
        elif kind == U32:
            if pos + 4 > end:
                raise malformed("property runs past the block end")
            value = int.from_bytes(data[pos : pos + 4], "big")
            pos += 4
        elif kind == STR:
            value, pos = read_str(data, pos, end)
        elif kind == BIN:
            value, pos = read_bin(data, pos, end)
        elif kind == VARINT:
            value, pos = read_varint(data, pos, end)
            if value == 0 and pid == _SUB_ID:
                raise protocol_error("subscription identifier 0")
        else:
            key, pos = read_str(data, pos, end)
            val, pos = read_str(data, pos, end)
            value = (key, val)
        if pid in MULTI:
            lst = props.get(pid)
            if lst is None:
                props[pid] = [value]
            else:
                lst.append(value)
        elif pid in props:
            raise protocol_error(f"property {PropertyId(pid).name} given twice")
        else:
            props[pid] = value
    return props


def decode_properties(data: bytes) -> Properties:
    """Inverse of encode_properties: decode block content (no length prefix); raises ProtocolError."""
    try:
        return decode_block(bytes(data), 0, len(data), _ALL)
    except (IndexError, ValueError) as exc:  # defensive: readers bound-check, this should not happen
        raise malformed(f"bad property block: {exc}") from None


__all__ = [
    "ALLOWED",
    "MULTI",
    "PROPERTY_TYPES",
    "WILL",
    "Properties",
    "decode_block",
    "decode_properties",
    "encode_properties",
    "read_properties",
]
