"""The Redis store engine's records under the meta hash tag `{prefix}`: sessions (fenced by epochs), offsets,
retained messages (indexed by first level), wills, and the cluster-wide wildcard set.

Layout (every key under `{prefix}`, so each multi-key script is valid on Redis Cluster):

    :sess   hash  client id -> session JSON          :off   hash  client id -> packed (offset, sent_upto)
    :ep     hash  client id -> epoch (a record's, or a tombstone's: see Epochs)
    :own    hash  client id -> owner node id         :will  hash  client id -> encoded will
    :ret    hash  topic -> retained body;  :rl  set of first levels;  :rb:<level>  set of retained topics
    :on     set   client ids of sessions online       :exp   zset  client id by expiry deadline (ms, offline only)
    :sf     hash  client id -> its counted filters and marked exact topics (`indexed_filter`, NUL-joined)
    :flt    hash  counted filter -> how many sessions hold it (what `subscription_filters` answers)
    :shm:<$share/...>  set of the client ids holding that filter;  :shm:\x01<topic>  ... subscribed to exactly it
    :tomb   zset  client id without a record -> server ms since when;  :epc  the last claim number;
    :epf    the epoch floor
    :idx    the index version the sessions are indexed for (built once at open when lower, a page at a time)
    :wc     hash  wildcard filter -> holders;  :wv  the wildcard set version (copied into each partition)
    :lease:<key>  hash  {owner, until (server ms), epoch}: one holder at a time (a bridge's node)
    :ban    hash  <kind> 0x00 <who> -> ban JSON (`store.base.encode_ban`)
    :doc:<name> hash  v -> version, d -> value (`Store.put_document`)

A session record's `epoch` and `owner` come from `:ep` / `:own` (the JSON keeps what the last put carried), so
a claim changes them without rewriting the record. Offsets set after the last put live in `:off` and win over
the record's own. Every call here is one script or one command: one round trip; the calls that read many
sessions or members go a page (`PAGE`) at a time, so no command's time grows with the number of sessions.

**Indexes.** Every put and delete keeps `:on`, `:exp`, `:sf`/`:flt` and `:shm:` in the same script, so
a starting node reads what is online, what is due, and the filter counts (O(filters)), never every session.
A store written by an earlier build is indexed at `open` (`index_sessions`): a page of sessions read, then one
script per page that indexes each session whose body is still the one read (a changed one was indexed by its
put) and counts its filters only if it has no `:sf` entry yet, so nodes starting at once, and writers of this
build meanwhile, never count a session twice. Nodes of an earlier build that still write sessions after that do
not maintain the new indexes: upgrade every node (the index is built once, by the first node of this build).

**Epochs.** A claim takes the next claim number (`:epc`, above the client's stored epoch and the floor), so
every new claim of a client exceeds every earlier one, whatever was deleted in between. The epoch of a client
id with a record stays in `:ep`; a client id without one (deleted, or claimed and not yet written) keeps its
epoch as a tombstone for `epoch_ttl`, and after that it goes (a few with each claim and delete), raising the
floor `:epf` to its epoch. A put for a client id with no epoch entry is refused below the floor. So a stale
writer (a node that lost the client: its epoch is below the client's latest claim) stays fenced off: while the
tombstone lives by the entry, after it by the floor, which is at least the entry's epoch. The cost: a put
whose claim is older than `epoch_ttl` and that found no record (a new session not written for that long) is
refused like a stale one. `:ep` holds the stored sessions plus the client ids seen within `epoch_ttl`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any, cast

from tidewire.store.base import (
    SHARED_PREFIX,
    Ban,
    Message,
    SessionRecord,
    WillRecord,
    decode_ban,
    encode_ban,
    expiry_deadline,
    indexed_filter,
)
from tidewire.store.records import (
    OFFSETS,
    decode_message_body,
    decode_session,
    decode_will,
    encode_message_body,
    encode_session,
    encode_will,
)
from tidewire.store.redis.conn import RedisConn, Script
from tidewire.store.redis.scripts import (
    LEASE,
    MATCH_RETAINED,
    META_STATS,
    RELEASE,
    SET_RETAINED,
    WILDCARDS_CHANGE,
    WILDCARDS_GET,
    WILDCARDS_RELEASE,
)
from tidewire.store.redis.session_scripts import (
    CLAIM_SESSION,
    DELETE_SESSION,
    GET_SESSION,
    GET_SESSIONS,
    INDEX_SESSIONS,
    LIST_SESSIONS,
    PUT_SESSION,
    SET_OFFSETS,
    TOMBSTONE_EPOCHS,
)

_GET = Script("get_session", GET_SESSION)
_CLAIM = Script("claim_session", CLAIM_SESSION)
_PUT = Script("put_session", PUT_SESSION)
_DELETE = Script("delete_session", DELETE_SESSION)
_LIST = Script("list_sessions", LIST_SESSIONS)
_GET_MANY = Script("get_sessions", GET_SESSIONS)
_INDEX = Script("index_sessions", INDEX_SESSIONS)
_TOMBSTONE = Script("tombstone_epochs", TOMBSTONE_EPOCHS)
_OFFSETS = Script("set_offsets", SET_OFFSETS)
_SET_RETAINED = Script("set_retained", SET_RETAINED)
_MATCH = Script("match_retained", MATCH_RETAINED)
_WILDCARDS_CHANGE = Script("wildcards_change", WILDCARDS_CHANGE)
_WILDCARDS_GET = Script("wildcards_get", WILDCARDS_GET)
_WILDCARDS_RELEASE = Script("wildcards_release", WILDCARDS_RELEASE)
_STATS = Script("meta_stats", META_STATS)
_LEASE = Script("lease", LEASE)
_RELEASE = Script("release", RELEASE)
# KEYS: 1 counted filter -> sessions. ARGV: 1 members key prefix, 2.. indexed filter names (`indexed_filter`).
_SUBSCRIBED = Script("subscribed", """
for i = 2, #ARGV do
  local f = ARGV[i]
  if string.byte(f, 1) == 1 then
    if redis.call('EXISTS', ARGV[1] .. f) == 1 then return 1 end
  elseif redis.call('HEXISTS', KEYS[1], f) == 1 then
    return 1
  end
