"""The Redis store engine's records under the meta hash tag `{prefix}`: sessions (fenced by epochs), offsets,
retained messages (indexed by first level), wills, and the cluster-wide wildcard set.

Layout (every key under `{prefix}`, so each multi-key script is valid on Redis Cluster):

    :sess   hash  client id -> session JSON          :off   hash  client id -> packed (offset, sent_upto)
    :ep     hash  client id -> epoch (kept after a delete: a stale node stays fenced off)
    :own    hash  client id -> owner node id         :will  hash  client id -> encoded will
    :ret    hash  topic -> retained body;  :rl  set of first levels;  :rb:<level>  set of retained topics
    :on     set   client ids of sessions online       :exp   zset  client id by expiry deadline (ms, offline only)
    :wc     hash  wildcard filter -> holders;  :wv  the wildcard set version (copied into each partition)
    :lease:<key>  hash  {owner, until (server ms), epoch}: one holder at a time (a shared group's serving node)
    :ban    hash  <kind> 0x00 <who> -> ban JSON (`store.base.encode_ban`)

A session record's `epoch` and `owner` come from `:ep` / `:own` (the JSON keeps what the last put carried), so
a claim changes them without rewriting the record. Offsets set after the last put live in `:off` and win over
the record's own. Every call here is one script or one command: one round trip.
"""

from __future__ import annotations

from collections.abc import Sequence
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
    CLAIM_SESSION,
    DELETE_SESSION,
    GET_SESSION,
    LEASE,
    LIST_SESSIONS,
    MATCH_RETAINED,
    META_STATS,
    PUT_SESSION,
    RELEASE,
    SET_OFFSETS,
    SET_RETAINED,
    WILDCARDS_CHANGE,
    WILDCARDS_GET,
)

_GET = Script("get_session", GET_SESSION)
_CLAIM = Script("claim_session", CLAIM_SESSION)
_PUT = Script("put_session", PUT_SESSION)
_DELETE = Script("delete_session", DELETE_SESSION)
_LIST = Script("list_sessions", LIST_SESSIONS)
_OFFSETS = Script("set_offsets", SET_OFFSETS)
_SET_RETAINED = Script("set_retained", SET_RETAINED)
_MATCH = Script("match_retained", MATCH_RETAINED)
_WILDCARDS_CHANGE = Script("wildcards_change", WILDCARDS_CHANGE)
_WILDCARDS_GET = Script("wildcards_get", WILDCARDS_GET)
_STATS = Script("meta_stats", META_STATS)
_LEASE = Script("lease", LEASE)
_RELEASE = Script("release", RELEASE)
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


def _index_score(record: SessionRecord) -> int:
    """The session's place in the indexes: -1 online, its expiry deadline (ms), or -2 (never expires; a group)."""
    if record.client_id.startswith(SHARED_PREFIX):
        return -2
    if record.disconnected_at_ms == 0:
        return -1
    deadline = expiry_deadline(record)
    return -2 if deadline is None else deadline


class RedisMeta:
    def __init__(self, conn: RedisConn, prefix: str) -> None:
        k = f"{{{prefix}}}:"
        self._conn = conn
        self.k_parts = k + "parts"  # the partition count the data was written with
        self._sess_keys = [k + "sess", k + "off", k + "ep", k + "own", k + "on", k + "exp"]
        self._k_indexed = k + "sessidx"  # set once :on and :exp cover every session (data from older builds)
        self._k_will = k + "will"
        self._k_ret, self._k_levels, self._p_bucket = k + "ret", k + "rl", k + "rb:"
        self._k_ret_bytes = k + "retb"  # bytes of the bodies in `_k_ret` (`retained_usage`), kept by SET_RETAINED
        self._wc_keys = [k + "wc", k + "wv"]
        self._p_lease = k + "lease:"
        self._k_ban = k + "ban"

    # --- sessions -----------------------------------------------------------------------------------------
    async def get_session(self, client_id: str) -> SessionRecord | None:
        body, offsets, epoch, owner = await self._conn.run((_GET, self._sess_keys, [client_id]))
        return None if body is None else _session(body, offsets, epoch, owner)

    async def claim_session(self, client_id: str, owner: str) -> tuple[SessionRecord | None, int]:
        body, offsets, epoch = await self._conn.run((_CLAIM, self._sess_keys, [client_id, owner]),
                                                    idempotent=False)
        if body is None:
            return None, int(epoch)
        return _session(body, offsets, epoch, owner.encode()), int(epoch)

    async def put_session(self, record: SessionRecord) -> bool:
        args: list[str | bytes | int] = [record.client_id, encode_session(record), record.epoch, record.owner,
                                         _index_score(record)]
        return bool(await self._conn.run((_PUT, self._sess_keys, args)))

    async def delete_session(self, client_id: str, epoch: int = -1) -> None:
        await self._conn.run((_DELETE, self._sess_keys, [client_id, epoch]))

    async def list_sessions(self) -> list[SessionRecord]:
        # One reply with every session: fine for now; a large deployment needs HSCAN paging.
        _ids, bodies, offsets, epochs, owners = await self._conn.run((_LIST, self._sess_keys, []))
        return [_session(b, o, e, w) for b, o, e, w in zip(bodies, offsets, epochs, owners, strict=True)]

    async def index_sessions(self) -> None:
        """Build the online set and expiry zset once for sessions stored by a build without them."""
        if await self._conn.command("EXISTS", self._k_indexed):
            return
        for record in await self.list_sessions():
            score = _index_score(record)
            if score == -1:
                await self._conn.command("SADD", self._sess_keys[4], record.client_id)
            elif score >= 0:
                await self._conn.command("ZADD", self._sess_keys[5], score, record.client_id)
        await self._conn.command("SET", self._k_indexed, 1)

    async def online_sessions(self) -> list[str]:
        members = await self._conn.command("SMEMBERS", self._sess_keys[4])
        return [_text(m) for m in cast(list[bytes], members)]

    async def due_sessions(self, now_ms: int, limit: int) -> list[str]:
        ids = await self._conn.command("ZRANGE", self._sess_keys[5], "-inf", now_ms, "BYSCORE", "LIMIT", 0, limit)
        return [_text(m) for m in cast(list[bytes], ids)]

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

    # --- wildcard set ---------------------------------------------------------------------------------------
    async def change_wildcards(self, filters: Sequence[str], add: bool) -> int:
        return int(await self._conn.run((_WILDCARDS_CHANGE, self._wc_keys, [1 if add else -1, *filters]),
                                        idempotent=False))

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
