"""The Redis store engine's consumer groups: definitions, cursors and claims under the meta hash tag `{prefix}`,
each call one atomic script (one EVALSHA), so competing consumers on any node never claim a seq twice; and
`fetch`, messages by seq from their partitions.

Layout (every key under `{prefix}`, so one script may touch a group's cursor, claims and visibility together):

    :grp   hash  group name -> definition JSON (`store.groups` encoding)
    :gcur  hash  group name -> cursor (every seq at or below it is claimed, settled, or was never the group's)
    :gtok  string  the token counter of every group (so a handle from a deleted group never matches a new claim)
    :gp:<name>  hash  seq -> "deliveries token visible_at_ms owner" (a pending claim)
    :gh:<name>  zset  pending seqs scored by visible_at_ms (not yet found due)
    :gr:<name>  zset  pending seqs found due, scored by seq: `reclaim` takes the lowest first
    :go:<len(name)>:<name>:<owner>  set  the seqs `owner` holds (`release_owner`); owner "" after a release
    :gl:<name>  hash  seq -> lane, for a pending claim in a lane
    :gq:<len(name)>:<name>:<lane>  zset  the lane's pending seqs scored by seq: the first is handed out, the
                others are held back (owner "", visible_at HELD) until `settle` of the one before makes them due

`reclaim` first moves every claim due at its `now_ms` from `:gh` to `:gr` (a claim moves once per visibility
period), then takes from `:gr` in seq order: O(log n) per claim. A claim in `:gr` that is not due at a caller's
`now_ms` (clocks of several nodes differ) goes back to `:gh`. Message seqs are decimal strings in Redis, as in
the partitions' message hashes; the seq's partition is seq mod P (`store.redis.engine`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tidewire.store.base import Claim, GroupRecord, Message, PendingClaim
from tidewire.store.groups import HELD, check_group_name, decode_group, encode_group
from tidewire.store.records import decode_message_body
from tidewire.store.redis.conn import Call, RedisConn, Script

FETCH_CHUNK = 1000  # seqs per fetch script call (pipelined)

_LIB = f"""
local CHUNK = 500
local HELD = {HELD}
""" + """
local function fmt(x) return string.format('%.0f', x) end
local function parse(v)
  local d, t, vis, o = string.match(v, '^(%d+) (%d+) (%-?%d+) (.*)$')
  return tonumber(d), tonumber(t), tonumber(vis), o
