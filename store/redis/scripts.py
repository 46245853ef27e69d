"""The Lua scripts of the Redis store engine: each store call that touches several keys is one atomic script.

Every script touches the keys of ONE hash tag, so each is valid on Redis Cluster: the partition scripts
(`APPEND`, `READ`, `SEAL`, `MARK_SPREAD`, `RAISE_VERSION`, `RETENTION`, `PART_STATS`) work inside one partition
`{prefix:p}`; the others inside the meta tag `{prefix}` (the session scripts are in `store.redis.session_scripts`).
Keys are declared in KEYS except the ones an index names (`MATCH_RETAINED` buckets, queues in `RETENTION`, shared
members in the session scripts), built from a prefix in ARGV under the same tag.

Numbers: Lua numbers are doubles, exact for integers below 2**53, and seqs stay below that (the append script
refuses past it). Redis converts a number argument of `redis.call` exactly ('%.17g'), but Lua's own `tostring`
and `..` use '%.14g' and would round a seq: strings are built with `string.format('%.0f')` only. A reply number
becomes an integer reply. `unpack` is limited by the Lua C stack (~8000 values), so bulk commands go in chunks.

Sequence of a partition (`{prefix:p}:seq`, the counter `c`): the last seq assigned or sealed there; every seq
of partition p is congruent to p modulo P, so seqs are unique across partitions, and the next append gets at
least c + P: the partition is sealed up to c + P - 1 (everything at or below is final). A counter that does not
exist yet counts as p - P.
"""

from __future__ import annotations

# 2025-01-01T00:00:00Z: the hybrid clock counts milliseconds from here, TICKS values per millisecond, so it
# stays below 2**53 until 2094 (2**53 / 4096 ms ~ 69.7 years).
EPOCH_MS = 1_735_689_600_000
TICKS = 4096
MAX_SEQ = 1 << 53
# A node whose clock runs further ahead of Redis than this is held back (its clock must not use up the
# 2**53 range); behind is harmless: the counters and what the node has seen carry its seqs forward.
MAX_AHEAD_MS = 60_000
# A writer's fence token lives this long after its last append: a later append finding it gone is refused, and
# is sent again unchecked once the append before it has landed (nothing of the writer's is in flight then).
FENCE_TTL_MS = 3_600_000

LUA_LIB = """
local CHUNK = 1000
local function fmt(x) return string.format('%.0f', x) end
local function split(s, sep)
  local t, start = {}, 1
  while true do
    local p = string.find(s, sep, start, true)
    if not p then t[#t + 1] = string.sub(s, start); return t end
    t[#t + 1] = string.sub(s, start, p - 1)
    start = p + 1
  end
end
local function hmget_into(out, key, fields)
  for i = 1, #fields, CHUNK do
    local got = redis.call('HMGET', key, unpack(fields, i, math.min(i + CHUNK - 1, #fields)))
    for j = 1, #got do out[#out + 1] = got[j] end
  end
end
"""

# Shared by the partition scripts: `counter(key, P, p)` and `seal(key, target, P, p)`: raise the counter to the
# largest value <= target congruent to p (then c + P - 1 >= target: no later append gets a seq <= target).
_PART = LUA_LIB + """
local function counter(key, P, p)
  local c = redis.call('GET', key)
  if c then return tonumber(c) end
  return p - P
end
local function seal(key, target, P, p)
  local c = counter(key, P, p)
  if target > 0 then
    local d = target - ((target - p) % P)
    if d > c then redis.call('SET', key, fmt(d)); c = d end
  end
  return c
end
"""

