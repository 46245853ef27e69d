"""Key layout and value codecs of the embedded store's metadata database (`store.embedded.meta.store`, RocksDB).

One keyspace, ordered bytewise; the first byte names the namespace:

    S <client id>                    -> session record (binary, below; legacy JSON also read)
    O <client id>                    -> offsets (<qq offset, sent_upto): newer than the record's own
    N <client id>                    -> b""  the session is online (disconnected_at_ms == 0)
    X <u64 BE deadline> <client id>  -> b""  expiry index (finite expiry, disconnected)
    F <topic filter>                 -> <q   stored sessions subscribed to a counted filter (`counted_filter`)
    M <u32 BE len> <$share key> <id> -> b""  stored sessions subscribed to a shared subscription
    M <u32 BE len> 0x01 <topic> <id> -> b""  stored sessions subscribed to exactly that topic (`Store.subscribed`)
    R <topic>                        -> retained message (store.records message body)
    W <client id>                    -> will (store.records.encode_will)
    G <u8 namespace> <key>           -> consumer-group record (store.groups), value as GroupTable wrote it
    B <kind> 0x00 <who>              -> ban (store.base.encode_ban, JSON)
    C <name>                         -> <q   counters: sessions, retained (+ bytes), wills, high_seq (COUNTERS)
    D >I len(scope) <scope> <id>     -> <q   the seq holding a de-duplication key (store.base.Message.dedupe)
    V <name>                         -> <q version> <value>   a versioned document (`Store.put_document`)

Strings are UTF-8. Every index entry is written in the same WriteBatch as the record it derives from.

Session record, binary (little-endian):

    u8 format = 1, u8 protocol_level, u32 expiry_interval, i64 offset, i64 sent_upto, i64 disconnected_at_ms,
    i64 epoch, u32 n_subs, u32 n_inbound_qos2, u32 n_outbound_pubrel, u32 len(owner)
    owner, u32 x n_inbound_qos2, u32 x n_outbound_pubrel, then per subscription:
    u32 len(key), u8 qos, u8 flags (bit 0 no_local, bit 1 retain_as_published, bits 2-3 retain_handling,
    bit 7 the filter differs from the key), u32 subscription_id, i64 since_seq, key [, u32 len, filter],
    then, if any outbound QoS 2 message is in flight: u32 n, n x (u32 packet id, i64 seq)

A record written by `store.records.encode_session` (JSON, starts with "{") decodes too (legacy import).
"""

from __future__ import annotations

from struct import Struct
from struct import error as StructError

from tidewire.store.base import (
    EXACT_MARK,
    SHARED_PREFIX,
    SessionRecord,
    SubscriptionRecord,
    counted_filter,
    expiry_deadline,
)
from tidewire.store.records import decode_session

SESSION = b"S"
OFFSETS = b"O"
ONLINE = b"N"
EXPIRY = b"X"
FILTER = b"F"
MEMBER = b"M"
RETAINED = b"R"
WILL = b"W"
GROUP = b"G"
COUNTER = b"C"
BAN = b"B"
DOCUMENT = b"V"  # V name -> <q version> value (`Store.put_document`)
DEDUPE = b"D"  # D u32 len(scope) scope id -> the seq of the message holding the key (`Message.dedupe`)

COUNTERS = ("sessions", "retained", "retained_bytes", "wills", "high_seq")

OFFSETS_VALUE = Struct("<qq")
COUNT = Struct("<q")
_DEADLINE = Struct(">Q")
_MEMBER_LEN = Struct(">I")

_FORMAT = 1
_HEAD = Struct("<BBIqqqqIIII")
_HEAD_SIZE = _HEAD.size
_SUB = Struct("<IBBIq")
_SUB_SIZE = _SUB.size
_U32 = Struct("<I")
_PID_SEQ = Struct("<Iq")  # an outbound QoS 2 packet id and the seq it carries
_FILTER_DIFFERS = 0x80


def prefix_end(prefix: bytes) -> bytes:
    """The smallest key above every key starting with `prefix` (an iterator's upper bound)."""
    p = bytearray(prefix)
    while p and p[-1] == 0xFF:
        p.pop()
    if not p:
        return b"\xff" * (len(prefix) + 1)
    p[-1] += 1
    return bytes(p)


def session_key(client_id: str) -> bytes:
    return SESSION + client_id.encode()


def offsets_key(client_id: str) -> bytes:
    return OFFSETS + client_id.encode()


def online_key(client_id: str) -> bytes:
    return ONLINE + client_id.encode()


def expiry_key(deadline_ms: int, client_id: str) -> bytes:
    return EXPIRY + _DEADLINE.pack(max(0, deadline_ms)) + client_id.encode()


def expiry_parts(key: bytes) -> tuple[int, str]:
    (deadline,) = _DEADLINE.unpack_from(key, 1)
    return deadline, key[9:].decode()


def filter_key(topic_filter: str) -> bytes:
    return FILTER + topic_filter.encode()


def member_prefix(group_key: str) -> bytes:
    g = group_key.encode()
    return MEMBER + _MEMBER_LEN.pack(len(g)) + g


def member_key(group_key: str, client_id: str) -> bytes:
    return member_prefix(group_key) + client_id.encode()


def retained_key(topic: str) -> bytes:
    return RETAINED + topic.encode()


def will_key(client_id: str) -> bytes:
    return WILL + client_id.encode()


def group_key(ns: int, key: str) -> bytes:
    return GROUP + bytes((ns,)) + key.encode()


def document_key(name: str) -> bytes:
    return DOCUMENT + name.encode()


