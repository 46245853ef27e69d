"""The Redis store engine: the `store.base.Store` protocol on one Redis or on a Redis Cluster.

**Partitions.** The log is split into P partitions (`partitions`: 1 to 64; default 1 for
`redis://`, 16 for `redis-cluster://`), each under its own hash tag `{prefix:p}` (so the cluster spreads them
over its masters) with its own sequence, message hash and queue indexes:

    {tw:p}:seq     string  the partition's counter: last seq assigned or sealed there (see scripts.py)
    {tw:p}:msg     hash    seq -> message body (`store.records` encoding; header seq 0, the field is the seq)
    {tw:p}:q:<queue>  zset seqs indexed into a queue (score = member = seq), read by ZRANGEBYSCORE
    {tw:p}:bt, :bytes      retention bookkeeping: one entry per append batch, live body bytes
    {tw:p}:wv      string  this partition's copy of the wildcard set version (checked by every append)
    {tw:p}:spread  set     plain queue names that hold messages of other topics (read across all partitions)
    {tw:p}:trimmed, :holds  the log reader's: the highest seq retention removed, holder -> seq (`store.redis.log`)
    {tw:p}:dd:<scope>  hash  de-duplication keys held (`Message.dedupe`): id -> seq, written by the append script

Sessions, offsets, retained, wills and the wildcard set live under the meta tag `{prefix}` (`store.redis.meta`),
and so do consumer groups (`store.redis.groups`: one script per call; `fetch` reads each seq's partition).
A message goes to the partition of its topic (crc32 of the topic), so per-topic order holds. A queue whose name
has a '+' or '#' (first-level `a/#`, wildcard and `p2p#` queues) is read from every partition, pipelined (one
round trip per Redis node, in parallel); a plain queue (a topic's own queue) from its topic's partition only. A
plain queue that is given messages of another topic is marked "spread" in its home partition before such an
append (one extra round trip, never taken by the gateway's layout), and from then on is read everywhere.

**Seqs** are hybrid-clock values, comparable across partitions, so one cursor walks the merge of a session's
queues: seq = max(partition counter + P, base + i*P + p) for message i of a batch in partition p, where base is
the node's clock (ms since 2025 * 4096, held to at most a minute past Redis TIME) raised above every seq this
store has seen. Seqs are unique (seq ≡ p mod P), ascending per partition (so per topic), below 2**53 until 2094,
and, while no partition runs ahead, ascending in batch order across partitions too.

**Completeness.** A partition is sealed up to counter + P - 1: no later append there gets a lower seq. A read
answers `upto` = the lowest sealed value over the partitions it read (or the last message when cut at the
limit), after raising each partition read to at least max(`seal`, the highest seq this store has seen), in
the same script. So `upto` covers this store's own appends, `seal`, and every append another node made that
some node has sealed since: each open store seals every partition to the highest counter it saw every
`seal_interval` (0.1 s). `last_seq()` is the lowest sealed value seen across all partitions (that background
task, and reads of every partition): sealed, no I/O, and with P > 1 up to two intervals behind the newest seq
(with P = 1 it also follows this store's own appends at once).

**Wildcards.** The set and its holder counts live under the meta tag; each partition keeps a copy of the
version, which add/remove raise on every partition before returning, and which the append script compares with
the caller's version. A batch refused by all its partitions raises `StaleWildcards` (nothing stored); one
refused by only some overlapped a change of the set (it started before that change returned), so the refused
partitions take their part unchecked. `wildcards()` also repairs copies left behind by a failed add/remove.

**Round trips.** P = 1: `append` one EVALSHA per batch, `read` one EVALSHA. P > 1: `append` one EVALSHA per
partition the batch touches, pipelined; a plain-queue read one EVALSHA; a `+`/`#` queue read P EVALSHAs,
pipelined (one round trip per node). Session, offsets, retained and wildcard calls: one script each (plus
P pipelined version copies after a wildcard change). After NOSCRIPT a call is resent once as EVAL.

**Durability.** With `appendonly yes` + `appendfsync always` Redis fsyncs each write before replying, so what
returned is durable and `sync()` issues nothing. Redis writes the AOF before replying under any policy, so a
Redis *process* crash loses nothing acknowledged; a host crash or power loss loses up to ~1-2 s of writes with
`everysec`, whatever the kernel had not flushed (~30 s) with `no`, and everything since the last snapshot
without AOF. A lost seal can then let a later append take a seq a reader already passed. On a cluster with
replicas, a failover loses what the replica had not received yet (replication is asynchronous; no WAIT).
`open()` reads the policy of every primary (`durable`: True, False, or None where CONFIG is denied) and warns
unless `always`.

**Replicas** (`replicas` > 0, one Redis, usually behind Sentinel): `sync()` waits until that many replicas
hold every write, and after a failover appends again what only the old primary may have had
(`store/redis/replicas.py`).

**The log for readers** (`read_log`, one partition at a time in seq order, and holds) and **retention**
(`enforce_retention`: the oldest batches past `retention_seconds` / `retention_bytes / P` per partition, removed
from their queues too, never above a reader's hold unless `retention_ignores_holds`; sessions, retained and
wills are kept) are in `store.redis.log`.

Errors: `RedisUnavailable` (an `OSError`) while Redis cannot serve, `StoreClosed` on a closed store, see
`store.redis.conn`; an append that failed may or may not have been stored (at-least-once on the caller's retry).
Limits: `max_connections` (per node on a cluster), `connect_timeout`, `socket_timeout`, `pool_timeout`;
`epoch_ttl` (how long a client id without a record keeps its epoch, `store.redis.meta`); calls that read many
sessions go `store.redis.meta.PAGE` at a time (`list_sessions` still returns them all: maintenance, never a
node's start); `list_wills` reads one whole hash; the spread-queue caches keep `SPREAD_CACHE` names.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import zlib
from collections.abc import Sequence
from typing import Any

from tidewire.errors import StaleWildcards, StoreClosed
from tidewire.store.base import (
    SHARED_PREFIX,
    Ban,
    Message,
    SessionRecord,
    Slice,
    WillRecord,
)
from tidewire.store.records import decode_message_body, encode_message_body
from tidewire.store.redis.conn import CLUSTER_SCHEMES, Call, RedisConn, RedisUnavailable, Script
from tidewire.store.redis.fence import AppendFence
from tidewire.store.redis.groups import RedisGroups
from tidewire.store.redis.log import PartitionKeys as _Partition
from tidewire.store.redis.log import RedisLog
from tidewire.store.redis.members import RedisMembers
from tidewire.store.redis.meta import EPOCH_TTL, RedisMeta
from tidewire.store.redis.replicas import BACKLOG, ReplicaWaits
from tidewire.store.redis.scripts import (
    APPEND,
    DEDUPE_IDS,
    EPOCH_MS,
    MARK_SPREAD,
    PART_STATS,
    RAISE_VERSION,
    READ,
    RELEASE_DEDUPE,
    SEAL,
    TICKS,
)

__all__ = ["RedisStore", "RedisUnavailable"]

log = logging.getLogger("tidewire.store")

DEFAULT_CLUSTER_PARTITIONS = 16
MAX_PARTITIONS = 64
SEAL_INTERVAL = 0.1  # seconds between background seals of every partition
SPREAD_CACHE = 10_000  # plain queue names remembered as spread / already marked
APPEND_DEPTH = 2  # appends a caller may have in flight: the fence keeps them in call order
FENCED = -2  # the append script's answer when the fence differs

_APPEND = Script("append", APPEND)
_READ = Script("read", READ)
_SEAL = Script("seal", SEAL)
_MARK = Script("mark_spread", MARK_SPREAD)
_RAISE = Script("raise_version", RAISE_VERSION)
_PART_STATS = Script("part_stats", PART_STATS)
_DEDUPE_IDS = Script("dedupe_ids", DEDUPE_IDS)
# KEYS: 1 a queue zset. ARGV: 1 after seq, 2 limit. Returns {count above ARGV[1], the newest ARGV[2] seqs, newest
# first}: both from the zset's end (ZCOUNT, ZREVRANGE), never a walk over the queue.
_QUEUE_TAIL = Script("queue_tail", """
local after = '(' .. ARGV[1]
return {redis.call('ZCOUNT', KEYS[1], after, '+inf'),
        redis.call('ZREVRANGEBYSCORE', KEYS[1], '+inf', after, 'LIMIT', 0, tonumber(ARGV[2]))}
