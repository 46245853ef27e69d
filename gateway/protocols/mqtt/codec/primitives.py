"""MQTT wire primitives: variable byte integers, 2-byte-length strings and binary data (read and write).

Readers take (data, pos, end) and return (value, new_pos); they never read at or past `end` and raise
ProtocolError(MALFORMED_PACKET) instead of IndexError.
"""

from __future__ import annotations

from .errors import ProtocolError, ReasonCode, malformed

MAX_VARINT = 268_435_455

# Single-byte varints are by far the most common: prebuild them.
_SMALL_VARINTS: tuple[bytes, ...] = tuple(bytes((i,)) for i in range(128))


def encode_varint(n: int) -> bytes:
    """Encode a variable byte integer (0 .. 268435455)."""
    if n < 128:
        if n < 0:
            raise ValueError(f"varint out of range: {n}")
        return _SMALL_VARINTS[n]
    if n > MAX_VARINT:
        raise ValueError(f"varint out of range: {n}")
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def read_varint(data: bytes, pos: int, end: int) -> tuple[int, int]:
    value = 0
    shift = 0
    for _ in range(4):
        if pos >= end:
            raise malformed("variable byte integer runs past the packet end")
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7
    raise malformed("variable byte integer longer than 4 bytes")


def read_u8(data: bytes, pos: int, end: int) -> tuple[int, int]:
    if pos >= end:
        raise malformed("packet too short")
    return data[pos], pos + 1


def read_u16(data: bytes, pos: int, end: int) -> tuple[int, int]:
    if pos + 2 > end:
        raise malformed("packet too short")
    return (data[pos] << 8) | data[pos + 1], pos + 2


def read_u32(data: bytes, pos: int, end: int) -> tuple[int, int]:
    if pos + 4 > end:
        raise malformed("packet too short")
    return int.from_bytes(data[pos : pos + 4], "big"), pos + 4


def read_bin(data: bytes, pos: int, end: int) -> tuple[bytes, int]:
    if pos + 2 > end:
        raise malformed("packet too short")
    stop = pos + 2 + ((data[pos] << 8) | data[pos + 1])
    if stop > end:
        raise malformed("binary data runs past the packet end")
    return data[pos + 2 : stop], stop


def decode_utf8(raw: bytes) -> str:
    """Strict MQTT UTF-8: the codec rejects surrogates/invalid sequences; U+0000 is forbidden by MQTT."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise malformed("invalid UTF-8 string") from None
    if "\x00" in text:
        raise malformed("string contains U+0000")
    return text


def read_str(data: bytes, pos: int, end: int) -> tuple[str, int]:
    if pos + 2 > end:
        raise malformed("packet too short")
    stop = pos + 2 + ((data[pos] << 8) | data[pos + 1])
    if stop > end:
        raise malformed("string runs past the packet end")
    return decode_utf8(data[pos + 2 : stop]), stop


def read_topic_name(data: bytes, pos: int, end: int) -> tuple[str, int]:
    """A topic name (PUBLISH / will topic): no wildcards; emptiness is checked by the caller."""
    topic, pos = read_str(data, pos, end)
    if "+" in topic or "#" in topic:
        raise ProtocolError(ReasonCode.TOPIC_NAME_INVALID, f"wildcard in topic name {topic!r}")
    return topic, pos


def enc_str(s: str) -> bytes:
    raw = s.encode("utf-8")
    n = len(raw)
    if n > 0xFFFF:
        raise ValueError("string longer than 65535 bytes")
    return n.to_bytes(2, "big") + raw


def enc_bin(b: bytes) -> bytes:
    n = len(b)
    if n > 0xFFFF:
        raise ValueError("binary data longer than 65535 bytes")
    return n.to_bytes(2, "big") + b