# KEYS: 1 seq counter, 2 message hash (seq -> body), 3 batch zset (score: a batch's first seq, member
# "first:last:append ms"), 4 byte counter, 5 this partition's copy of the wildcard version, 6 the writer's fence
# (the token of its last append here), 7.. queue zsets and de-duplication hashes (id -> the seq holding it).
# ARGV: 1 n, 2 wildcard version (-1: unchecked), 3 P, 4 p, 5 the node's clock (ms since EPOCH_MS * TICKS),
# 6 floor (a multiple of P above every seq the node has seen), 7 the fence token expected ('': unchecked), 8 this
# append's token, then per message: body, its index in the whole batch, k, k indexes into KEYS, the index of its
# de-duplication hash (0: none) and its key's id. A message whose key is held (in the hash, or by an earlier
# message of the batch) is not stored: its answer is minus the holder's seq.
# Fence: a writer with several appends in flight names, in each, the token of the one before it; an append whose
# predecessor has not run here yet (it arrived first on another connection, or failed) is refused with -2 and
# nothing is written, so a writer's batches are stored in the order it issued them.
# Seq of message i: max(previous seq of this partition + P, base + i*P + p), base = max(the node's clock held
# to at most MAX_AHEAD_MS past Redis TIME, floor): unique, ascending per partition, and, while no partition
# runs ahead, ascending in batch order across partitions too. Returns the seqs in order followed by the counter
# before the batch (the partition holds nothing else between it and the batch's last seq), -2 (nothing written)
# when the fence differs, or -1 (nothing written) when the wildcard version differs.
APPEND = _PART + f"""
local n, want, P, p = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
if ARGV[7] ~= '' and (redis.call('GET', KEYS[6]) or '') ~= ARGV[7] then return -2 end
if want >= 0 and tonumber(redis.call('GET', KEYS[5]) or '0') ~= want then return -1 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local base = math.max(math.min(tonumber(ARGV[5]), (now - {EPOCH_MS} + {MAX_AHEAD_MS}) * {TICKS}), tonumber(ARGV[6]))
base = base + ((P - base % P) % P)
local seq = counter(KEYS[1], P, p)
local before = seq
local seqs = {{}}
local taken = {{}}
local first = nil
local i = 9
for j = 1, n do
  local k = tonumber(ARGV[i + 2])
  local d = tonumber(ARGV[i + 3 + k])
  local tk, held = nil, nil
  if d > 0 then
    tk = d .. ':' .. ARGV[i + 4 + k]
    held = taken[tk] or redis.call('HGET', KEYS[d], ARGV[i + 4 + k])
  end
  if held then
    seqs[j] = -tonumber(held)
  else
    seq = math.max(seq + P, base + tonumber(ARGV[i + 1]) * P + p)
    seqs[j] = seq
    first = first or seq
    if tk then taken[tk] = seq end
  end
  i = i + 5 + k
end
if seq >= {MAX_SEQ} then return redis.error_reply('tidewire: seq past 2^53') end
local adds = {{}}
local fields = {{}}
local bytes = 0
i = 9
for j = 1, n do
  local s = seqs[j]
  local k = tonumber(ARGV[i + 2])
  if s > 0 then
    local body = ARGV[i]
    bytes = bytes + #body
    fields[#fields + 1] = s
    fields[#fields + 1] = body
    for q = 1, k do
      local idx = tonumber(ARGV[i + 2 + q])
      local a = adds[idx]
      if not a then a = {{}}; adds[idx] = a end
      a[#a + 1] = s
      a[#a + 1] = s
    end
    local d = tonumber(ARGV[i + 3 + k])
    if d > 0 then redis.call('HSET', KEYS[d], ARGV[i + 4 + k], s) end
  end
  i = i + 5 + k
end
for x = 1, #fields, 2 * 500 do
  redis.call('HSET', KEYS[2], unpack(fields, x, math.min(x + 2 * 500 - 1, #fields)))
end
for idx, a in pairs(adds) do
  for x = 1, #a, 2 * 500 do
    redis.call('ZADD', KEYS[idx], unpack(a, x, math.min(x + 2 * 500 - 1, #a)))
  end
end
if first then
  redis.call('SET', KEYS[1], fmt(seq))
  redis.call('INCRBY', KEYS[4], bytes)
  redis.call('ZADD', KEYS[3], first, string.format('%.0f:%.0f:%.0f', first, seq, now))
end
redis.call('SET', KEYS[6], ARGV[8], 'PX', {FENCE_TTL_MS})
seqs[n + 1] = before
return seqs
"""

