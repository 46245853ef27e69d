"""The Lua scripts of the Redis store's session records (`store.redis.meta`): put, claim, delete and read them,
keeping in the same script the indexes a starting node reads, and the paged reads and index build.

Every script works inside the meta hash tag `{prefix}` (valid on Redis Cluster); the conventions on numbers and
chunked bulk commands are `store.redis.scripts`'.
"""

from __future__ import annotations

from tidewire.store.redis.scripts import LUA_LIB

# Sessions. KEYS (`RedisMeta._sess_keys`): 1 session hash (client id -> JSON), 2 offsets hash (packed offset,
# sent_upto set by set_offsets after the last put), 3 epoch hash, 4 owner hash, 5 online set, 6 expiry zset,
# 7 counted filters per session (client id -> filters joined by NUL; only sessions that have some; exact topics
# marked by a leading 0x01 are kept as members, not counted), 8 filter -> holder count, 9 tombstones (zset:
# client id without a record -> server ms it became so), 10 the claim counter, 11 the epoch floor (the highest
# epoch of a pruned tombstone).
# Shared members: set `<ARGV members prefix><$share/...>` of the client ids holding that filter (and
# `<prefix>\x01<topic>` of those subscribed to exactly that topic).
# Epochs: see `store.redis.meta` (a claim takes the next counter value; a tombstone older than its time to live
# goes, raising the floor, and a put for a client id without an epoch entry is refused below the floor).
_SESS = LUA_LIB + r"""
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function count_filters(id, list, delta, members)
  if not list or list == '' then return end
  for _, f in ipairs(split(list, '\0')) do
    if string.byte(f, 1) == 1 then  -- an exact topic (`store.base.EXACT_MARK`): its subscribers, not counted
      if delta > 0 then redis.call('SADD', members .. f, id) else redis.call('SREM', members .. f, id) end
    else
      if delta > 0 then redis.call('HINCRBY', KEYS[8], f, 1)
      elseif redis.call('HINCRBY', KEYS[8], f, -1) <= 0 then redis.call('HDEL', KEYS[8], f) end
      if string.sub(f, 1, 7) == '$share/' then
        if delta > 0 then redis.call('SADD', members .. f, id) else redis.call('SREM', members .. f, id) end
      end
    end
  end
end
local function set_filters(id, list, members)
  local old = redis.call('HGET', KEYS[7], id)
  if (old or '') == list then return end
  count_filters(id, old, -1, members)
  count_filters(id, list, 1, members)
  if list == '' then redis.call('HDEL', KEYS[7], id) else redis.call('HSET', KEYS[7], id, list) end
end
-- Tombstones older than ttl ms go (at most `n`), each raising the floor to its epoch.
local function prune(now, ttl, n)
  local old = redis.call('ZRANGEBYSCORE', KEYS[9], '-inf', now - ttl, 'LIMIT', 0, n)
  if #old == 0 then return end
  local floor = tonumber(redis.call('GET', KEYS[11]) or '0')
  for _, id in ipairs(old) do
    if redis.call('HEXISTS', KEYS[1], id) == 0 then
      floor = math.max(floor, tonumber(redis.call('HGET', KEYS[3], id) or '0'))
      redis.call('HDEL', KEYS[3], id)
    end
    redis.call('ZREM', KEYS[9], id)
  end
  redis.call('SET', KEYS[11], fmt(floor))
end
"""

# ARGV: 1 client id. Returns {body or nil, offsets or nil, epoch, owner or nil}.
GET_SESSION = """
local id = ARGV[1]
return {redis.call('HGET', KEYS[1], id), redis.call('HGET', KEYS[2], id),
        tonumber(redis.call('HGET', KEYS[3], id) or '0'), redis.call('HGET', KEYS[4], id)}
"""

# ARGV: 1 client id, 2 owner, 3 tombstone time to live (ms), 4 tombstones pruned at most. The epoch becomes
# the next claim number, above the client's own and the floor (even without a record: a tombstone, so the
# fence holds while a writer of the earlier claim may still write). Returns {body or nil, offsets, epoch}.
CLAIM_SESSION = _SESS + """
local id = ARGV[1]
local epoch = math.max(tonumber(redis.call('GET', KEYS[10]) or '0'),
                       tonumber(redis.call('HGET', KEYS[3], id) or '0'),
                       tonumber(redis.call('GET', KEYS[11]) or '0')) + 1
redis.call('SET', KEYS[10], fmt(epoch))
redis.call('HSET', KEYS[3], id, fmt(epoch))
local body = redis.call('HGET', KEYS[1], id)
local now = now_ms()
if body then redis.call('HSET', KEYS[4], id, ARGV[2]) else redis.call('ZADD', KEYS[9], now, id) end
prune(now, tonumber(ARGV[3]), tonumber(ARGV[4]))
return {body, redis.call('HGET', KEYS[2], id), epoch}
"""

