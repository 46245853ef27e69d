"""Binary codecs of the stores: the frame (len + crc + body) and the versioned message record (the body).

Both the embedded commit log and its KV file use the same frame; the message body is also the value of retained
keys and wills, and the value of the Redis engine's message hashes. Readers outside the store (the lake bridge)
see records only through `store.log_reader`, never these bytes.

Frame (embedded files only), little-endian:

    offset  size  field
    0       4     u32 body length (bodies over MAX_RECORD are corruption)
    4       4     u32 crc32 (zlib) of the body
    8       n     body

Message record, format version 1 (what `encode_message_body` writes), little-endian, no padding:

    offset  size  field
    0       7     magic  54 57 4C 4F 47 00 FF  ("TWLOG\\0" then 0xFF)
    7       1     u8  format version = 1
    8       8     i64 seq (the log sequence number; -1: not appended, e.g. a will; 0 in the Redis hash, whose
                  field name is the seq)
    16      8     i64 timestamp_ms (received time, ms since the Unix epoch)
    24      8     i64 expires_at_ms (0: never)
    32      1     u8  qos (0..2)
    33      1     u8  flags: bit 0 retain; bits 1..7 reserved (written 0, ignored on read)
    34      1     u8  protocol it came in by: 0 MQTT, 1 AMQP, 2 RocketMQ, 3 bridge (store.base.PROTOCOL_*)
    35      2     u16 len(publisher)
    37      2     u16 len(topic)
    39      4     u32 len(properties)
    43      4     u32 len(payload)
    47      2     u16 number of queues
    49      4     u32 len(queues)
    53      ...   publisher (utf-8: the publishing client id, "" for internal messages), topic (utf-8),
                  properties, payload, queues (utf-8 names joined by NUL: NUL cannot occur in a topic or a
                  filter), each exactly as long as its length field says

`properties` is the neutral property encoding defined in `store.properties` (identifier byte, value; repeated:
the content of an MQTT 5 property block without its length prefix), as `Properties.to_block` writes it and
`Properties.from_block` reads it. It never holds message expiry, topic alias or subscription identifiers (the
deadline is `expires_at_ms`; the others depend on the receiver).

Every later version keeps bytes 0..23 (magic, version, seq, timestamp_ms), so a build that meets a newer record
still knows where it sits in the log: recovery keeps such a record in place (it is never cut: the log is not
torn there, it is newer) and indexes it into no queue, logging an error; decoding it raises `UnsupportedRecord`
(a `ValueError`, not a `CorruptRecord`), so a log reader stops there loudly instead of skipping it.

Legacy records (version 0: every body written before this format) have no magic; they are the v1 layout
without bytes 0..7 and without the protocol byte (flags is just retain 0/1), and decode as protocol MQTT. They
start with their i64 seq, which is in [-1, 2**53): for seq >= 0 its byte 6 is <= 0x1F, never the magic's
0xFF, and seq -1 is FF x 8, never the magic's first bytes. So the first 7 bytes tell the versions apart.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterator
from dataclasses import asdict
from struct import Struct
from struct import error as StructError

from tidewire.errors import CorruptData
from tidewire.store.base import PROTOCOL_MQTT, Message, SessionRecord, SubscriptionRecord, WillRecord

# u32 body length, u32 crc32 of the body
FRAME = Struct("<II")
FRAME_SIZE = FRAME.size
# A length past this is treated as corruption rather than attempting a huge read.
MAX_RECORD = 1 << 30

MAGIC = b"TWLOG\x00\xff"
FORMAT_VERSION = 1
_HEAD_V1 = MAGIC + bytes((FORMAT_VERSION,))
# The part every version keeps: magic, version, seq, timestamp_ms.
_STABLE = Struct("<7sBqq")
STABLE_PREFIX_SIZE = _STABLE.size
# v1 header (see the table above): magic and version are its first field, checked after one unpack.
MSG_HEADER = Struct("<8sqqqBBBHHIIHI")
MSG_HEADER_SIZE = MSG_HEADER.size
# v0 (legacy) header: seq, timestamp_ms, expires_at_ms, qos, retain, then the same lengths.
LEGACY_HEADER = Struct("<qqqBBHHIIHI")
LEGACY_HEADER_SIZE = LEGACY_HEADER.size
_FLAG_RETAIN = 1

_crc32 = zlib.crc32
_frame_pack = FRAME.pack
_header_pack = MSG_HEADER.pack
_header_unpack_from = MSG_HEADER.unpack_from
_v0_unpack_from = LEGACY_HEADER.unpack_from


class CorruptRecord(CorruptData):
    """A frame whose length or crc does not check out (usually a torn write)."""


class UnsupportedRecord(CorruptData):
    """A well-formed record of a format version this build does not know (written by a newer one).

    `version`, `seq` and `timestamp_ms` come from the prefix every version keeps; `seq` is -1 when the record
    is too short to hold it."""

    def __init__(self, version: int, seq: int, timestamp_ms: int) -> None:
        super().__init__(f"message record format version {version} is not supported by this build "
                         f"(it reads versions 0..{FORMAT_VERSION}); seq {seq}")
        self.version = version
        self.seq = seq
        self.timestamp_ms = timestamp_ms


def _unsupported(buf: bytes | memoryview, start: int) -> UnsupportedRecord:
    if len(buf) - start < STABLE_PREFIX_SIZE:
        return UnsupportedRecord(buf[start + 7] if len(buf) - start > 7 else -1, -1, 0)
    _, version, seq, ts = _STABLE.unpack_from(buf, start)
    return UnsupportedRecord(version, seq, ts)


def encode_message_body(msg: Message, seq: int) -> bytes:
    """The v1 record for `msg` with the given seq (the caller decides when `msg.seq` is committed)."""
    pub = msg.publisher.encode()
    topic = msg.topic.encode()
    queues = msg.queues
    qbytes = "\x00".join(queues).encode() if queues else b""
    header = _header_pack(
        _HEAD_V1, seq, msg.timestamp_ms, msg.expires_at_ms, msg.qos, _FLAG_RETAIN if msg.retain else 0,
        msg.protocol, len(pub), len(topic), len(msg.properties), len(msg.payload), len(queues), len(qbytes),
    )
    return b"".join((header, pub, topic, msg.properties, msg.payload, qbytes))


def frame(body: bytes) -> bytes:
    return _frame_pack(len(body), _crc32(body)) + body


def frame_parts(body: bytes) -> tuple[bytes, bytes]:
    """Frame header and body as two parts, so a batch is joined once instead of concatenating per record."""
    return _frame_pack(len(body), _crc32(body)), body


def decode_message_body(buf: bytes, start: int = 0) -> Message:
    """Decode a record of any supported version (v1, legacy v0 as MQTT); `UnsupportedRecord` for a newer one."""
    try:
        (head, seq, ts, exp, qos, flags, proto, lpub, ltopic, lprops, lpay, nq, lq) = _header_unpack_from(buf, start)
    except StructError:  # shorter than a v1 header: only a small legacy record can be
        head = None
    if head != _HEAD_V1:
        return _decode_other(buf, start)
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
    if proto:
        return Message(topic, payload, qos, flags & _FLAG_RETAIN != 0, props, ts, exp, publisher, queues, seq, proto)
    # the default protocol is MQTT: most records skip an argument (measurably cheaper)
    return Message(topic, payload, qos, flags & _FLAG_RETAIN != 0, props, ts, exp, publisher, queues, seq)


def _decode_other(buf: bytes, start: int) -> Message:
    if buf[start : start + 7] == MAGIC:
        raise _unsupported(buf, start)
    (seq, ts, exp, qos, retain, lpub, ltopic, lprops, lpay, nq, lq) = _v0_unpack_from(buf, start)
    p = start + LEGACY_HEADER_SIZE
    publisher = buf[p : p + lpub].decode()
    p += lpub
    topic = buf[p : p + ltopic].decode()
    p += ltopic
    props = buf[p : p + lprops]
    p += lprops
    payload = buf[p : p + lpay]
    p += lpay
    queues: tuple[str, ...] = tuple(buf[p : p + lq].decode().split("\x00")) if nq else ()
    return Message(topic, payload, qos, retain != 0, props, ts, exp, publisher, queues, seq, PROTOCOL_MQTT)


def peek_message(buf: bytes | memoryview, start: int) -> tuple[int, int, tuple[str, ...]]:
    """(seq, timestamp_ms, queues) of a body without decoding topic or payload (recovery scan).

    `UnsupportedRecord` (with the seq and time of the stable prefix) for a version newer than this build."""
    try:
        (head, seq, ts, _exp, _qos, _fl, _pr, lpub, ltopic, lprops, lpay, nq, lq) = _header_unpack_from(buf, start)
    except StructError:
        head = None
    if head == _HEAD_V1:
        p = start + MSG_HEADER_SIZE
    elif buf[start : start + 7] != MAGIC:
        (seq, ts, _exp, _qos, _ret, lpub, ltopic, lprops, lpay, nq, lq) = _v0_unpack_from(buf, start)
        p = start + LEGACY_HEADER_SIZE
    else:
        raise _unsupported(buf, start)
    if not nq:
        return seq, ts, ()
    p += lpub + ltopic + lprops + lpay
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
    d["outbound_qos2"] = {int(pid): seq for pid, seq in d.get("outbound_qos2", {}).items()}  # JSON keys: strings
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