# KEYS: 1 seq counter, 2 message hash, 3 queue zset, 4 spread set. ARGV: 1 after_seq, 2 limit, 3 seal target
# (0: none), 4 P, 5 p, 6 queue name, 7 1 if this is the queue's home partition (check the spread set).
# Returns {counter after the seal, seqs, bodies, spread}: a body is nil when retention removed it after the
# range was taken; spread = 1 (and nothing read) when a plain queue also holds other topics' messages.
READ = _PART + """
local P, p = tonumber(ARGV[4]), tonumber(ARGV[5])
local c = seal(KEYS[1], tonumber(ARGV[3]), P, p)
if ARGV[7] == '1' and redis.call('SISMEMBER', KEYS[4], ARGV[6]) == 1 then return {c, {}, {}, 1} end
local seqs = redis.call('ZRANGEBYSCORE', KEYS[3], '(' .. ARGV[1], '+inf', 'LIMIT', 0, tonumber(ARGV[2]))
local bodies = {}
if #seqs > 0 then hmget_into(bodies, KEYS[2], seqs) end
return {c, seqs, bodies, 0}
"""

# KEYS: 1 seq counter. ARGV: 1 target, 2 P, 3 p. Returns the counter after sealing up to the target.
SEAL = _PART + """
return seal(KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]))
"""

# KEYS: 1 seq counter, 2 spread set. ARGV: 1 P, 2 p, 3.. plain queue names that are about to receive messages
# of other topics (so their reads must cover every partition). Returns the counter.
MARK_SPREAD = _PART + """
redis.call('SADD', KEYS[2], unpack(ARGV, 3))
return counter(KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]))
"""

# KEYS: 1 a partition's copy of the wildcard version. ARGV: 1 version. Only ever raised; returns the copy.
RAISE_VERSION = """
local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
local v = tonumber(ARGV[1])
if v > cur then redis.call('SET', KEYS[1], ARGV[1]); return v end
return cur
"""

# KEYS: 1 message hash, 2 batch zset, 3 byte counter, 4 trimmed (the highest seq removed), 5 holds (holder ->
# seq). ARGV: 1 max age ms (0: none), 2 byte budget (0: none), 3 max seqs to visit, 4 queue key prefix, 5 P,
# 6 '1' to honour the holds.
# Deletes the oldest batches (appended longer than max age ago by Redis TIME, then more while the bytes exceed
# the budget), none above the lowest hold when honouring them, and removes their messages from every queue
# their body names. Returns {visited, deleted}; the caller repeats while visited equals ARGV[3], so one call
# never blocks Redis for long. Bodies are `store.records` message records: v1 (magic, version 1) or legacy v0;
# a record of a newer version is deleted without its queue entries (its layout is unknown here; a read skips
# a seq whose body is gone).
RETENTION = LUA_LIB + """
local V0, V1, MAGIC = '<i8i8i8BBHHI4I4HI4', '<i8i8i8BBBHHI4I4HI4', 'TWLOG\\0\\255'
local function queues_of(body)
  local _, lpub, ltopic, lprops, lpay, nq, lq, pos
  if string.sub(body, 1, 7) ~= MAGIC then
    _, _, _, _, _, lpub, ltopic, lprops, lpay, nq, lq, pos = struct.unpack(V0, body)
  elseif string.byte(body, 8) == 1 then
    _, _, _, _, _, _, lpub, ltopic, lprops, lpay, nq, lq, pos = struct.unpack(V1, body, 9)
  else
    return {}
  end
  if nq == 0 then return {} end
  local at = pos + lpub + ltopic + lprops + lpay
  return split(string.sub(body, at, at + lq - 1), '\\0')
end
local max_age, max_bytes, budget, P = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[5])
local keep = math.huge  -- no seq above this is deleted: a reader holding it has not read them
if ARGV[6] == '1' then
  for _, v in ipairs(redis.call('HVALS', KEYS[5])) do keep = math.min(keep, tonumber(v)) end
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local bytes = tonumber(redis.call('GET', KEYS[3]) or '0')
local visited, deleted, high = 0, 0, 0
while visited < budget do
  local head = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
  if not head then break end
  local parts = split(head, ':')
  local first, last, at = tonumber(parts[1]), tonumber(parts[2]), tonumber(parts[3])
  local aged = max_age > 0 and at <= now - max_age
  if first > keep or not (aged or (max_bytes > 0 and bytes > max_bytes)) then break end
  local s = first
  while s <= last and s <= keep and visited < budget and (aged or (max_bytes > 0 and bytes > max_bytes)) do
    local body = redis.call('HGET', KEYS[1], s)
    if body then
      bytes = bytes - #body
      for _, q in ipairs(queues_of(body)) do redis.call('ZREM', ARGV[4] .. q, s) end
      redis.call('HDEL', KEYS[1], s)
      deleted = deleted + 1
      high = s
    end
    s = s + P
    visited = visited + 1
  end
  if s ~= first then redis.call('ZREM', KEYS[2], head) end
  if s <= last then
    -- stopped inside a batch (budget, bytes or a hold): the rest of it stays first in line
    if s ~= first then redis.call('ZADD', KEYS[2], s, string.format('%.0f:%.0f:%.0f', s, last, at)) end
    break
  end
end
redis.call('SET', KEYS[3], fmt(bytes))
-- oldest first: a later deletion is always higher
if high > 0 then redis.call('SET', KEYS[4], fmt(high)) end
return {visited, deleted}
"""