end
return 0
""")
# Delete a ban only if it lapsed by ARGV[2] (epoch s): a ban renewed since it was read stays.
_DELETE_LAPSED_BAN = Script("delete_lapsed_ban", """
local v = redis.call('HGET', KEYS[1], ARGV[1])
if not v then return 0 end
local ok, ban = pcall(cjson.decode, v)
if not ok or type(ban) ~= 'table' or type(ban['until']) ~= 'number' or ban['until'] > tonumber(ARGV[2]) then
  return 0
end
return redis.call('HDEL', KEYS[1], ARGV[1])
""")

# Compare-and-set of a versioned document. ARGV: 1 expected version, 2 value. The new version, or 0 on a conflict; a
# resend of a put that landed (version expected + 1 holding this very value) answers that version again.
_PUT_DOCUMENT = Script("put_document", """
local cur = tonumber(redis.call('HGET', KEYS[1], 'v') or '0')
local expected = tonumber(ARGV[1])
if cur == expected + 1 and redis.call('HGET', KEYS[1], 'd') == ARGV[2] then return cur end
if cur ~= expected then return 0 end
redis.call('HSET', KEYS[1], 'v', expected + 1, 'd', ARGV[2])
return expected + 1
""")

def _text(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v


def _session(body: bytes, offsets: bytes | None, epoch: int, owner: bytes | None) -> SessionRecord:
    rec = decode_session(body)
    if offsets is not None:
        rec.offset, rec.sent_upto = OFFSETS.unpack(offsets)
    rec.epoch = max(rec.epoch, int(epoch))
    if owner is not None:
        rec.owner = _text(owner)
    return rec


PAGE = 1000  # sessions, members or filters per command when reading many (one command's time stays bounded)
INDEX_PAGE = 250  # sessions indexed per script when indexing a store of an earlier build (~7 commands each)
EPOCH_TTL = 3600.0  # s a client id without a record keeps its epoch (see Epochs)
PRUNE = 16  # tombstones past their time to live removed by one claim or delete at most
INDEX_VERSION = 2  # 1: :on and :exp (the `sessidx` flag of earlier builds); 2: filters, members, tombstones


def _counted(record: SessionRecord) -> str:
    """The record's filters `subscription_filters` counts and its exact topics (marked, `indexed_filter`: kept
    as members, for `subscribed`), NUL-joined in a stable order ('' for a group)."""
    if record.client_id.startswith(SHARED_PREFIX):
        return ""
    return "\0".join(sorted(name for f in record.subscriptions if (name := indexed_filter(f)) is not None))


def _index_score(record: SessionRecord) -> int:
    """The session's place in the indexes: -1 online, its expiry deadline (ms), or -2 (never expires; a group)."""
    if record.client_id.startswith(SHARED_PREFIX):
        return -2
    if record.disconnected_at_ms == 0:
        return -1
    deadline = expiry_deadline(record)
    return -2 if deadline is None else deadline


