"""The neutral message properties and their stored encoding (`Message.properties`, a field of the message record).

`Properties` are the application properties every protocol can carry, by their MQTT 5 names. AMQP: content-type
↔ content_type, correlation-id ↔ correlation_data, reply-to ↔ response_topic, headers ↔ user, expiration ↔
expiry_interval. RocketMQ: user properties ↔ user (tag and keys included).

Stored encoding (`Properties.to_block` writes it, `Properties.from_block` reads it; no length prefix): a sequence
of (identifier byte, value), at most one of each but the user properties, which keep their order:

    id    property          value
    0x01  payload format    u8, 1: the payload is UTF-8 text (written only then)
    0x03  content type      u16 big-endian length, UTF-8
    0x08  response topic    u16 length, UTF-8
    0x09  correlation data  u16 length, bytes
    0x26  user property     u16 length, UTF-8 name, u16 length, UTF-8 value (repeated)

Identifiers and values are those of MQTT 5, on purpose: a block is the content of an MQTT 5 PUBLISH property
block. The MQTT adapter stores what a PUBLISH carries, minus its per-hop properties, with its own codec, and
forwards a stored block to MQTT 5 subscribers unchanged: the MQTT path never converts to or from `Properties`.
Message expiry is not in the block (the record keeps the deadline, `expires_at_ms`), nor are topic alias and
subscription identifiers (they depend on the receiver); a reader skips them should a block hold them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PAYLOAD_FORMAT = 0x01
MESSAGE_EXPIRY = 0x02  # skipped when read
CONTENT_TYPE = 0x03
RESPONSE_TOPIC = 0x08
CORRELATION_DATA = 0x09
SUBSCRIPTION_ID = 0x0B  # skipped when read (a variable byte integer)
TOPIC_ALIAS = 0x23  # skipped when read
USER_PROPERTY = 0x26
_MAX_FIELD = 0xFFFF


def _field(raw: bytes) -> bytes:
    if len(raw) > _MAX_FIELD:
        raise ValueError("a property longer than 65535 bytes")
    return len(raw).to_bytes(2, "big") + raw


def _text(data: bytes, pos: int) -> tuple[str, int]:
    stop = pos + 2 + ((data[pos] << 8) | data[pos + 1])
    if stop > len(data):
        raise ValueError("property runs past the block")
    text = data[pos + 2 : stop].decode()
    if "\x00" in text:
        raise ValueError("U+0000 in a string property")
    return text, stop


@dataclass(slots=True)
class Properties:
    """Application properties every protocol can carry (see the module)."""

    content_type: str | None = None
    correlation_data: bytes | None = None
    response_topic: str | None = None
    user: list[tuple[str, str]] = field(default_factory=list)
    utf8_payload: bool = False  # MQTT payload format indicator 1
    expiry_interval: int | None = None  # seconds; the store keeps the deadline, not this

    def to_block(self) -> bytes:
        """The stored block (no message expiry: the message carries its deadline)."""
        if (self.content_type is None and self.correlation_data is None and self.response_topic is None
                and not self.user and not self.utf8_payload):
            return b""
        out = bytearray()
        if self.utf8_payload:
            out += b"\x01\x01"
        if self.content_type is not None:
            out.append(CONTENT_TYPE)
            out += _field(self.content_type.encode())
        if self.response_topic is not None:
            out.append(RESPONSE_TOPIC)
            out += _field(self.response_topic.encode())
        if self.correlation_data is not None:
            out.append(CORRELATION_DATA)
            out += _field(self.correlation_data)
        for name, value in self.user:
            out.append(USER_PROPERTY)
            out += _field(name.encode())
            out += _field(value.encode())
        return bytes(out)

    @classmethod
    def from_block(cls, block: bytes, expires_at_ms: int = 0, now_ms: int = 0) -> Properties:
        """Decode a stored block; `expiry_interval` is what is left of the deadline at `now_ms`. A block that does
        not decode (never written by this gateway) gives no properties: a delivery never fails on it."""
        props = cls()
        if expires_at_ms and now_ms:
            props.expiry_interval = max(1, (expires_at_ms - now_ms + 999) // 1000)
        if not block:
            return props
        try:
            _decode(bytes(block), props)
        except (IndexError, ValueError):  # UnicodeDecodeError is a ValueError
            return cls(expiry_interval=props.expiry_interval)
        return props


def _decode(data: bytes, props: Properties) -> None:
    pos, end = 0, len(data)
    seen = 0  # bit per single property read so far: one given twice is not a block this gateway wrote
    while pos < end:
        pid = data[pos]
        pos += 1
        if pid == USER_PROPERTY:
            name, pos = _text(data, pos)
            value, pos = _text(data, pos)
            props.user.append((name, value))
            continue
        if pid == SUBSCRIPTION_ID:  # repeatable, variable byte integer
            for _ in range(4):
                pos += 1
                if data[pos - 1] < 0x80:
                    break
            else:
                raise ValueError("variable byte integer longer than 4 bytes")
            continue
        bit = 1 << (pid & 0x3F)
        if seen & bit:
            raise ValueError(f"property 0x{pid:02X} given twice")
        seen |= bit
        if pid == PAYLOAD_FORMAT:
            props.utf8_payload = data[pos] == 1
            pos += 1
        elif pid == CONTENT_TYPE:
            props.content_type, pos = _text(data, pos)
        elif pid == RESPONSE_TOPIC:
            props.response_topic, pos = _text(data, pos)
        elif pid == CORRELATION_DATA:
            stop = pos + 2 + ((data[pos] << 8) | data[pos + 1])
            if stop > end:
                raise ValueError("property runs past the block")
            props.correlation_data = data[pos + 2 : stop]
            pos = stop
        elif pid == MESSAGE_EXPIRY:
            pos += 4
        elif pid == TOPIC_ALIAS:
            pos += 2
        else:
            raise ValueError(f"unknown property 0x{pid:02X}")
    if pos > end:
        raise ValueError("property runs past the block")
