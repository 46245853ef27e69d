"""The Redis store engine's log for readers (`store.base.LogSource`) and its retention: `read_log` walks one
partition in seq order, `hold_log` keeps retention from removing what a reader has not read yet, and
`enforce_retention` honours those holds. A mixin of `RedisStore`; each call is one script (or one command) on
one partition's hash tag `{prefix:p}`, so every call is valid on Redis Cluster.

Keys, per partition (with those `store.redis.engine` lists; `PartitionKeys` names them all):

    {tw:p}:trimmed  string  the highest seq retention has removed from p (absent: none yet)
    {tw:p}:holds    hash    holder (1 to 64 utf-8 bytes) -> seq: retention removes no seq above the lowest

**Reading.** A partition has no index of every seq it holds, but its batch zset `:bt` spans them: one entry per
append batch, score = the batch's first seq, member "first:last:append ms", batches disjoint and ascending. A
batch's seqs are among first, first + P, ... last (all ≡ p mod P); with P > 1 a batch spread over partitions
leaves gaps there (a message's seq steps by P per message of the whole batch), and retention may have removed
some: a candidate whose HMGET is nil is skipped. `READ_LOG` starts at the batch holding `after` and visits
candidates in order, at most `READ_LOG_VISITS` per call (so one call never holds Redis for long), HMGET
`READ_LOG_CHUNK` at a time.

**upto.** Cut at the limit or at the visit bound, `upto` is the last candidate visited (the last record at the
limit): the caller simply asks again from there (so a slice shorter than the limit, even an empty one, does not mean
caught up; an empty one with `upto` == after_seq does). Otherwise `upto` is the partition's counter, read in the
same script, and no seal is needed: the store's seals exist so that a reader merging several partitions gets one
bound valid for all of them, but a log reader reads one partition, and every append to it is one atomic script on
this same key that assigns seqs above the counter (at least counter + P) and then raises it to its last seq. So when
the read script runs, every seq of p at or below the counter is written or never will be, and every later append
lands above it. (As everywhere in this engine, this holds for what Redis keeps: a write lost to a host crash without
`appendfsync always`, or to a failover, can roll the counter back.)

**Holds and retention.** `enforce_retention` deletes, per partition, the oldest batches appended more than
`retention_seconds` ago (Redis TIME) and more while the partition's bytes exceed `retention_bytes / P`,
`RETENTION_STEP` seqs per script call, and never a seq above the lowest hold of that partition (read by the
same script, so a hold set before the call is always seen) unless the store was built with
`retention_ignores_holds=True`. Holds are plain Redis data: they survive restarts and outlive the reader.
"""

from __future__ import annotations

from typing import Any

from tidewire.store.base import LogSlice, Message
from tidewire.store.records import decode_message_body
from tidewire.store.redis.conn import RedisConn, Script
from tidewire.store.redis.scripts import RETENTION

READ_LOG_VISITS = 20_000  # candidate seqs one read_log script call may visit
READ_LOG_CHUNK = 1000  # candidates per HMGET inside that script
RETENTION_STEP = 1000  # seqs one retention script call may visit: keeps each call short
MAX_HOLDER_BYTES = 64  # utf-8 bytes of a holder name: the embedded engine's limit, so a name works on both

# KEYS: 1 seq counter, 2 message hash, 3 batch zset, 4 trimmed. ARGV: 1 after_seq, 2 limit, 3 max candidates to
# visit, 4 P, 5 p. Returns {upto, trimmed, seqs, bodies} (see the module docstring). Read-only.
READ_LOG = f"""
local after, limit, budget = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local P, p = tonumber(ARGV[4]), tonumber(ARGV[5])
local c = redis.call('GET', KEYS[1])
if c then c = tonumber(c) else c = p - P end
local trimmed = tonumber(redis.call('GET', KEYS[4]) or '0')
local seqs, bodies = {{}}, {{}}
local visited = 0
local pos = after  -- the last candidate visited: every seq of p in (after, pos] has been looked at
local function full() return #seqs >= limit or visited >= budget end
-- Visit the candidates of one batch above pos; true when the call must stop (limit or visit bound).
local function walk(member)
  local a, b = string.match(member, '^(%d+):(%d+):')
  local first, last = tonumber(a), tonumber(b)
  local s = pos + 1
  s = s + (p - s) % P
  if s < first then s = first end
  while s <= last do
    if full() then return true end
    local n = math.min({READ_LOG_CHUNK}, math.floor((last - s) / P) + 1, budget - visited)
    local fields = {{}}
    for i = 1, n do fields[i] = s + (i - 1) * P end
    local got = redis.call('HMGET', KEYS[2], unpack(fields))
    for i = 1, n do
      visited = visited + 1
      pos = fields[i]
      if got[i] then
        seqs[#seqs + 1] = pos
        bodies[#bodies + 1] = got[i]
        if #seqs >= limit then return true end
      end
    end
    s = pos + P
  end
  return full()
end
local cut = limit <= 0
if not cut then
  local head = redis.call('ZREVRANGEBYSCORE', KEYS[3], ARGV[1], '-inf', 'LIMIT', 0, 1)[1]
  if head then cut = walk(head) end
end
local from = '(' .. ARGV[1]
while not cut do
  local page = redis.call('ZRANGEBYSCORE', KEYS[3], from, '+inf', 'LIMIT', 0, 100)
  for _, m in ipairs(page) do
    cut = walk(m)
    if cut then break end
  end
  if #page < 100 then break end
  from = '(' .. string.match(page[#page], '^(%d+):')
end
if cut then return {{pos, trimmed, seqs, bodies}} end
-- Not cut: the counter, unsealed. Appends to p are atomic scripts on this key that only assign seqs above it.
return {{math.max(c, after), trimmed, seqs, bodies}}
"""

