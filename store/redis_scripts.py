"""The Lua scripts of the Redis store engine: each store call that touches several keys is one atomic script.

Every key a script touches shares the store's hash tag (`{prefix}`), so a script is valid on Redis Cluster
too. Keys passed in KEYS are the declared ones; the scripts that walk an index (`MATCH_RETAINED`, `RETENTION`)
also build bucket/queue key names from a prefix in ARGV. That is legal only because every such key carries
the same hash tag (one slot); the partitioned layout of a later step must declare them or use one partition
per call.

Numbers cross the Lua boundary as doubles: seqs are exact up to 2**53, far beyond any realistic log.
`unpack` is limited by the Lua C stack (~8000 values), so bulk commands are issued in chunks of CHUNK.
"""

from __future__ import annotations

# Shared helpers, prepended to the scripts that need them.
_LIB = """
local CHUNK = 1000
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

# KEYS: 1 seq counter, 2 message hash (seq -> body), 3 batch-time zset (last seq of a batch scored by append
# time), 4 byte counter, 5.. queue zsets. ARGV: 1 n, 2 now_ms, then per message: body, k, k indexes into KEYS.
# Returns the last seq assigned; the batch got last-n+1 .. last, in order.
APPEND = """
local n = tonumber(ARGV[1])
local last = redis.call('INCRBY', KEYS[1], n)
local seq = last - n
local adds = {}
local fields = {}
local bytes = 0
local i = 3
for _ = 1, n do
  seq = seq + 1
  local body = ARGV[i]
  bytes = bytes + #body
  fields[#fields + 1] = seq
  fields[#fields + 1] = body
  local k = tonumber(ARGV[i + 1])
  for j = 1, k do
    local idx = tonumber(ARGV[i + 1 + j])
    local a = adds[idx]
    if not a then a = {}; adds[idx] = a end
    a[#a + 1] = seq
    a[#a + 1] = seq
  end
  i = i + 2 + k
end
for p = 1, #fields, 2 * 500 do
  redis.call('HSET', KEYS[2], unpack(fields, p, math.min(p + 2 * 500 - 1, #fields)))
end
for idx, a in pairs(adds) do
  for p = 1, #a, 2 * 500 do
    redis.call('ZADD', KEYS[idx], unpack(a, p, math.min(p + 2 * 500 - 1, #a)))
  end
end
redis.call('INCRBY', KEYS[4], bytes)
redis.call('ZADD', KEYS[3], ARGV[2], last)
return last
"""

# KEYS: 1 queue zset, 2 message hash. ARGV: 1 after_seq, 2 limit. Returns {seqs, bodies} (a body is nil when
# retention removed it between the two lookups of an older index entry: the caller skips it).
READ = _LIB + """
local seqs = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. ARGV[1], '+inf', 'LIMIT', 0, tonumber(ARGV[2]))
if #seqs == 0 then return {} end
local bodies = {}
hmget_into(bodies, KEYS[2], seqs)
return {seqs, bodies}
"""

# KEYS: 1 session hash, 2 offset hash. ARGV: client id, packed offsets, ... Unknown sessions are skipped.
SET_OFFSETS = """
for i = 1, #ARGV, 2 do
  if redis.call('HEXISTS', KEYS[1], ARGV[i]) == 1 then
    redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
  end
end
return 0
"""

# KEYS: 1 retained hash (topic -> body), 2 set of first levels, 3 bucket set of this topic's first level.
# ARGV: 1 topic, 2 first level, 3 body (absent: delete).
SET_RETAINED = """
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
MATCH_RETAINED = _LIB + """
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

# KEYS: 1 message hash, 2 first-live-seq counter, 3 batch-time zset, 4 byte counter, 5 seq counter.
# ARGV: 1 time cutoff ms (0: none), 2 byte budget (0: none), 3 max messages to delete, 4 queue key prefix.
# Deletes the oldest messages (those appended at or before the cutoff, then more while over the byte budget)
# and removes them from every queue their body names. Returns how many seqs it passed; the caller repeats
# while that equals ARGV[3], so one call never blocks Redis for long.
RETENTION = _LIB + """
local HEADER = '<i8i8i8BBHHI4I4HI4'
local cutoff, max_bytes, budget = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local first = tonumber(redis.call('GET', KEYS[2]) or '1')
local last = tonumber(redis.call('GET', KEYS[5]) or '0')
local upto = first - 1
if cutoff > 0 then
  local r = redis.call('ZREVRANGEBYSCORE', KEYS[3], cutoff, '-inf', 'LIMIT', 0, 1)
  if r[1] then upto = math.max(upto, tonumber(r[1])) end
end
local bytes = tonumber(redis.call('GET', KEYS[4]) or '0')
local s, done = first, 0
while s <= last and done < budget do
  if not (s <= upto or (max_bytes > 0 and bytes > max_bytes)) then break end
  local body = redis.call('HGET', KEYS[1], s)
  if body then
    bytes = bytes - #body
    local _, _, _, _, _, lpub, ltopic, lprops, lpay, nq, lq, pos = struct.unpack(HEADER, body)
    if nq > 0 then
      local at = pos + lpub + ltopic + lprops + lpay
      for _, q in ipairs(split(string.sub(body, at, at + lq - 1), '\\0')) do
        redis.call('ZREM', ARGV[4] .. q, s)
      end
    end
    redis.call('HDEL', KEYS[1], s)
  end
  s = s + 1
  done = done + 1
end
if done > 0 then
  redis.call('SET', KEYS[2], s)
  redis.call('SET', KEYS[4], bytes)
  -- drop batch-time entries of fully deleted batches (member = a batch's last seq); not by time, as a call
  -- that ran out of budget must leave the next one its cutoff
  while true do
    local head = redis.call('ZRANGE', KEYS[3], 0, 0)
    if not head[1] or tonumber(head[1]) >= s then break end
    redis.call('ZREMRANGEBYRANK', KEYS[3], 0, 0)
  end
end
return done
"""