class RedisMeta:
    def __init__(self, conn: RedisConn, prefix: str, epoch_ttl: float = EPOCH_TTL) -> None:
        if epoch_ttl <= 0:
            raise ValueError("epoch_ttl must be > 0")
        k = f"{{{prefix}}}:"
        self._conn = conn
        self.k_parts = k + "parts"  # the partition count the data was written with
        self._sess_keys = [k + "sess", k + "off", k + "ep", k + "own", k + "on", k + "exp", k + "sf", k + "flt",
                           k + "tomb", k + "epc", k + "epf"]
        self._p_members = k + "shm:"
        self._k_indexed = k + "idx"
        self._epoch_ttl_ms = int(epoch_ttl * 1000)
        self._k_will = k + "will"
        self._k_ret, self._k_levels, self._p_bucket = k + "ret", k + "rl", k + "rb:"
        self._k_ret_bytes = k + "retb"  # bytes of the bodies in `_k_ret` (`retained_usage`), kept by SET_RETAINED
        self._wc_keys = [k + "wc", k + "wv"]
        self._p_holds = k + "wch:"  # + holder: the set of filters that holder holds
        self._p_lease = k + "lease:"
        self._k_ban = k + "ban"
        self._p_doc = k + "doc:"

    # --- sessions -----------------------------------------------------------------------------------------
    async def get_session(self, client_id: str) -> SessionRecord | None:
        body, offsets, epoch, owner = await self._conn.run((_GET, self._sess_keys, [client_id]))
        return None if body is None else _session(body, offsets, epoch, owner)

    async def claim_session(self, client_id: str, owner: str) -> tuple[SessionRecord | None, int]:
        body, offsets, epoch = await self._conn.run(
            (_CLAIM, self._sess_keys, [client_id, owner, self._epoch_ttl_ms, PRUNE]), idempotent=False)
        if body is None:
            return None, int(epoch)
        return _session(body, offsets, epoch, owner.encode()), int(epoch)

    async def put_session(self, record: SessionRecord) -> bool:
        return bool(await self._conn.run((_PUT, self._sess_keys, self._put_args(record))))

    def _put_args(self, record: SessionRecord) -> list[str | bytes | int]:
        return [record.client_id, encode_session(record), record.epoch, record.owner, _index_score(record),
                _counted(record), self._p_members]

    async def put_sessions(self, records: Sequence[SessionRecord]) -> list[bool]:
        """`put_session` for each record, pipelined (one round trip; an import or a benchmark's fill)."""
        results = await self._conn.run_many([(_PUT, self._sess_keys, self._put_args(r)) for r in records])
        return [bool(r) for r in results]

    async def delete_session(self, client_id: str, epoch: int = -1) -> None:
        await self._conn.run((_DELETE, self._sess_keys,
                              [client_id, epoch, self._p_members, self._epoch_ttl_ms, PRUNE]))

    async def _raw_pages(self, count: int) -> AsyncIterator[tuple[list[bytes], list[Any], list[Any], list[Any]]]:
        """(bodies, offsets, epochs, owners) of every stored session, a page per command (HSCAN: a session
        written meanwhile may be missed or come twice, as with any scan)."""
        cursor: bytes | str = "0"
        while True:
            cursor, _ids, bodies, offsets, epochs, owners = await self._conn.run(
                (_LIST, self._sess_keys, [cursor, count]))
            if bodies:
                yield bodies, offsets, epochs, owners
            if int(cursor) == 0:
                return

    async def session_pages(self, count: int = PAGE) -> AsyncIterator[list[SessionRecord]]:
        """Every stored session, about `count` per command."""
        async for bodies, offsets, epochs, owners in self._raw_pages(count):
            yield [_session(b, o, e, w) for b, o, e, w in zip(bodies, offsets, epochs, owners, strict=True)]

    async def list_sessions(self) -> list[SessionRecord]:
        """Every stored session in one list (maintenance and tests: nothing at a node's start reads this)."""
        return [record async for page in self.session_pages() for record in page]

    async def get_sessions(self, client_ids: Sequence[str]) -> list[SessionRecord]:
        """The stored records of these client ids (absent ones left out), a page per command."""
        out: list[SessionRecord] = []
        for i in range(0, len(client_ids), PAGE):
            ids = client_ids[i:i + PAGE]
            bodies, offsets, epochs, owners = await self._conn.run((_GET_MANY, self._sess_keys, list(ids)))
            out += [_session(b, o, e, w) for b, o, e, w in zip(bodies, offsets, epochs, owners, strict=True)
                    if b is not None]
        return out

    async def index_sessions(self) -> None:
        """Build the session indexes once for sessions a build without them stored, a page at a time (see
        Indexes); then turn the epochs of client ids without a record into tombstones (see Epochs)."""
        if int(await self._conn.command("GET", self._k_indexed) or 0) >= INDEX_VERSION:
            return
        async for bodies, _offsets, _epochs, _owners in self._raw_pages(INDEX_PAGE):
            args: list[str | bytes | int] = [self._p_members]
            for body in bodies:
                record = decode_session(body)
                args += (record.client_id, body, _index_score(record), _counted(record))
            await self._conn.run((_INDEX, self._sess_keys, args))
        cursor: bytes | str = "0"
        while True:
            cursor = await self._conn.run((_TOMBSTONE, self._sess_keys, [cursor, PAGE]))
            if int(cursor) == 0:
                break
        await self._conn.command("SET", self._k_indexed, INDEX_VERSION)

    async def _scan(self, kind: str, key: str) -> list[bytes]:
        """Every member (SSCAN) or field and value (HSCAN, flat) of `key`, a page per command."""
        out: list[bytes] = []
        cursor: bytes | str = "0"
        while True:
            cursor, items = await self._conn.command(kind, key, cursor, "COUNT", PAGE)
            out += [x for kv in items.items() for x in kv] if isinstance(items, dict) else items
            if int(cursor) == 0:
                return out

    async def online_sessions(self) -> list[str]:
        return [_text(m) for m in dict.fromkeys(await self._scan("SSCAN", self._sess_keys[4]))]

    async def due_sessions(self, now_ms: int, limit: int) -> list[str]:
        ids = await self._conn.command("ZRANGE", self._sess_keys[5], "-inf", now_ms, "BYSCORE", "LIMIT", 0, limit)
        return [_text(m) for m in cast(list[bytes], ids)]

    async def subscription_filters(self) -> dict[str, int]:
        flat = await self._scan("HSCAN", self._sess_keys[7])
        return {_text(f): int(n) for f, n in zip(flat[::2], flat[1::2], strict=True)}

    async def shared_members(self, group_key: str) -> list[str]:
        return [_text(m) for m in dict.fromkeys(await self._scan("SSCAN", self._p_members + group_key))]

    async def subscribed(self, filters: Sequence[str]) -> bool:
        names = [name for f in filters if (name := indexed_filter(f)) is not None]
        if not names:
            self._conn.check()
            return False
        return bool(await self._conn.run((_SUBSCRIBED, [self._sess_keys[7]], [self._p_members, *names])))

    async def set_offsets(self, offsets: dict[str, tuple[int, int, int]]) -> None:
        if not offsets:
            self._conn.check()
            return
        args: list[str | bytes | int] = []
        pack = OFFSETS.pack
        for client_id, (offset, sent_upto, epoch) in offsets.items():
            args += (client_id, pack(offset, sent_upto), epoch)
        await self._conn.run((_OFFSETS, self._sess_keys, args))

    # --- retained -------------------------------------------------------------------------------------------
    async def set_retained(self, topic: str, message: Message | None) -> None:
        level = topic.split("/", 1)[0]
        args: list[str | bytes | int] = [topic, level]
        if message is not None:
            args.append(encode_message_body(message, message.seq))
        await self._conn.run((_SET_RETAINED, [self._k_ret, self._k_levels, self._p_bucket + level, self._k_ret_bytes],
                              args))

    async def retained_usage(self) -> tuple[int, int]:
        count = await self._conn.command("HLEN", self._k_ret)
        nbytes = await self._conn.command("GET", self._k_ret_bytes)
        return int(count), max(0, int(nbytes or 0))

    async def match_retained(self, topic_filter: str, after: str | None = None, limit: int = 0,
                             max_bytes: int = 0) -> list[Message]:
        """A page (`Store.match_retained`) is cut from the whole match: each page reads every match again (the
        embedded store seeks to the page instead)."""
        if "+" not in topic_filter and "#" not in topic_filter:
            if after is not None and after >= topic_filter:
                return []
            body = await self._conn.command("HGET", self._k_ret, topic_filter)
            return [] if body is None else [decode_message_body(cast(bytes, body))]
        bodies = await self._conn.run((_MATCH, [self._k_ret, self._k_levels], [topic_filter, self._p_bucket]))
        found = [decode_message_body(b) for b in bodies if b is not None]
        if after is None and not (limit or max_bytes):
            return found
        found.sort(key=lambda m: m.topic.encode())
        cut = None if after is None else after.encode()
        page: list[Message] = []
        size = 0
        for m in found:
            if cut is not None and m.topic.encode() <= cut:
                continue
            page.append(m)
            size += len(m.payload)
            if 0 < limit <= len(page) or 0 < max_bytes <= size:
                break
        return page

    # --- wills ----------------------------------------------------------------------------------------------
    async def put_will(self, will: WillRecord) -> None:
        await self._conn.command("HSET", self._k_will, will.client_id, encode_will(will))

    async def delete_will(self, client_id: str) -> None:
        await self._conn.command("HDEL", self._k_will, client_id)

    async def list_wills(self) -> list[WillRecord]:
        flat = await self._conn.command("HGETALL", self._k_will)
        values = flat.values() if isinstance(flat, dict) else flat[1::2]
        return [decode_will(cast(bytes, v)) for v in values]

    # --- bans -----------------------------------------------------------------------------------------------
    async def get_bans(self) -> list[Ban]:
        flat = await self._conn.command("HGETALL", self._k_ban)
        values = flat.values() if isinstance(flat, dict) else flat[1::2]
        bans = [decode_ban(cast(bytes, v)) for v in values]
        return [ban for ban in bans if ban is not None]

    async def put_ban(self, ban: Ban) -> None:
        await self._conn.command("HSET", self._k_ban, f"{ban.kind}\x00{ban.who}", encode_ban(ban))

    async def delete_ban(self, kind: str, who: str, expired_before: float | None = None) -> bool:
        field = f"{kind}\x00{who}"
        if expired_before is None:
            return bool(await self._conn.command("HDEL", self._k_ban, field))
        return bool(await self._conn.run((_DELETE_LAPSED_BAN, [self._k_ban], [field, repr(expired_before)])))

    # --- versioned documents ---------------------------------------------------------------------------------
    async def get_document(self, name: str) -> tuple[int, bytes]:
        version, value = await self._conn.command("HMGET", self._p_doc + name, "v", "d")
        if version is None:
            return 0, b""
        return int(version), bytes(value or b"")

    async def put_document(self, name: str, value: bytes, expected: int) -> int:
        return int(await self._conn.run((_PUT_DOCUMENT, [self._p_doc + name], [expected, value])))

    # --- wildcard set ---------------------------------------------------------------------------------------
    async def change_wildcards(self, filters: Sequence[str], holder: str, add: bool) -> int:
        # Idempotent: a holder's filters are a set, so a resend after a lost reply counts once.
        return int(await self._conn.run((_WILDCARDS_CHANGE, [*self._wc_keys, self._p_holds + holder],
                                         [1 if add else -1, *filters])))

    async def release_wildcards(self, holder: str) -> int:
        return int(await self._conn.run((_WILDCARDS_RELEASE, [*self._wc_keys, self._p_holds + holder], [])))

    async def wildcards(self) -> tuple[int, frozenset[str]]:
        version, filters = await self._conn.run((_WILDCARDS_GET, self._wc_keys, []))
        return int(version), frozenset(_text(f) for f in filters)

    # --- leases -------------------------------------------------------------------------------------------
    async def lease(self, key: str, owner: str, ttl_ms: int) -> int:
        return int(await self._conn.run((_LEASE, [self._p_lease + key], [owner, ttl_ms]), idempotent=False))

    async def release(self, key: str, owner: str) -> None:
        await self._conn.run((_RELEASE, [self._p_lease + key], [owner]))

    # --- stats ----------------------------------------------------------------------------------------------
    async def stats(self) -> dict[str, int]:
        sessions, retained, wills = cast(list[Any], await self._conn.run(
            (_STATS, [self._sess_keys[0], self._k_ret, self._k_will], [])))
        return {"sessions": int(sessions), "retained": int(retained), "wills": int(wills)}