_READ_LOG = Script("read_log", READ_LOG)
_RETENTION = Script("retention", RETENTION)


class PartitionKeys:
    """The keys of partition `n` under `prefix` (the layout of `store.redis.engine` and of this module)."""

    __slots__ = ("bt", "bytes", "dd", "holds", "msg", "n", "q", "seq", "spread", "trimmed", "writer", "wv")

    def __init__(self, prefix: str, n: int) -> None:
        t = f"{{{prefix}:{n}}}:"
        self.n = n
        self.seq, self.msg, self.bt, self.bytes = t + "seq", t + "msg", t + "bt", t + "bytes"
        self.wv, self.spread, self.q = t + "wv", t + "spread", t + "q:"
        self.trimmed, self.holds = t + "trimmed", t + "holds"
        self.writer = t + "w:"  # + a store instance's id: the token of its last append here (the append fence)
        self.dd = t + "dd:"  # + a scope: its de-duplication keys held in this partition, id -> seq (`Message.dedupe`)


class RedisLog:
    """The log reader calls and retention of `store.base.Store` on Redis: a mixin of `RedisStore`, over its
    connection `_conn` and partition keys `_parts`."""

    _conn: RedisConn
    _parts: list[PartitionKeys]
    partitions: int
    retention_bytes: int
    retention_seconds: int
    retention_ignores_holds: bool

    def log_partitions(self) -> int:
        return self.partitions

    def _log_part(self, partition: int) -> PartitionKeys:
        if not 0 <= partition < self.partitions:
            raise ValueError(f"no log partition {partition}: there are {self.partitions}")
        return self._parts[partition]

    async def read_log(self, partition: int, after_seq: int, limit: int) -> LogSlice:
        k = self._log_part(partition)
        upto, trimmed, seqs, bodies = await self._conn.run(
            (_READ_LOG, [k.seq, k.msg, k.bt, k.trimmed],
             [int(after_seq), max(0, int(limit)), READ_LOG_VISITS, self.partitions, partition]))
        out: list[Message] = []
        for s, body in zip(seqs, bodies, strict=True):
            m = decode_message_body(body)
            m.seq = int(s)
            out.append(m)
        return LogSlice(out, int(upto), int(trimmed))

    async def hold_log(self, partition: int, holder: str, seq: int) -> None:
        k = self._log_part(partition)
        if not 0 < len(holder.encode()) <= MAX_HOLDER_BYTES:
            raise ValueError(f"a holder name must be 1 to {MAX_HOLDER_BYTES} utf-8 bytes")
        if seq < 0:
            await self._conn.command("HDEL", k.holds, holder)
        else:
            await self._conn.command("HSET", k.holds, holder, int(seq))

    async def log_holds(self, partition: int) -> dict[str, int]:
        reply: Any = await self._conn.command("HGETALL", self._log_part(partition).holds)
        pairs = reply.items() if isinstance(reply, dict) else zip(reply[::2], reply[1::2], strict=True)
        return {(h.decode() if isinstance(h, bytes) else str(h)): int(v) for h, v in pairs}

    async def enforce_retention(self) -> int:
        """Delete the oldest batches past `retention_seconds` / `retention_bytes`, none above a hold (unless
        `retention_ignores_holds`); return how many messages."""
        if not (self.retention_bytes or self.retention_seconds):
            self._conn.check()
            return 0
        P = self.partitions
        budget = -(-self.retention_bytes // P) if self.retention_bytes else 0
        holds = 0 if self.retention_ignores_holds else 1
        todo = list(self._parts)
        total = 0
        while todo:
            results = await self._conn.run_many(
                [(_RETENTION, [k.msg, k.bt, k.bytes, k.trimmed, k.holds],
                  [self.retention_seconds * 1000, budget, RETENTION_STEP, k.q, P, holds]) for k in todo])
            total += sum(int(deleted) for _, deleted in results)
            todo = [k for k, (visited, _) in zip(todo, results, strict=True) if int(visited) >= RETENTION_STEP]
        return total