end
local function pack(d, t, vis, o) return string.format('%.0f %.0f %.0f ', d, t, vis) .. o end
local function sadd(key, members)
  for i = 1, #members, CHUNK do
    redis.call('SADD', key, unpack(members, i, math.min(i + CHUNK - 1, #members)))
  end
end
"""

# KEYS: 1 definitions, 2 cursors. ARGV: 1 name, 2 definition, 3 start seq (the cursor of a new group).
PUT_GROUP = """
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('HSETNX', KEYS[2], ARGV[1], ARGV[3])
return 0
"""

# KEYS: 1 hidden, 2 ready. ARGV: 1 now_ms. Returns the seqs visible at now_ms (found due, or due by their score).
READY_CLAIMS = """
local out = redis.call('ZRANGE', KEYS[2], 0, -1)
for _, s in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])) do out[#out + 1] = s end
return out
"""

# As PUT_GROUP, unless the group exists. Returns 1 if it was created, else 0.
ADD_GROUP = """
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 0 then return 0 end
redis.call('HSETNX', KEYS[2], ARGV[1], ARGV[3])
return 1
"""

# KEYS: 1 definitions, 2 cursors, 3 pending, 4 hidden, 5 ready, 6 lanes. ARGV: 1 name, 2 owner set prefix,
# 3 lane set prefix.
DELETE_GROUP = _LIB + """
for _, lane in ipairs(redis.call('HVALS', KEYS[6])) do redis.call('DEL', ARGV[3] .. lane) end
redis.call('DEL', KEYS[6])
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
local seen = {}
for _, v in ipairs(redis.call('HVALS', KEYS[3])) do
  local _, _, _, o = parse(v)
  if not seen[o] then seen[o] = true; redis.call('DEL', ARGV[2] .. o) end
end
redis.call('DEL', KEYS[3], KEYS[4], KEYS[5])
return 0
"""

# KEYS: 1 cursors, 2 pending. ARGV: 1 name. Returns {cursor or -1, pending claims}.
POSITION = """
local c = redis.call('HGET', KEYS[1], ARGV[1])
if not c then return {-1, 0} end
return {tonumber(c), redis.call('HLEN', KEYS[2])}
"""

# KEYS: 1 cursors, 2 pending, 3 hidden, 4 token counter, 5 the owner's set, 6 lanes, 7 the set of owner "".
# ARGV: 1 name, 2 after, 3 upto, 4 owner, 5 visible_at_ms, 6 lane set prefix, 7 n, then n seqs (ascending,
# none above upto), then their n lanes ("": none; all left out when none has one). Returns {cursor (-1: no
# such group), {seq, token, ...} of the claims made (not those held back in their lane)}.
CLAIM = _LIB + """
local c = redis.call('HGET', KEYS[1], ARGV[1])
if not c then return {-1, {}} end
c = tonumber(c)
if c < tonumber(ARGV[2]) then return {c, {}} end
local vis = tonumber(ARGV[5])
local n = tonumber(ARGV[7])
local new, lanes = {}, {}
for i = 1, n do
  if tonumber(ARGV[7 + i]) > c then new[#new + 1] = ARGV[7 + i]; lanes[#lanes + 1] = ARGV[7 + n + i] or '' end
end
local out = {}
if #new > 0 then
  local tok = redis.call('INCRBY', KEYS[4], #new) - #new
  local mine, held = {}, {}
  for i, s in ipairs(new) do
    tok = tok + 1
    local d, v, o = 1, vis, ARGV[4]
    local lane = lanes[i]
    if lane ~= '' then
      local q = ARGV[6] .. lane
      if redis.call('ZCARD', q) > 0 then d, v, o = 0, HELD, '' end  -- held back: not handed out yet
      redis.call('ZADD', q, s, s)
      redis.call('HSET', KEYS[6], s, lane)
    end
    redis.call('HSET', KEYS[2], s, pack(d, tok, v, o))
    redis.call('ZADD', KEYS[3], v, s)
    if d == 0 then
      held[#held + 1] = s
    else
      mine[#mine + 1] = s
      out[#out + 1] = s
      out[#out + 1] = tok
    end
  end
  sadd(KEYS[5], mine)
  sadd(KEYS[7], held)
end
local upto = tonumber(ARGV[3])
if upto > c then redis.call('HSET', KEYS[1], ARGV[1], fmt(upto)); c = upto end
return {c, out}
"""

# KEYS: 1 pending, 2 hidden, 3 ready, 4 token counter, 5 the new owner's set. ARGV: 1 now_ms, 2 visible_at_ms,
# 3 limit, 4 owner, 5 owner set prefix. Returns {seq, deliveries, token, ...} lowest seq first.
RECLAIM = _LIB + """
local now, vis, limit = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
while true do
  local due = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[1], 'LIMIT', 0, CHUNK)
  if #due == 0 then break end
  local adds = {}
  for _, s in ipairs(due) do adds[#adds + 1] = s; adds[#adds + 1] = s end
  redis.call('ZADD', KEYS[3], unpack(adds))
  redis.call('ZREM', KEYS[2], unpack(due))
end
local out = {}
local n = 0
while n < limit do
  local batch = redis.call('ZRANGE', KEYS[3], 0, limit - n - 1)
  if #batch == 0 then break end
  for _, s in ipairs(batch) do
    redis.call('ZREM', KEYS[3], s)
    local v = redis.call('HGET', KEYS[1], s)
    if v then
      local d, t, va, o = parse(v)
      if va > now then
        redis.call('ZADD', KEYS[2], va, s)  -- found due by a caller whose clock runs ahead of this one's
      else
        local tok = redis.call('INCR', KEYS[4])
        d = d + 1
        redis.call('HSET', KEYS[1], s, pack(d, tok, vis, ARGV[4]))
        redis.call('ZADD', KEYS[2], vis, s)
        if o ~= ARGV[4] then
          redis.call('SREM', ARGV[5] .. o, s)
          redis.call('SADD', KEYS[5], s)
        end
        out[#out + 1] = s
        out[#out + 1] = d
        out[#out + 1] = tok
        n = n + 1
      end
    end
  end
end
return out
"""

# KEYS: 1 pending, 2 hidden, 3 ready, 4 lanes. ARGV: 1 owner set prefix, 2 lane set prefix, then seq, token
# pairs. Returns the seqs removed. A settled lane's next claim, held back until now, is due at once.
SETTLE = _LIB + """
local out = {}
for i = 3, #ARGV, 2 do
  local s = ARGV[i]
  local v = redis.call('HGET', KEYS[1], s)
  if v then
    local _, t, _, o = parse(v)
    if t == tonumber(ARGV[i + 1]) then
      redis.call('HDEL', KEYS[1], s)
      redis.call('ZREM', KEYS[2], s)
      redis.call('ZREM', KEYS[3], s)
      redis.call('SREM', ARGV[1] .. o, s)
      out[#out + 1] = s
      local lane = redis.call('HGET', KEYS[4], s)
      if lane then
        redis.call('HDEL', KEYS[4], s)
        local q = ARGV[2] .. lane
        redis.call('ZREM', q, s)
        local nxt = redis.call('ZRANGE', q, 0, 0)[1]
        local nv = nxt and redis.call('HGET', KEYS[1], nxt)
        if nv then
          local d, nt, va, no = parse(nv)
          if va == HELD then
            redis.call('HSET', KEYS[1], nxt, pack(d, nt, 0, no))
            redis.call('ZREM', KEYS[2], nxt)
            redis.call('ZADD', KEYS[3], nxt, nxt)
          end
        end
      end
    end
  end
end
return out
"""

# KEYS: 1 pending, 2 hidden, 3 ready, 4 token counter. ARGV: 1 visible_at_ms, then seq, token pairs.
# Returns {seq, deliveries, new token, ...}.
SET_VISIBILITY = _LIB + """
local vis = tonumber(ARGV[1])
local out = {}
for i = 2, #ARGV, 2 do
  local s = ARGV[i]
  local v = redis.call('HGET', KEYS[1], s)
  if v then
    local d, t, _, o = parse(v)
    if t == tonumber(ARGV[i + 1]) then
      local tok = redis.call('INCR', KEYS[4])
      redis.call('HSET', KEYS[1], s, pack(d, tok, vis, o))
      redis.call('ZREM', KEYS[3], s)
      redis.call('ZADD', KEYS[2], vis, s)
      out[#out + 1] = s
      out[#out + 1] = d
      out[#out + 1] = tok
    end
  end
end
return out
"""

# KEYS: 1 pending, 2 hidden, 3 ready, 4 the owner's set, 5 the set of owner "". Every claim of the owner is
# due now, held by nobody (owner ""), its token kept. Returns how many.
RELEASE_OWNER = _LIB + """
local seqs = redis.call('SMEMBERS', KEYS[4])
local kept = {}
for _, s in ipairs(seqs) do
  local v = redis.call('HGET', KEYS[1], s)
  if v then
    local d, t = parse(v)
    redis.call('HSET', KEYS[1], s, pack(d, t, 0, ''))
    redis.call('ZREM', KEYS[2], s)
    redis.call('ZADD', KEYS[3], s, s)
    kept[#kept + 1] = s
  end
end
redis.call('DEL', KEYS[4])
sadd(KEYS[5], kept)
return #kept
"""

# KEYS: 1 a partition's message hash. ARGV: seqs. Returns the bodies (nil: not stored).
FETCH = """
local out = {}
for i = 1, #ARGV, 500 do
  local got = redis.call('HMGET', KEYS[1], unpack(ARGV, i, math.min(i + 499, #ARGV)))
  for j = 1, #got do out[#out + 1] = got[j] end
end
return out
"""

_PUT = Script("put_group", PUT_GROUP)
_ADD = Script("add_group", ADD_GROUP)
_DELETE = Script("delete_group", DELETE_GROUP)
_POSITION = Script("group_position", POSITION)
_READY_CLAIMS = Script("ready_claims", READY_CLAIMS)
_CLAIM = Script("claim", CLAIM)
_RECLAIM = Script("reclaim", RECLAIM)
_SETTLE = Script("settle", SETTLE)
_SET_VISIBILITY = Script("set_visibility", SET_VISIBILITY)
_RELEASE_OWNER = Script("release_owner", RELEASE_OWNER)
_FETCH = Script("fetch", FETCH)


def _claims(flat: list[Any]) -> list[Claim]:
    return [Claim(int(flat[i]), int(flat[i + 1]), int(flat[i + 2])) for i in range(0, len(flat), 3)]


def _handles(handles: Sequence[tuple[int, int]]) -> list[str | bytes | int]:
    args: list[str | bytes | int] = []
    for seq, token in handles:
        args += (int(seq), int(token))
    return args


class RedisGroups:
    """The group calls of `store.base.Store` on Redis: a mixin of `RedisStore`, over its connection `_conn`."""

    _conn: RedisConn

    def _init_groups(self, prefix: str, msg_keys: Sequence[str]) -> None:
        """`msg_keys[p]`: partition p's message hash."""
        self._gk = k = f"{{{prefix}}}:"
        self._gk_defs, self._gk_cursors, self._gk_token = k + "grp", k + "gcur", k + "gtok"
        self._g_msg_keys = list(msg_keys)

    def _keys(self, name: str) -> list[str | bytes]:
        """pending, hidden, ready"""
        return [self._gk + "gp:" + name, self._gk + "gh:" + name, self._gk + "gr:" + name]

    def _lanes(self, name: str) -> tuple[str, str]:
        """The group's lane hash and the prefix of its lanes' sets."""
        return self._gk + "gl:" + name, f"{self._gk}gq:{len(name.encode())}:{name}:"

    def _owners(self, name: str) -> str:
        """Prefix of the group's owner sets; the name's length keeps ("a:b", "c") and ("a", "b:c") apart."""
        return f"{self._gk}go:{len(name.encode())}:{name}:"

    async def put_group(self, record: GroupRecord) -> None:
        check_group_name(record.name)
        await self._conn.run((_PUT, [self._gk_defs, self._gk_cursors],
                              [record.name, encode_group(record), record.start_seq]))

    async def add_group(self, record: GroupRecord) -> bool:
        check_group_name(record.name)
        return bool(await self._conn.run((_ADD, [self._gk_defs, self._gk_cursors],
                                          [record.name, encode_group(record), record.start_seq])))

    async def get_group(self, name: str) -> GroupRecord | None:
        value = await self._conn.command("HGET", self._gk_defs, name)
        return None if value is None else decode_group(value)

    async def list_groups(self) -> list[GroupRecord]:
        return [decode_group(v) for v in await self._conn.command("HVALS", self._gk_defs)]

    async def delete_group(self, name: str) -> None:
        lanes, lane_sets = self._lanes(name)
        await self._conn.run((_DELETE, [self._gk_defs, self._gk_cursors, *self._keys(name), lanes],
                              [name, self._owners(name), lane_sets]))

    async def group_position(self, name: str) -> tuple[int, int]:
        cursor, pending = await self._conn.run((_POSITION, [self._gk_cursors, self._keys(name)[0]], [name]))
        return int(cursor), int(pending)

    async def ready_claims(self, group: str, now_ms: int) -> list[int]:
        _, hidden, ready = self._keys(group)
        return sorted({int(s) for s in await self._conn.run((_READY_CLAIMS, [hidden, ready], [now_ms]))})

    async def pending_claims(self, group: str, after_seq: int, limit: int) -> list[PendingClaim]:
        # One HGETALL of the group's pending hash: for operators, on groups whose size their owner bounds.
        found = await self._conn.command("HGETALL", self._keys(group)[0])
        if limit <= 0 or not found:
            return []
        pairs = found.items() if isinstance(found, dict) else zip(found[::2], found[1::2], strict=True)
        claims: list[PendingClaim] = []
        for key, raw in pairs:
            seq = int(key)
            if seq > after_seq:
                value = raw.decode() if isinstance(raw, bytes) else raw
                deliveries, token, visible_at, owner = value.split(" ", 3)
                claims.append(PendingClaim(seq, int(deliveries), int(token), int(visible_at), owner))
        claims.sort()
        return claims[:limit]

    async def claim(self, group: str, after: int, upto: int, seqs: Sequence[int], owner: str,
                    visible_at_ms: int, lanes: Mapping[int, str] | None = None) -> tuple[list[Claim], int]:
        pending, hidden, _ = self._keys(group)
        lane_hash, lane_sets = self._lanes(group)
        owners = self._owners(group)
        # Never above upto: the cursor would stay below such a seq and a later claim could take it again.
        new = sorted({int(s) for s in seqs if s <= upto})
        of = [lanes.get(s, "") for s in new] if lanes else []
        cursor, flat = await self._conn.run(
            (_CLAIM, [self._gk_cursors, pending, hidden, self._gk_token, owners + owner, lane_hash, owners],
             [group, after, upto, owner, visible_at_ms, lane_sets, len(new), *new, *of]), idempotent=False)
        return [Claim(int(flat[i]), 1, int(flat[i + 1])) for i in range(0, len(flat), 2)], int(cursor)

    async def reclaim(self, group: str, owner: str, now_ms: int, visible_at_ms: int, limit: int) -> list[Claim]:
        if limit <= 0:
            self._conn.check()
            return []
        owners = self._owners(group)
        flat = await self._conn.run((_RECLAIM, [*self._keys(group), self._gk_token, owners + owner],
                                     [now_ms, visible_at_ms, limit, owner, owners]), idempotent=False)
        return _claims(flat)

    async def settle(self, group: str, handles: Sequence[tuple[int, int]]) -> list[int]:
        if not handles:
            self._conn.check()
            return []
        lane_hash, lane_sets = self._lanes(group)
        done = await self._conn.run((_SETTLE, [*self._keys(group), lane_hash],
                                     [self._owners(group), lane_sets, *_handles(handles)]))
        return [int(s) for s in done]

    async def set_visibility(self, group: str, handles: Sequence[tuple[int, int]],
                             visible_at_ms: int) -> list[Claim]:
        if not handles:
            self._conn.check()
            return []
        flat = await self._conn.run((_SET_VISIBILITY, [*self._keys(group), self._gk_token],
                                     [visible_at_ms, *_handles(handles)]), idempotent=False)
        return _claims(flat)

    async def release_owner(self, group: str, owner: str) -> int:
        owners = self._owners(group)
        return int(await self._conn.run((_RELEASE_OWNER, [*self._keys(group), owners + owner, owners], [])))

    async def fetch(self, seqs: Sequence[int]) -> list[Message]:
        P = len(self._g_msg_keys)
        by_part: dict[int, list[int]] = {}
        for s in sorted({int(s) for s in seqs if s > 0}):
            by_part.setdefault(s % P, []).append(s)
        calls: list[Call] = []
        asked: list[list[int]] = []
        for p, part_seqs in by_part.items():
            for i in range(0, len(part_seqs), FETCH_CHUNK):
                chunk = part_seqs[i : i + FETCH_CHUNK]
                calls.append((_FETCH, [self._g_msg_keys[p]], chunk))
                asked.append(chunk)
        if not calls:
            self._conn.check()
            return []
        out: list[Message] = []
        for chunk, bodies in zip(asked, await self._conn.run_many(calls), strict=True):
            for s, body in zip(chunk, bodies, strict=True):
                if body is not None:  # trimmed by retention
                    m = decode_message_body(body)
                    m.seq = s
                    out.append(m)
        out.sort(key=lambda m: m.seq)
        return out