""")
_RELEASE_DEDUPE = Script("release_dedupe", RELEASE_DEDUPE)


def _wild(queue: str) -> bool:
    return "+" in queue or "#" in queue


class RedisStore(RedisGroups, RedisMembers, RedisLog):
    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        prefix: str = "tw",
        partitions: int = 0,
        retention_bytes: int = 0,
        retention_seconds: int = 0,
        connect_timeout: float = 2.0,
        socket_timeout: float = 5.0,
        max_connections: int = 64,
        pool_timeout: float = 5.0,
        seal_interval: float = SEAL_INTERVAL,
        retention_ignores_holds: bool = False,
        replicas: int = 0,
        replica_timeout: float = 1.0,
        replica_backlog: int = BACKLOG,
        epoch_ttl: float = EPOCH_TTL,
    ) -> None:
        if "{" in prefix or "}" in prefix:
            raise ValueError("prefix must not contain '{' or '}': it becomes the hash tag")
        if not partitions:
            partitions = DEFAULT_CLUSTER_PARTITIONS if url.startswith(CLUSTER_SCHEMES) else 1
        if not 1 <= partitions <= MAX_PARTITIONS:
            raise ValueError(f"partitions must be from 1 to {MAX_PARTITIONS}")
        if seal_interval <= 0:
            raise ValueError("seal_interval must be > 0")
        if replicas < 0:
            raise ValueError("replicas must be >= 0")
        if replicas and url.startswith(CLUSTER_SCHEMES):
            raise ValueError("replicas: a Redis Cluster store does not wait for replicas (one Redis or Sentinel)")
        if replicas and replica_timeout >= socket_timeout:
            raise ValueError(f"replica_timeout must be under socket_timeout ({socket_timeout} s)")
        self.url = url
        self.partitions = partitions
        self.retention_bytes = retention_bytes
        self.retention_seconds = retention_seconds
        self.retention_ignores_holds = retention_ignores_holds
        self.seal_interval = seal_interval
        self._conn = RedisConn(url, connect_timeout=connect_timeout, socket_timeout=socket_timeout,
                               max_connections=max_connections, pool_timeout=pool_timeout)
        self._meta = RedisMeta(self._conn, prefix, epoch_ttl)
        self._parts = [_Partition(prefix, n) for n in range(partitions)]
        self._init_groups(prefix, [part.msg for part in self._parts])
        self._init_members(prefix)
        self._hint = 0  # the highest seq or counter this store has seen: floor of its clock, seal of its reads
        self._sealed = 0  # last_seq(): sealed on every partition
        self._version_raised = 0  # every partition's version copy is known to be at least this
        self._spread: set[str] = set()  # plain queues known to be spread over partitions
        self._marked: set[str] = set()  # plain queues this store marked spread
        self._sealer: asyncio.Task[None] | None = None
        self._closing = False
        self._fence = AppendFence()
        # Several partitions (a Redis Cluster): one at a time. Two in flight let publishers outrun what other
        # nodes read back across the partitions (QoS 1 fan-in over 2 nodes: subscribers seconds behind).
        self.append_depth = APPEND_DEPTH if partitions == 1 else 1
        self.durable: bool | None = None  # set by open(): Redis fsyncs each write before replying
        self._replicas = ReplicaWaits(self._conn, self._meta.k_parts + ":sync", replicas, replica_timeout,
                                      replica_backlog) if replicas else None

    # --- lifecycle ----------------------------------------------------------------------------------------
    async def open(self) -> None:
        if self._conn.is_open:
            return
        await self._conn.open()
        self._closing = False
        try:
            await self._conn.command("SET", self._meta.k_parts, self.partitions, "NX")
            stored = int(await self._conn.command("GET", self._meta.k_parts))
            if stored != self.partitions:
                raise ValueError(f"the store under this prefix has {stored} partitions, not {self.partitions}")
            self.durable = await self._conn.durability()
            if self._replicas is not None:
                await self._replicas.start()
            await self._meta.index_sessions()
            await self.seal_now()  # learn every counter,
            await self.seal_now()  # then seal them all to the highest: last_seq() starts at the store's end
        except BaseException:
            await self._conn.close()
            raise
        self._sealer = asyncio.create_task(self._seal_loop(), name="redis-store-sealer")

    async def close(self) -> None:
        self._closing = True  # the loop also stops by itself if a library call swallows the cancel
        task, self._sealer = self._sealer, None
        if task is not None:
            task.cancel()
            await asyncio.wait({task}, timeout=2.0)
        await self._conn.close()

    async def _seal_loop(self) -> None:
        failing = False
        while not self._closing:
            await asyncio.sleep(self.seal_interval)
            if self._closing:
                return
            try:
                await self.seal_now()
            except StoreClosed:
                return
            except Exception as exc:  # keep sealing: the next tick is the retry
                if not failing:
                    log.warning("store: sealing the partitions failed (retrying every %.1fs): %s",
                                self.seal_interval, exc)
                failing = True
            else:
                if failing:
                    log.info("store: sealing the partitions works again")
                failing = False

    async def seal_now(self) -> int:
        """Seal every partition up to the highest seq this store has seen; returns the new `last_seq()`."""
        P = self.partitions
        target = self._hint
        counters = [int(c) for c in await self._conn.run_many(
            [(_SEAL, [part.seq], [target, P, part.n]) for part in self._parts])]
        self._saw(max(counters))
        self._sealed = max(self._sealed, min(counters) + P - 1)
        return self.last_seq()

    def last_seq(self) -> int:
        return self._sealed

    def _saw(self, seq: int) -> None:
        if seq > self._hint:
            self._hint = seq

    def _part_of(self, name: str) -> _Partition:
        return self._parts[zlib.crc32(name.encode()) % self.partitions]

    # --- messages -----------------------------------------------------------------------------------------
    async def append(self, messages: Sequence[Message], wildcard_version: int = -1) -> int | None:
        if not messages:
            self._conn.check()
            return None
        if self._replicas is None:
            return await self._append(list(messages), wildcard_version)  # keep nothing of the caller's list
        began = self._replicas.check_room()
        before = await self._append(list(messages), wildcard_version)
        self._replicas.appended(began, list(messages))
        return before

    async def _append(self, batch: list[Message], wildcard_version: int) -> int | None:
        now_ms = int(time.time() * 1000)
        P = self.partitions
        groups: dict[int, list[int]] = {}
        spread: dict[int, set[str]] = {}
        for i, m in enumerate(batch):
            if not m.timestamp_ms:
                m.timestamp_ms = now_ms  # as the embedded engine: retention by age needs a time
            if P == 1:
                groups.setdefault(0, []).append(i)
                continue
            groups.setdefault(self._part_of(m.topic).n, []).append(i)
            for q in m.queues:
                if q != m.topic and q not in self._marked and not _wild(q):
                    spread.setdefault(self._part_of(q).n, set()).add(q)
        ticket = self._fence.issue(groups)  # before any wait: appends take their places in call order
        try:
            if spread:
                await self._mark_spread(spread)
        except BaseException as exc:
            self._fence.failed(ticket, exc)
            raise
        clock = (now_ms - EPOCH_MS) * TICKS
        floor = self._hint + 1
        calls: list[Call] = []
        for n, idxs in groups.items():
            part = self._parts[n]
            keys: list[str | bytes] = [part.seq, part.msg, part.bt, part.bytes, part.wv, part.writer + self._fence.id]
            index: dict[str, int] = {}
            hashes: dict[str, int] = {}  # a scope's de-duplication hash -> its index in KEYS
            args: list[str | bytes | int] = [len(idxs), wildcard_version, P, n, clock, floor, ticket.expect[n],
                                             ticket.token]
            for i in idxs:
                m = batch[i]
                args += (encode_message_body(m, 0), i, len(m.queues))
                for q in m.queues:
                    k = index.get(q)
                    if k is None:
                        keys.append(part.q + q)
                        k = index[q] = len(keys)  # Lua KEYS are 1-based
                    args.append(k)
                if m.dedupe is None:
                    args += (0, "")
                else:
                    scope, key_id = m.dedupe
                    k = hashes.get(scope)
                    if k is None:
                        keys.append(part.dd + scope)
                        k = hashes[scope] = len(keys)
                    args += (k, key_id)
            calls.append((_APPEND, keys, args))
        try:
            results = await self._conn.run_many(calls, idempotent=False)
            fenced = [j for j, r in enumerate(results) if r == FENCED]
            if fenced:  # the append before this one has not landed here yet: wait for it, then go unchecked
                await self._fence.after_predecessors(ticket, [list(groups)[j] for j in fenced])
                again = await self._conn.run_many(
                    [(s, k, [*a[:6], "", *a[7:]]) for s, k, a in (calls[j] for j in fenced)], idempotent=False)
                for j, r in zip(fenced, again, strict=True):
                    results[j] = r
            refused = [j for j, r in enumerate(results) if isinstance(r, int)]
            if refused:
                if len(refused) == len(results):
                    raise StaleWildcards(wildcard_version)
                # Some partitions took the batch with this version: it started before the change of the set
                # returned, so its indexing is allowed to miss that change (see the module docstring).
                again = await self._conn.run_many(
                    [(s, k, [a[0], -1, *a[2:6], "", *a[7:]]) for s, k, a in (calls[j] for j in refused)],
                    idempotent=False)
                for j, r in zip(refused, again, strict=True):
                    results[j] = r
        except BaseException as exc:
            self._fence.failed(ticket, exc)
            raise
        self._fence.landed(ticket)
        high = 0
        before = -1
        for idxs, reply in zip(groups.values(), results, strict=True):
            seqs, before = reply[:-1], int(reply[-1])
            for i, s in zip(idxs, seqs, strict=True):
                seq = int(s)
                m = batch[i]
                m.duplicate = seq < 0  # its key was held: minus the holder's seq, nothing stored
                m.seq = abs(seq)
                high = max(high, seq)
        self._saw(high)
        if P == 1:
            self._sealed = max(self._sealed, high)  # one counter: whatever it reached is sealed
            return before  # the script numbered the batch atomically right after the counter's value
        return None  # queues read across partitions may hold other partitions' seqs in the batch's range

    async def _mark_spread(self, spread: dict[int, set[str]]) -> None:
        P = self.partitions
        calls: list[Call] = [(_MARK, [self._parts[n].seq, self._parts[n].spread], [P, n, *sorted(names)])
                             for n, names in spread.items()]
        counters = await self._conn.run_many(calls)
        # This append's seqs must pass whatever a reader of those queues already got as `upto` from their home
        # partition (read before the mark): the clock floor goes above those partitions' sealed values.
        self._saw(max(int(c) for c in counters) + P - 1)
        if len(self._marked) > SPREAD_CACHE:
            self._marked.clear()
        for names in spread.values():
            self._marked.update(names)
            self._remember_spread(names)

    def _remember_spread(self, names: set[str]) -> None:
        if len(self._spread) > SPREAD_CACHE:
            self._spread.clear()  # forgotten names are found again through the home partition's mark
        self._spread.update(names)

    async def read(self, queue: str, after_seq: int, limit: int, seal: int = 0) -> Slice:
        self._conn.check()
        if limit <= 0:
            return Slice([], after_seq)
        target = max(seal, self._hint)
        if self.partitions == 1:
            return await self._read_home(self._parts[0], queue, after_seq, limit, target, check=False)
        if _wild(queue) or queue in self._spread:
            return await self._read_all(queue, after_seq, limit, target)
        return await self._read_home(self._part_of(queue), queue, after_seq, limit, target, check=True)

    async def queue_tail(self, queue: str, after_seq: int, limit: int) -> tuple[int, list[int]]:
        # Every partition (one pipelined round trip per Redis node): a plain queue may be spread without this
        # store knowing yet, and an empty zset costs nothing.
        results = await self._conn.run_many(
            [(_QUEUE_TAIL, [part.q + queue], [after_seq, max(0, limit)]) for part in self._parts])
        newest = sorted(int(s) for _, seqs in results for s in seqs)
        return sum(int(c) for c, _ in results), newest[max(0, len(newest) - limit):] if limit > 0 else []

    @staticmethod
    def _read_args(part: _Partition, queue: str, after: int, limit: int, target: int, P: int,
                   check: bool) -> Call:
        return (_READ, [part.seq, part.msg, part.q + queue, part.spread],
                [after, limit, target, P, part.n, queue, 1 if check else 0])

    @staticmethod
    def _decode(seqs: list[bytes], bodies: list[bytes | None]) -> list[Message]:
        out: list[Message] = []
        for s, body in zip(seqs, bodies, strict=True):
            if body is None:
                continue  # trimmed by retention after the range was taken
            m = decode_message_body(body)
            m.seq = int(s)
            out.append(m)
        return out

    async def _read_home(self, part: _Partition, queue: str, after: int, limit: int, target: int,
                         check: bool) -> Slice:
        P = self.partitions
        c, seqs, bodies, spread = await self._conn.run(self._read_args(part, queue, after, limit, target, P, check))
        c = int(c)
        self._saw(c)
        if spread:
            self._remember_spread({queue})
            return await self._read_all(queue, after, limit, target)
        if P == 1:
            self._sealed = max(self._sealed, c)
        upto = int(seqs[-1]) if len(seqs) >= limit else c + P - 1
        return Slice(self._decode(seqs, bodies), max(upto, after))

    async def _read_all(self, queue: str, after: int, limit: int, target: int) -> Slice:
        P = self.partitions
        results = await self._conn.run_many(
            [self._read_args(part, queue, after, limit, target, P, False) for part in self._parts])
        counters = [int(r[0]) for r in results]
        self._saw(max(counters))
        self._sealed = max(self._sealed, min(counters) + P - 1)
        upto = min(int(seqs[-1]) if len(seqs) >= limit else c + P - 1
                   for c, (_, seqs, _, _) in zip(counters, results, strict=True))
        merged = [m for _, seqs, bodies, _ in results for m in self._decode(seqs, bodies) if m.seq <= upto]
        merged.sort(key=lambda m: m.seq)
        if len(merged) > limit:
            del merged[limit:]
            upto = merged[-1].seq
        return Slice(merged, max(upto, after))

    async def sync(self) -> None:
        # appendfsync always: every reply already followed its fsync (see the module docstring).
        self._conn.check()
        if self._replicas is not None:
            await self._replicas.sync(lambda batch: self._append(batch, -1))

    # --- the wildcard set -----------------------------------------------------------------------------------
    async def add_wildcards(self, filters: Sequence[str], holder: str) -> int:
        version = await self._meta.change_wildcards(filters, holder, add=True)
        await self._raise_versions(version)
        return version

    async def remove_wildcards(self, filters: Sequence[str], holder: str) -> int:
        version = await self._meta.change_wildcards(filters, holder, add=False)
        await self._raise_versions(version)
        return version

    async def release_wildcards(self, holder: str) -> int:
        version = await self._meta.release_wildcards(holder)
        await self._raise_versions(version)
        return version

    async def wildcards(self) -> tuple[int, frozenset[str]]:
        version, filters = await self._meta.wildcards()
        await self._raise_versions(version)
        return version, filters

    async def delete_group(self, name: str) -> None:
        await super().delete_group(name)
        await self._drop_members(name)  # a second script: a member left behind would only be counted

    async def _raise_versions(self, version: int) -> None:
        """Every partition's copy up to `version` before the caller learns it (copies only ever rise)."""
        if version <= self._version_raised:
            return
        await self._conn.run_many([(_RAISE, [part.wv], [version]) for part in self._parts])
        self._version_raised = max(self._version_raised, version)

    # --- sessions, retained, wills (store.redis.meta) -------------------------------------------------------
    async def lease(self, key: str, owner: str, ttl_ms: int) -> int:
        return await self._meta.lease(key, owner, ttl_ms)

    async def release(self, key: str, owner: str) -> None:
        await self._meta.release(key, owner)

    async def dedupe_ids(self, scope: str) -> list[str]:
        """Every partition's hash of the scope (a message's key lives in its topic's partition)."""
        replies = await self._conn.run_many([(_DEDUPE_IDS, [part.dd + scope], []) for part in self._parts])
        return [i.decode() if isinstance(i, bytes) else str(i) for ids in replies for i in ids]

    async def release_dedupe(self, scope: str, ids: Sequence[str] | None = None) -> None:
        # Lua's unpack takes a few thousand values at most: long lists go in chunks.
        chunks = [[]] if ids is None else [list(ids[i : i + 1000]) for i in range(0, len(ids), 1000)]
        await self._conn.run_many([(_RELEASE_DEDUPE, [part.dd + scope], chunk) for part in self._parts
                                   for chunk in chunks])

    async def get_session(self, client_id: str) -> SessionRecord | None:
        return await self._meta.get_session(client_id)

    def session_absent(self, client_id: str) -> bool:
        return False  # only a round trip could tell

    async def claim_session(self, client_id: str, owner: str) -> tuple[SessionRecord | None, int]:
        return await self._meta.claim_session(client_id, owner)

    async def put_session(self, record: SessionRecord) -> bool:
        return await self._meta.put_session(record)

    async def put_sessions(self, records: Sequence[SessionRecord]) -> list[bool]:
        """`put_session` for each record, pipelined: one round trip (imports, benchmarks)."""
        return await self._meta.put_sessions(records)

    async def delete_session(self, client_id: str, epoch: int = -1) -> None:
        await self._meta.delete_session(client_id, epoch)

    async def list_sessions(self) -> list[SessionRecord]:
        return await self._meta.list_sessions()

    async def set_offsets(self, offsets: dict[str, tuple[int, int, int]]) -> None:
        await self._meta.set_offsets(offsets)

    async def online_sessions(self) -> list[str]:
        return [c for c in await self._meta.online_sessions() if not c.startswith(SHARED_PREFIX)]

    async def due_sessions(self, now_ms: int, limit: int) -> list[str]:
        return await self._meta.due_sessions(now_ms, limit)

    async def session_count(self) -> int:
        return (await self._meta.stats())["sessions"]

    async def subscription_filters(self) -> dict[str, int]:
        return await self._meta.subscription_filters()

    async def shared_members(self, group_key: str) -> list[str]:
        return await self._meta.shared_members(group_key)

    async def subscribed(self, filters: Sequence[str]) -> bool:
        return await self._meta.subscribed(filters)

    async def set_retained(self, topic: str, message: Message | None) -> None:
        await self._meta.set_retained(topic, message)

    async def retained_usage(self) -> tuple[int, int]:
        return await self._meta.retained_usage()

    async def match_retained(self, topic_filter: str, after: str | None = None, limit: int = 0,
                             max_bytes: int = 0) -> list[Message]:
        return await self._meta.match_retained(topic_filter, after, limit, max_bytes)

    async def put_will(self, will: WillRecord) -> None:
        await self._meta.put_will(will)

    async def delete_will(self, client_id: str) -> None:
        await self._meta.delete_will(client_id)

    async def list_wills(self) -> list[WillRecord]:
        return await self._meta.list_wills()

    async def get_bans(self) -> list[Ban]:
        return await self._meta.get_bans()

    async def put_ban(self, ban: Ban) -> None:
        await self._meta.put_ban(ban)

    async def delete_ban(self, kind: str, who: str, expired_before: float | None = None) -> bool:
        return await self._meta.delete_ban(kind, who, expired_before)

    async def get_document(self, name: str) -> tuple[int, bytes]:
        return await self._meta.get_document(name)

    async def put_document(self, name: str, value: bytes, expected: int) -> int:
        return await self._meta.put_document(name, value, expected)

    # --- stats (the log for readers and retention: store.redis.log) ----------------------------------------
    async def stats(self) -> dict[str, Any]:
        parts = await self._conn.run_many([(_PART_STATS, [p.msg, p.bytes, p.seq], []) for p in self._parts])
        meta = await self._meta.stats()
        return {"messages": sum(int(r[0]) for r in parts), "bytes": sum(int(r[1]) for r in parts),
                "partitions": self.partitions, "last_seq": self._sealed,
                "max_seq": max(int(r[2]) for r in parts), **meta}

    async def __aenter__(self) -> RedisStore:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        with contextlib.suppress(Exception):
            await self.close()