def ban_key(kind: str, who: str) -> bytes:
    return BAN + kind.encode() + b"\x00" + who.encode()


def dedupe_prefix(scope: str) -> bytes:
    raw = scope.encode()
    return DEDUPE + _MEMBER_LEN.pack(len(raw)) + raw  # length first: no scope's prefix is another's


def dedupe_key(scope: str, key_id: str) -> bytes:
    return dedupe_prefix(scope) + key_id.encode()


def counter_key(name: str) -> bytes:
    return COUNTER + name.encode()


def index_keys(record: SessionRecord) -> set[bytes]:
    """Every index entry (value b"") derived from a stored session record."""
    cid = record.client_id
    keys: set[bytes] = set()
    if record.disconnected_at_ms == 0:
        keys.add(online_key(cid))
    deadline = expiry_deadline(record)
    if deadline is not None:
        keys.add(expiry_key(deadline, cid))
    for key in record.subscriptions:
        if key.startswith(SHARED_PREFIX):
            keys.add(member_key(key, cid))
        elif not counted_filter(key) and not cid.startswith(SHARED_PREFIX):
            keys.add(member_key(EXACT_MARK + key, cid))
    return keys


def counted_filters(record: SessionRecord | None) -> set[str]:
    if record is None:
        return set()
    return {k for k in record.subscriptions if counted_filter(k)}


# --- session codec ------------------------------------------------------------------------------------------


def encode_session(r: SessionRecord) -> bytes:
    owner = r.owner.encode()
    parts = [
        _HEAD.pack(_FORMAT, r.protocol_level, r.expiry_interval, r.offset, r.sent_upto, r.disconnected_at_ms,
                   r.epoch, len(r.subscriptions), len(r.inbound_qos2), len(r.outbound_pubrel), len(owner)),
        owner,
    ]
    if r.inbound_qos2:
        parts.append(Struct(f"<{len(r.inbound_qos2)}I").pack(*r.inbound_qos2))
    if r.outbound_pubrel:
        parts.append(Struct(f"<{len(r.outbound_pubrel)}I").pack(*r.outbound_pubrel))
    sub_pack = _SUB.pack
    for key, s in r.subscriptions.items():
        k = key.encode()
        flags = (1 if s.no_local else 0) | (2 if s.retain_as_published else 0) | ((s.retain_handling & 3) << 2)
        differs = s.filter != key
        if differs:
            flags |= _FILTER_DIFFERS
        parts.append(sub_pack(len(k), s.qos, flags, s.subscription_id, s.since_seq))
        parts.append(k)
        if differs:
            f = s.filter.encode()
            parts.append(_U32.pack(len(f)))
            parts.append(f)
    if r.outbound_qos2:  # an optional tail: records written before it have none
        parts.append(_U32.pack(len(r.outbound_qos2)))
        parts += [_PID_SEQ.pack(pid, seq) for pid, seq in r.outbound_qos2.items()]
    return b"".join(parts)


def decode_session_value(client_id: str, value: bytes) -> SessionRecord:
    """A stored session record (binary, or legacy JSON). `ValueError` for bytes that are neither."""
    try:
        return _decode_session(client_id, value)
    except (StructError, TypeError, KeyError) as exc:
        raise ValueError(f"undecodable session record: {exc}") from exc


def _decode_session(client_id: str, value: bytes) -> SessionRecord:
    if value[:1] == b"{":
        return decode_session(value)
    if value[:1] != bytes((_FORMAT,)) or len(value) < _HEAD_SIZE:
        raise ValueError(f"session record of an unknown format ({value[:1].hex()})")
    (_, level, expiry, offset, sent_upto, disconnected, epoch, nsubs, nin, nout, lowner) = _HEAD.unpack_from(value)
    p = _HEAD_SIZE
    owner = value[p : p + lowner].decode()
    p += lowner
    inbound = list(Struct(f"<{nin}I").unpack_from(value, p)) if nin else []
    p += 4 * nin
    outbound = list(Struct(f"<{nout}I").unpack_from(value, p)) if nout else []
    p += 4 * nout
    subs: dict[str, SubscriptionRecord] = {}
    sub_unpack = _SUB.unpack_from
    for _ in range(nsubs):
        lkey, qos, flags, sub_id, since = sub_unpack(value, p)
        p += _SUB_SIZE
        key = value[p : p + lkey].decode()
        p += lkey
        topic_filter = key
        if flags & _FILTER_DIFFERS:
            (lf,) = _U32.unpack_from(value, p)
            topic_filter = value[p + 4 : p + 4 + lf].decode()
            p += 4 + lf
        subs[key] = SubscriptionRecord(topic_filter, qos, bool(flags & 1), bool(flags & 2), (flags >> 2) & 3,
                                       sub_id, since)
    outbound_qos2: dict[int, int] = {}
    if p < len(value):
        (n,) = _U32.unpack_from(value, p)
        p += 4
        for _ in range(n):
            pid, seq = _PID_SEQ.unpack_from(value, p)
            outbound_qos2[pid] = seq
            p += _PID_SEQ.size
    if p != len(value):
        raise ValueError("session record length does not match its contents")
    return SessionRecord(client_id, level, expiry, subs, offset, sent_upto, inbound, outbound, outbound_qos2,
                         disconnected, owner, epoch)


def session_epoch(value: bytes) -> int:
    """The epoch of a stored record without decoding the rest (fencing checks)."""
    if value[:1] == b"{":
        return decode_session(value).epoch
    return int(_HEAD.unpack_from(value)[6])