# ARGV: 1 client id, 2 body, 3 epoch, 4 owner, 5 expiry deadline in ms (-1: online, -2: offline, never
# expires), 6 its counted filters joined by NUL, 7 members key prefix.
# Returns 1, or 0 (nothing written) when the stored epoch is higher, or, without a stored epoch, the floor.
PUT_SESSION = _SESS + """
local id, epoch = ARGV[1], tonumber(ARGV[3])
local cur = redis.call('HGET', KEYS[3], id)
if cur then
  cur = tonumber(cur)
  if epoch < cur then return 0 end
elseif epoch < tonumber(redis.call('GET', KEYS[11]) or '0') then
  return 0
end
redis.call('HSET', KEYS[1], id, ARGV[2])
redis.call('HDEL', KEYS[2], id)
if not cur or epoch > cur then redis.call('HSET', KEYS[3], id, ARGV[3]) end
redis.call('HSET', KEYS[4], id, ARGV[4])
redis.call('ZREM', KEYS[9], id)
local deadline = tonumber(ARGV[5])
if deadline == -1 then redis.call('SADD', KEYS[5], id) else redis.call('SREM', KEYS[5], id) end
if deadline >= 0 then redis.call('ZADD', KEYS[6], deadline, id) else redis.call('ZREM', KEYS[6], id) end
set_filters(id, ARGV[6], ARGV[7])
return 1
"""

# ARGV: 1 client id, 2 epoch (-1: unconditional), 3 members key prefix, 4 tombstone time to live (ms),
# 5 tombstones pruned at most. The epoch stays as a tombstone. Returns 1 if a record was deleted.
DELETE_SESSION = _SESS + """
local id, epoch = ARGV[1], tonumber(ARGV[2])
if epoch >= 0 and epoch < tonumber(redis.call('HGET', KEYS[3], id) or '0') then return 0 end
redis.call('HDEL', KEYS[2], id)
redis.call('HDEL', KEYS[4], id)
redis.call('SREM', KEYS[5], id)
redis.call('ZREM', KEYS[6], id)
set_filters(id, '', ARGV[3])
local gone = redis.call('HDEL', KEYS[1], id)
local now = now_ms()
if gone == 1 and redis.call('HEXISTS', KEYS[3], id) == 1 then redis.call('ZADD', KEYS[9], now, id) end
prune(now, tonumber(ARGV[4]), tonumber(ARGV[5]))
return gone
"""

# One page of the sessions: ARGV 1 HSCAN cursor, 2 COUNT. Returns {next cursor ('0': done), ids, bodies,
# offsets, epochs, owners}.
LIST_SESSIONS = LUA_LIB + """
local r = redis.call('HSCAN', KEYS[1], ARGV[1], 'COUNT', tonumber(ARGV[2]))
local ids, bodies = {}, {}
for i = 1, #r[2], 2 do ids[#ids + 1] = r[2][i]; bodies[#bodies + 1] = r[2][i + 1] end
local out = {r[1], ids, bodies, {}, {}, {}}
if #ids == 0 then return out end
hmget_into(out[4], KEYS[2], ids)
hmget_into(out[5], KEYS[3], ids)
hmget_into(out[6], KEYS[4], ids)
for i = 1, #ids do out[5][i] = tonumber(out[5][i] or '0') end
return out
"""

# The indexes for sessions a build without them stored, one page at a time. ARGV: 1 members key prefix, then
# per session: id, the body it was read with, expiry deadline (as PUT_SESSION), counted filters. A session whose
# body changed since it was read is skipped (its put indexed it); its filters are counted once (only while it
# has no entry in KEYS[7]). Returns 0.
INDEX_SESSIONS = _SESS + """
for i = 2, #ARGV, 4 do
  local id = ARGV[i]
  if redis.call('HGET', KEYS[1], id) == ARGV[i + 1] then
    local deadline = tonumber(ARGV[i + 2])
    if deadline == -1 then redis.call('SADD', KEYS[5], id) else redis.call('SREM', KEYS[5], id) end
    if deadline >= 0 then redis.call('ZADD', KEYS[6], deadline, id) else redis.call('ZREM', KEYS[6], id) end
    if redis.call('HEXISTS', KEYS[7], id) == 0 then set_filters(id, ARGV[i + 3], ARGV[1]) end
  end
end
return 0
"""

# One page of the epoch hash (a build without tombstones kept every client id's epoch): ARGV 1 HSCAN cursor,
# 2 COUNT. Epochs of client ids without a record become tombstones from now. Returns the next cursor.
TOMBSTONE_EPOCHS = _SESS + """
local r = redis.call('HSCAN', KEYS[3], ARGV[1], 'COUNT', tonumber(ARGV[2]))
local now = now_ms()
for i = 1, #r[2], 2 do
  local id = r[2][i]
  if redis.call('HEXISTS', KEYS[1], id) == 0 then redis.call('ZADD', KEYS[9], 'NX', now, id) end
end
return r[1]
"""

# Several sessions by id: ARGV client ids. Returns {bodies, offsets, epochs, owners} in their order.
GET_SESSIONS = LUA_LIB + """
local out = {{}, {}, {}, {}}
for k = 1, 4 do hmget_into(out[k], KEYS[k], ARGV) end
for i = 1, #ARGV do out[3][i] = tonumber(out[3][i] or '0') end
return out
"""

# ARGV: client id, packed offsets, epoch, ... Unknown sessions and epochs below the stored one are skipped.
SET_OFFSETS = """
for i = 1, #ARGV, 3 do
  local id = ARGV[i]
  if redis.call('HEXISTS', KEYS[1], id) == 1
      and tonumber(ARGV[i + 2]) >= tonumber(redis.call('HGET', KEYS[3], id) or '0') then
    redis.call('HSET', KEYS[2], id, ARGV[i + 1])
  end
end
return 0
"""
