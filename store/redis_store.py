"""The Redis store engine: the `store.base.Store` protocol on one Redis (redis-py asyncio + hiredis).

First cut of issue 7 step 2. Layout (every key under one hash tag, `{tw}` by default, so the multi-key Lua
scripts of `store.redis_scripts` are valid on Redis Cluster too):

    {tw}:seq          string   the global sequence (INCRBY by the batch size in the append script)
    {tw}:msg          hash     seq -> message body (`store.records` encoding; the header's seq is 0 and the
                               field name is the seq)
    {tw}:q:<queue>    zset     seqs indexed into a queue (score = member = seq), read by ZRANGEBYSCORE
    {tw}:bt, :bytes, :first    retention bookkeeping: batch append times, live body bytes, first live seq
    {tw}:sess, :off   hash     client id -> session JSON / packed (offset, sent_upto) set by set_offsets
    {tw}:ret          hash     topic -> retained body;  {tw}:rl  set of first levels;  {tw}:rb:<level>  set
                               of the retained topics under a first level (match walks only those buckets)
    {tw}:will         hash     client id -> encoded will

**This cut pins everything to one shard.** A later step partitions the log by topic hash across P hash tags,
each with its own sequence, message hash and queue indexes; a session's offset then becomes one per partition.

Round trips: `append` is one EVALSHA per batch (seqs assigned, each body stored once, its seq ZADDed into every
queue it names, atomically); `read` is one EVALSHA (range + bodies); `set_offsets`, `set_retained`,
`match_retained` one script each; session calls one MULTI/EXEC pipeline. `register_script` reloads a script
after NOSCRIPT (e.g. after a Redis restart), which costs one extra round trip once.

Semantics match the embedded engine so the same gateway code runs on both: `append` assigns `seq` (and a
missing `timestamp_ms`) onto the caller's messages. `read` returns fresh objects decoded from Redis, and so do
`match_retained` and `list_wills` (stored copies are isolated from the caller, which the embedded engine does
not do yet). `last_seq()` is synchronous in the protocol, so it is a local high-water mark: the last seq this
process appended, or saw on `open()`. Appends by other nodes do not move it: that is exactly the protocol
weakness issue 7 calls out; a cluster needs an async, store-wide high-water mark.

Durability: with `appendonly yes` + `appendfsync always`, Redis fsyncs every write before replying, so
whatever returned is durable and `sync()` issues nothing. Redis writes the AOF before replying under any
policy, so a Redis *process* crash loses nothing acknowledged; a host crash or power loss loses up to ~1-2 s
with `everysec`, whatever the kernel had not flushed (~30 s) with `no`, and everything since the last snapshot
without AOF. `sync()` cannot close that gap on Redis 7.0 (`WAITAOF` needs 7.2), so `open()` reads the policy
(`durable`: True, False, or None where CONFIG is disabled) and logs a warning unless it is `always`.

Retention: `enforce_retention()` deletes the oldest messages appended before `retention_seconds` ago (by append
batch time) and while the body bytes exceed `retention_bytes`, and removes them from their queues, in bounded
script calls. Sessions, retained and wills are never trimmed.

Errors: while Redis is unreachable (refused, reset, timeout, LOADING, READONLY replica, OOM) every call raises
`RedisUnavailable`, a builtin `ConnectionError` and so an `OSError`, for the caller's retry with backoff.
redis-py's own retries are off; instead every idempotent call (all but `append`) is tried once more on a
connection error, because after a Redis restart each pooled connection fails its next command. `append` is
never retried here: a lost reply does not mean the script did not run, so a failed `append` is ambiguous and
the caller's retry may store the batch twice (at-least-once; a batch id to dedupe is future work).
Calls on a store that is not open raise `StoreClosed` (a `RuntimeError`: retrying will not help).

Limits: `max_connections` pooled connections (a caller waits up to `pool_timeout` for one), `connect_timeout`
and `socket_timeout` per command; `RETENTION_STEP` messages per retention script call; `list_sessions` and
`list_wills` fetch one whole hash (HSCAN paging is future work). Only `redis.asyncio.Redis` is used: the Lua
keys are Cluster-safe, but connecting through a `RedisCluster` client (`redis-cluster://`) is a later step.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar, cast

import redis.asyncio as aioredis
import redis.exceptions as rexc
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from store.base import Message, SessionRecord, WillRecord
from store.records import (
    OFFSETS,
    decode_message_body,
    decode_session,
    decode_will,
    encode_message_body,
    encode_session,
    encode_will,
)
from store.redis_scripts import APPEND, MATCH_RETAINED, READ, RETENTION, SET_OFFSETS, SET_RETAINED

log = logging.getLogger("tidewire.store")
T = TypeVar("T")

# Messages one retention script call may delete: keeps each call well under a millisecond-scale block.
RETENTION_STEP = 1000

_UNAVAILABLE = (
    rexc.ConnectionError,  # includes BusyLoadingError (LOADING), MaxConnectionsError, AuthenticationError
    rexc.TimeoutError,
    rexc.ReadOnlyError,  # failover: we talk to a replica
    rexc.OutOfMemoryError,
    rexc.ClusterDownError,
    rexc.TryAgainError,
)


class RedisUnavailable(ConnectionError):
    """Redis cannot be reached or cannot take writes now; retry later (an `OSError`)."""


class StoreClosed(RuntimeError):
    """A call on a store that is not open."""


def _unavailable(exc: Exception) -> RedisUnavailable:
    # redis-py messages carry host:port and errno text, never credentials.
    return RedisUnavailable(f"redis unavailable: {type(exc).__name__}: {exc}")


class RedisStore:
    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        prefix: str = "tw",
        retention_bytes: int = 0,
        retention_seconds: int = 0,
        connect_timeout: float = 2.0,
        socket_timeout: float = 5.0,
        max_connections: int = 64,
        pool_timeout: float = 5.0,
    ) -> None:
        if "{" in prefix or "}" in prefix:
            raise ValueError("prefix must not contain '{' or '}': it becomes the hash tag")
        if max_connections < 1:
            raise ValueError("max_connections must be >= 1")
        self.url = url
        self.retention_bytes = retention_bytes
        self.retention_seconds = retention_seconds
        self._connect_timeout = connect_timeout
        self._socket_timeout = socket_timeout
        self._max_connections = max_connections
        self._pool_timeout = pool_timeout
        k = f"{{{prefix}}}:"
        self._k_seq, self._k_msg, self._k_bt = k + "seq", k + "msg", k + "bt"
        self._k_bytes, self._k_first = k + "bytes", k + "first"
        self._k_sess, self._k_off, self._k_will = k + "sess", k + "off", k + "will"
        self._k_ret, self._k_levels, self._p_bucket = k + "ret", k + "rl", k + "rb:"
        self._p_queue = k + "q:"
        self._r: aioredis.Redis | None = None
        self._pool: aioredis.BlockingConnectionPool | None = None
        self._scripts: dict[str, Any] = {}
        self._high = 0
        self.durable: bool | None = None  # set by open(): Redis fsyncs each write before replying

    # --- lifecycle ----------------------------------------------------------------------------------------
    async def open(self) -> None:
        if self._r is not None:
            return
        pool = aioredis.BlockingConnectionPool.from_url(
            self.url, max_connections=self._max_connections, timeout=self._pool_timeout,
            socket_connect_timeout=self._connect_timeout, socket_timeout=self._socket_timeout,
            retry=Retry(NoBackoff(), 0),
        )
        r = aioredis.Redis(connection_pool=pool)
        try:
            high = await r.get(self._k_seq)
            durable = await self._check_durability(r)
        except _UNAVAILABLE as exc:
            await r.aclose()
            await pool.aclose()
            raise _unavailable(exc) from exc
        except BaseException:
            await r.aclose()
            await pool.aclose()
            raise
        self._high = max(self._high, int(high or 0))
        self.durable = durable
        self._r = r
        self._pool = pool
        self._scripts = {name: r.register_script(src) for name, src in (
            ("append", APPEND), ("read", READ), ("offsets", SET_OFFSETS), ("retained", SET_RETAINED),
            ("match", MATCH_RETAINED), ("retention", RETENTION))}

    async def _check_durability(self, r: aioredis.Redis) -> bool | None:
        try:
            conf = await r.config_get("append*")
        except rexc.ResponseError:  # CONFIG renamed or denied (managed Redis): unknown
            log.warning("store: cannot read the Redis AOF policy; acked writes are durable only with "
                        "appendonly yes + appendfsync always")
            return None
        get = {k.decode() if isinstance(k, bytes) else k: v for k, v in conf.items()}
        durable = get.get("appendonly") in (b"yes", "yes") and get.get("appendfsync") in (b"always", "always")
        if not durable:
            log.warning("store: Redis runs without appendonly yes + appendfsync always: a host crash can lose "
                        "acknowledged messages")
        return durable

    async def close(self) -> None:
        r, self._r = self._r, None
        pool, self._pool = self._pool, None
        if r is not None:
            await r.aclose()
        if pool is not None:
            await pool.aclose()

    def _client(self) -> aioredis.Redis:
        if self._r is None:
            raise StoreClosed("redis store is not open")
        return self._r

    async def _call(self, fn: Callable[[aioredis.Redis], Awaitable[T]], *, idempotent: bool = True) -> T:
        """Run `fn` on the client, translating unavailability into `RedisUnavailable`.

        An idempotent call is tried once more on a connection error: after a Redis restart each pooled
        connection is dead and fails its next command, and the retry gets a fresh one. `append` is not
        idempotent (a lost reply does not mean the script did not run), so it never retries here."""
        r = self._client()
        try:
            try:
                return await fn(r)
            except rexc.ConnectionError:
                if not idempotent:
                    raise
            return await fn(self._client())
        except _UNAVAILABLE as exc:
            raise _unavailable(exc) from exc

    async def _run(self, script: str, keys: list[Any], args: list[Any], *, idempotent: bool = True) -> Any:
        self._client()
        s = self._scripts[script]
        return await self._call(lambda r: s(keys=keys, args=args, client=r), idempotent=idempotent)

    async def _multi(self, *commands: tuple[Any, ...]) -> list[Any]:
        """One MULTI/EXEC round trip of `(method name, *args)` commands."""

        async def run(r: aioredis.Redis) -> list[Any]:
            pipe = r.pipeline(transaction=True)
            for name, *args in commands:
                getattr(pipe, name)(*args)
            return cast(list[Any], await pipe.execute())

        return await self._call(run)

    # --- messages -----------------------------------------------------------------------------------------
    async def append(self, messages: Sequence[Message]) -> None:
        if not messages:
            return
        batch = list(messages)  # keep nothing of the caller's list
        now_ms = int(time.time() * 1000)
        keys: list[str | bytes] = [self._k_seq, self._k_msg, self._k_bt, self._k_bytes]
        index: dict[str, int] = {}
        args: list[int | bytes] = [len(batch), now_ms]
        p_queue = self._p_queue
        for m in batch:
            if not m.timestamp_ms:
                m.timestamp_ms = now_ms  # as the embedded engine: retention by age needs a time
            args.append(encode_message_body(m, 0))
            args.append(len(m.queues))
            for q in m.queues:
                i = index.get(q)
                if i is None:
                    keys.append(p_queue + q)
                    i = index[q] = len(keys)  # Lua KEYS are 1-based
                args.append(i)
        last = int(await self._run("append", keys, args, idempotent=False))
        seq = last - len(batch)
        for m in batch:
            seq += 1
            m.seq = seq
        if last > self._high:
            self._high = last

    async def read(self, queue: str, after_seq: int, limit: int) -> list[Message]:
        if limit <= 0:
            self._client()
            return []
        res = await self._run("read", [self._p_queue + queue, self._k_msg], [after_seq, limit])
        if not res:
            return []
        out: list[Message] = []
        for s, body in zip(res[0], res[1], strict=True):
            if body is None:
                continue  # trimmed by retention after the range was taken
            m = decode_message_body(body)
            m.seq = int(s)
            out.append(m)
        return out

    def last_seq(self) -> int:
        return self._high

    async def sync(self) -> None:
        # appendfsync always: every reply already followed its fsync (see the module docstring).
        self._client()

    # --- sessions and offsets -------------------------------------------------------------------------------
    @staticmethod
    def _with_offsets(body: bytes, offsets: bytes | None) -> SessionRecord:
        rec = decode_session(body)
        if offsets is not None:
            rec.offset, rec.sent_upto = OFFSETS.unpack(offsets)
        return rec

    async def get_session(self, client_id: str) -> SessionRecord | None:
        body, offsets = await self._multi(("hget", self._k_sess, client_id), ("hget", self._k_off, client_id))
        return None if body is None else self._with_offsets(body, offsets)

    async def put_session(self, record: SessionRecord) -> None:
        # The record carries its offsets: drop any set_offsets value stored after the previous put.
        await self._multi(("hset", self._k_sess, record.client_id, encode_session(record)),
                          ("hdel", self._k_off, record.client_id))

    async def delete_session(self, client_id: str) -> None:
        await self._multi(("hdel", self._k_sess, client_id), ("hdel", self._k_off, client_id))

    async def list_sessions(self) -> list[SessionRecord]:
        # One reply with every session: fine for this cut; a large deployment needs HSCAN paging.
        bodies, offsets = await self._multi(("hgetall", self._k_sess), ("hgetall", self._k_off))
        return [self._with_offsets(body, offsets.get(cid)) for cid, body in bodies.items()]

    async def set_offsets(self, offsets: dict[str, tuple[int, int]]) -> None:
        if not offsets:
            self._client()
            return
        args: list[str | bytes] = []
        pack = OFFSETS.pack
        for client_id, (offset, sent_upto) in offsets.items():
            args += (client_id, pack(offset, sent_upto))
        await self._run("offsets", [self._k_sess, self._k_off], args)

    # --- retained -------------------------------------------------------------------------------------------
    async def set_retained(self, topic: str, message: Message | None) -> None:
        level = topic.split("/", 1)[0]
        args: list[str | bytes] = [topic, level]
        if message is not None:
            args.append(encode_message_body(message, message.seq))
        await self._run("retained", [self._k_ret, self._k_levels, self._p_bucket + level], args)

    async def match_retained(self, topic_filter: str) -> list[Message]:
        if "+" not in topic_filter and "#" not in topic_filter:
            body = await self._call(lambda r: r.hget(self._k_ret, topic_filter))
            return [] if body is None else [decode_message_body(cast(bytes, body))]
        bodies = await self._run("match", [self._k_ret, self._k_levels], [topic_filter, self._p_bucket])
        return [decode_message_body(b) for b in bodies if b is not None]

    # --- wills ----------------------------------------------------------------------------------------------
    async def put_will(self, will: WillRecord) -> None:
        value = encode_will(will)
        await self._call(lambda r: r.hset(self._k_will, will.client_id, value))

    async def delete_will(self, client_id: str) -> None:
        await self._call(lambda r: r.hdel(self._k_will, client_id))

    async def list_wills(self) -> list[WillRecord]:
        wills = await self._call(lambda r: r.hgetall(self._k_will))
        return [decode_will(cast(bytes, v)) for v in wills.values()]

    # --- retention and stats ------------------------------------------------------------------------------
    async def enforce_retention(self) -> int:
        """Delete the oldest messages past `retention_seconds` / `retention_bytes`; return how many seqs."""
        if not (self.retention_bytes or self.retention_seconds):
            return 0
        cutoff = int(time.time() * 1000) - self.retention_seconds * 1000 if self.retention_seconds else 0
        keys = [self._k_msg, self._k_first, self._k_bt, self._k_bytes, self._k_seq]
        total = 0
        while True:
            done = int(await self._run("retention", keys, [cutoff, self.retention_bytes, RETENTION_STEP,
                                                           self._p_queue]))
            total += done
            if done < RETENTION_STEP:
                return total

    async def stats(self) -> dict[str, int]:
        msgs, nbytes, sessions, retained, wills, seq = await self._multi(
            ("hlen", self._k_msg), ("get", self._k_bytes), ("hlen", self._k_sess), ("hlen", self._k_ret),
            ("hlen", self._k_will), ("get", self._k_seq))
        return {"messages": msgs, "bytes": int(nbytes or 0), "sessions": sessions, "retained": retained,
                "wills": wills, "last_seq": int(seq or 0)}
