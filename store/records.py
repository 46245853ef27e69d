"""Binary codecs of the embedded store: the framed record (len + crc + body) and the message body.

Both the commit log and the KV file use the same frame; the message body is also the value of retained keys.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterator
from dataclasses import asdict
from struct import Struct

from store.base import Message, SessionRecord, SubscriptionRecord, WillRecord

# u32 body length, u32 crc32 of the body
FRAME = Struct("<II")
FRAME_SIZE = FRAME.size
# A length past this is treated as corruption rather than attempting a huge read.
MAX_RECORD = 1 << 30

# seq, timestamp_ms, expires_at_ms, qos, retain, len(publisher), len(topic), len(properties), len(payload),
# number of queues, len(queues joined by NUL). NUL cannot occur in MQTT topics, so it is a safe separator.
MSG_HEADER = Struct("<qqqBBHHIIHI")
MSG_HEADER_SIZE = MSG_HEADER.size

_crc32 = zlib.crc32
_frame_pack = FRAME.pack
_header_pack = MSG_HEADER.pack
_header_unpack_from = MSG_HEADER.unpack_from


class CorruptRecord(ValueError):
    """A frame whose length or crc does not check out (usually a torn write)."""


def encode_message_body(msg: Message, seq: int) -> bytes:
    """The message body for `msg` with the given seq (the caller decides when `msg.seq` is committed)."""
    pub = msg.publisher.encode()
    topic = msg.topic.encode()
    queues = msg.queues
    qbytes = "\x00".join(queues).encode() if queues else b""
    header = _header_pack(
        seq, msg.timestamp_ms, msg.expires_at_ms, msg.qos, 1 if msg.retain else 0,
        len(pub), len(topic), len(msg.properties), len(msg.payload), len(queues), len(qbytes),
    )
    return b"".join((header, pub, topic, msg.properties, msg.payload, qbytes))


def frame(body: bytes) -> bytes:
    return _frame_pack(len(body), _crc32(body)) + body


def frame_parts(body: bytes) -> tuple[bytes, bytes]:
    """Frame header and body as two parts, so a batch is joined once instead of concatenating per record."""
    return _frame_pack(len(body), _crc32(body)), body


def decode_message_body(buf: bytes, start: int = 0) -> Message:
    (seq, ts, exp, qos, retain, lpub, ltopic, lprops, lpay, nq, lq) = _header_unpack_from(buf, start)
    p = start + MSG_HEADER_SIZE
    # plain bytes slicing: cheaper than memoryview for the small fields of a typical message
    publisher = buf[p : p + lpub].decode()
    p += lpub
    topic = buf[p : p + ltopic].decode()
    p += ltopic
    props = buf[p : p + lprops]
    p += lprops
    payload = buf[p : p + lpay]
    p += lpay
    queues: tuple[str, ...] = tuple(buf[p : p + lq].decode().split("\x00")) if nq else ()
    return Message(topic, payload, qos, retain != 0, props, ts, exp, publisher, queues, seq)


def peek_message(buf: bytes | memoryview, start: int) -> tuple[int, int, tuple[str, ...]]:
    """(seq, timestamp_ms, queues) of a body without decoding topic or payload (recovery scan)."""
    (seq, ts, _exp, _qos, _ret, lpub, ltopic, lprops, lpay, nq, lq) = _header_unpack_from(buf, start)
    if not nq:
        return seq, ts, ()
    p = start + MSG_HEADER_SIZE + lpub + ltopic + lprops + lpay
    return seq, ts, tuple(str(memoryview(buf)[p : p + lq], "utf-8").split("\x00"))


def iter_frames(buf: bytes | memoryview, start: int = 0) -> Iterator[tuple[int, int, int]]:
    """Yield (pos, body_start, body_end) of each valid frame; raise CorruptRecord at the first bad one.

    `CorruptRecord.args[1]` is the position of the bad frame, so the caller can cut the file there."""
    end = len(buf)
    pos = start
    while pos < end:
        if end - pos < FRAME_SIZE:
            raise CorruptRecord("short frame header", pos)
        length, crc = FRAME.unpack_from(buf, pos)
        body_start = pos + FRAME_SIZE
        body_end = body_start + length
        if length > MAX_RECORD or body_end > end:
            raise CorruptRecord("length past end of file", pos)
        if _crc32(memoryview(buf)[body_start:body_end]) != crc:
            raise CorruptRecord("crc mismatch", pos)
        yield pos, body_start, body_end
        pos = body_end


def check_frame(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    """Verify one frame at `pos` of `buf` (a pread of a known record); return (body_start, body_end)."""
    length, crc = FRAME.unpack_from(buf, pos)
    body_start = pos + FRAME_SIZE
    body_end = body_start + length
    if body_end > len(buf) or _crc32(memoryview(buf)[body_start:body_end]) != crc:
        raise CorruptRecord("crc mismatch on read", pos)
    return body_start, body_end


# --- KV values ----------------------------------------------------------------------------------------------

OFFSETS = Struct("<qq")
_WILL_HEADER = Struct("<I")


def encode_session(record: SessionRecord) -> bytes:
    return json.dumps(asdict(record), separators=(",", ":")).encode()


def decode_session(value: bytes | memoryview) -> SessionRecord:
    d = json.loads(bytes(value))
    subs = {k: SubscriptionRecord(**v) for k, v in d.pop("subscriptions").items()}
    return SessionRecord(subscriptions=subs, **d)


def encode_will(will: WillRecord) -> bytes:
    head = json.dumps({"client_id": will.client_id, "delay_interval": will.delay_interval,
                       "owner": will.owner}).encode()
    return _WILL_HEADER.pack(len(head)) + head + encode_message_body(will.message, will.message.seq)


def decode_will(value: bytes) -> WillRecord:
    (n,) = _WILL_HEADER.unpack_from(value, 0)
    head = json.loads(value[4 : 4 + n])
    return WillRecord(
        client_id=head["client_id"], delay_interval=head["delay_interval"], owner=head.get("owner", ""),
        message=decode_message_body(value, 4 + n),
    )