# KEYS: 1 message hash, 2 byte counter, 3 seq counter. Returns {messages, bytes, counter or -1}.
PART_STATS = """
return {redis.call('HLEN', KEYS[1]), tonumber(redis.call('GET', KEYS[2]) or '0'),
        tonumber(redis.call('GET', KEYS[3]) or '-1')}
"""

# --- meta scripts (hash tag {prefix}) ----------------------------------------------------------------------

# KEYS: 1 filter -> holder count hash, 2 version, 3 the holder's set of filters. ARGV: 1 +1 or -1, 2.. filters.
# A filter counts once per holder (a repeated add or remove changes nothing). Returns the version (bumped when a
# filter entered or left the set).
WILDCARDS_CHANGE = """
local changed = false
local add = ARGV[1] == '1'
for i = 2, #ARGV do
  local f = ARGV[i]
  if add then
    if redis.call('SADD', KEYS[3], f) == 1 and redis.call('HINCRBY', KEYS[1], f, 1) == 1 then changed = true end
  elseif redis.call('SREM', KEYS[3], f) == 1 then
    local n = tonumber(redis.call('HGET', KEYS[1], f) or '0')
    if n > 1 then redis.call('HINCRBY', KEYS[1], f, -1)
    elseif n == 1 then redis.call('HDEL', KEYS[1], f); changed = true end
  end
end
if changed then return redis.call('INCR', KEYS[2]) end
return tonumber(redis.call('GET', KEYS[2]) or '0')
"""

# KEYS: as WILDCARDS_CHANGE. Every filter of the holder counts one holder less; its set is deleted. Returns the
# version.
WILDCARDS_RELEASE = """
local changed = false
for _, f in ipairs(redis.call('SMEMBERS', KEYS[3])) do
  local n = tonumber(redis.call('HGET', KEYS[1], f) or '0')
  if n > 1 then redis.call('HINCRBY', KEYS[1], f, -1)
  elseif n == 1 then redis.call('HDEL', KEYS[1], f); changed = true end
end
redis.call('DEL', KEYS[3])
if changed then return redis.call('INCR', KEYS[2]) end
return tonumber(redis.call('GET', KEYS[2]) or '0')
"""

# KEYS: 1 count hash, 2 version. Returns {version, filters}.
WILDCARDS_GET = """
return {tonumber(redis.call('GET', KEYS[2]) or '0'), redis.call('HKEYS', KEYS[1])}
"""

# KEYS: 1 retained hash (topic -> body), 2 set of first levels, 3 bucket set of this topic's first level, 4 the
# bytes of the bodies in KEYS[1]. ARGV: 1 topic, 2 first level, 3 body (absent: delete).
SET_RETAINED = """
redis.call('INCRBY', KEYS[4], (ARGV[3] and #ARGV[3] or 0) - redis.call('HSTRLEN', KEYS[1], ARGV[1]))
if ARGV[3] then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
  redis.call('SADD', KEYS[3], ARGV[1])
  redis.call('SADD', KEYS[2], ARGV[2])
elseif redis.call('HDEL', KEYS[1], ARGV[1]) == 1 then
  redis.call('SREM', KEYS[3], ARGV[1])
  if redis.call('SCARD', KEYS[3]) == 0 then redis.call('SREM', KEYS[2], ARGV[2]) end
end
return 0
"""

# KEYS: 1 retained hash, 2 set of first levels. ARGV: 1 filter, 2 bucket key prefix (bucket = prefix .. level).
# MQTT matching (4.7): '+' one level, '#' the rest including the parent ("a/#" matches "a"), and a filter
# whose first level is a wildcard never matches a topic starting with '$'. Returns the matching bodies.
MATCH_RETAINED = LUA_LIB + """
local f = split(ARGV[1], '/')
local function matches(topic)
  local t = split(topic, '/')
  for i = 1, #f do
    local lv = f[i]
    if lv == '#' then return true end
    if i > #t then return false end
    if lv ~= '+' and lv ~= t[i] then return false end
  end
  return #f == #t
end
local wild_first = f[1] == '+' or f[1] == '#'
local levels
if wild_first then levels = redis.call('SMEMBERS', KEYS[2]) else levels = {f[1]} end
local out = {}
for _, lv in ipairs(levels) do
  if not (wild_first and string.sub(lv, 1, 1) == '$') then
    local hit = {}
    for _, topic in ipairs(redis.call('SMEMBERS', ARGV[2] .. lv)) do
      if matches(topic) then hit[#hit + 1] = topic end
    end
    hmget_into(out, KEYS[1], hit)
  end
end
return out
"""

# KEYS: 1 sessions, 2 retained, 3 wills. Returns their sizes.
META_STATS = """
return {redis.call('HLEN', KEYS[1]), redis.call('HLEN', KEYS[2]), redis.call('HLEN', KEYS[3])}
"""


# KEYS: 1 lease hash {owner, until, epoch}. ARGV: 1 owner, 2 ttl ms. Returns the epoch if ARGV[1] holds the lease
# now (taken or renewed), 0 if another owner holds it. Server time: every node's lease ends on one clock.
LEASE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local holder = redis.call('HGET', KEYS[1], 'owner')
local untl = tonumber(redis.call('HGET', KEYS[1], 'until') or '0')
local epoch = tonumber(redis.call('HGET', KEYS[1], 'epoch') or '0')
if holder and holder ~= '' and holder ~= ARGV[1] and untl > now then
  return 0
end
if holder ~= ARGV[1] or untl <= now then
  epoch = epoch + 1
end
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'until', now + tonumber(ARGV[2]), 'epoch', epoch)
return epoch
"""

# KEYS: 1 lease hash. ARGV: 1 owner. Ends the lease now if ARGV[1] holds it (the epoch is kept).
RELEASE = """
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] then
  redis.call('HSET', KEYS[1], 'owner', '', 'until', 0)
end
return 0
"""

# KEYS: 1 a scope's de-duplication hash in one partition. ARGV: ids to release (none: all of them).
RELEASE_DEDUPE = """
if #ARGV == 0 then return redis.call('DEL', KEYS[1]) end
return redis.call('HDEL', KEYS[1], unpack(ARGV))
"""

DEDUPE_IDS = """
return redis.call('HKEYS', KEYS[1])
"""
