"""The Redis store engine's connection: one Redis or a Redis Cluster, scripts by SHA, errors made uniform.

`redis://` / `rediss://` / `unix://` URLs use `redis.asyncio.Redis` over a blocking pool; `redis-cluster://`
(`rediss-cluster://` for TLS) `[USER:PASSWORD@]HOST:PORT[,HOST:PORT...]` uses `redis.asyncio.cluster.
RedisCluster`, which follows MOVED/ASK redirections and reloads the slot table after a failover by itself.
`redis-sentinel://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...]/MASTER_NAME[/DB]` names Redis Sentinels (the
credentials are the primary's): the same blocking pool, whose connections ask the sentinels for the primary
each time they connect. A dropped connection, or READONLY from a primary demoted to a replica, closes the
connection, so the retry reaches the primary the sentinels promoted, without a restart.

Scripts run as EVALSHA; after NOSCRIPT (a restarted or new node) the same call is sent once as EVAL, which
also caches the script on that node. `run_many` pipelines calls (on a cluster: one pipeline per node, the nodes
in parallel), so calls over P partitions cost one round trip per node, not per partition.

Errors: while Redis cannot serve (refused, reset, timeout, LOADING, READONLY replica, OOM, CLUSTERDOWN, slots not
covered) every call raises `RedisUnavailable`, a builtin `ConnectionError` and so an `OSError`; a call on a
connection that is not open raises `StoreClosed`. On one Redis, redis-py's own retries are off and an idempotent
call is tried once more after a connection error (after a Redis restart each pooled connection fails its next
command). The cluster client retries connection errors itself (`CLUSTER_RETRIES`, reloading the slot table in
between), for every command: a non-idempotent append may then run twice (at-least-once, as when the caller
retries an append whose reply was lost).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import unquote

import redis.asyncio as aioredis
import redis.exceptions as rexc
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool, SentinelManagedConnection
from redis.backoff import ExponentialWithJitterBackoff, NoBackoff

try:
    import hiredis
    from redis.connection import HiredisRespSerializer
except ImportError:  # pragma: no cover - hiredis comes with the redis extra
    HiredisRespSerializer = None  # type: ignore[assignment,misc]

from tidewire.errors import StoreClosed, StoreUnavailable

log = logging.getLogger("tidewire.store")
T = TypeVar("T")

CLUSTER_SCHEMES = ("redis-cluster://", "rediss-cluster://")
SENTINEL_SCHEME = "redis-sentinel://"
SENTINEL_URL_FORM = "redis-sentinel://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...]/MASTER_NAME[/DB]"
# Attempts of the cluster client after a connection error (each reloads the slot table), and their backoff.
CLUSTER_RETRIES = 3
CLUSTER_BACKOFF = (0.05, 0.5)  # base, cap (seconds)

_UNAVAILABLE = (
    rexc.ConnectionError,  # includes BusyLoadingError (LOADING), MaxConnectionsError, AuthenticationError
    rexc.TimeoutError,
    rexc.ReadOnlyError,  # failover: we talk to a replica
    rexc.OutOfMemoryError,
    rexc.ClusterDownError,  # and MasterDownError
    rexc.TryAgainError,
    rexc.SlotNotCoveredError,
)


class RedisUnavailable(StoreUnavailable):
    """Redis cannot be reached or cannot take writes now; retry later (an `OSError`)."""


def _unavailable(exc: BaseException) -> RedisUnavailable:
    # redis-py messages carry host:port and errno text, never credentials.
    return RedisUnavailable(f"redis unavailable: {type(exc).__name__}: {exc}")


def _is_unavailable(exc: BaseException) -> bool:
    if isinstance(exc, _UNAVAILABLE):
        return True
    # Raised by the cluster client when no startup node answers or the slots are not all covered.
    return isinstance(exc, rexc.RedisClusterException) and (
        "cannot be connected" in str(exc) or "not covered" in str(exc))


class Script:
    """A Lua script known by its SHA1 (EVALSHA), its source kept for the NOSCRIPT fallback."""

    __slots__ = ("name", "sha", "src")

    def __init__(self, name: str, src: str) -> None:
        self.name = name
        self.src = src
        self.sha = hashlib.sha1(src.encode()).hexdigest()


Call = tuple[Script, Sequence[str | bytes], Sequence[str | bytes | int]]


def _hosts(rest: str, what: str) -> tuple[list[tuple[str, int]], str | None, str | None]:
    """`[user:password@]host:port[,host:port...]` -> (nodes, username, password)."""
    username = password = None
    if "@" in rest:
        creds, rest = rest.rsplit("@", 1)
        user, _, pw = creds.partition(":")
        username, password = unquote(user) or None, unquote(pw) or None
    nodes: list[tuple[str, int]] = []
    for part in rest.split(","):
        host, _, port = part.strip().rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{what}: expected HOST:PORT[,HOST:PORT...], got {part.strip()!r}")
        nodes.append((host.strip("[]"), int(port)))
    return nodes, username, password


def parse_cluster_url(url: str) -> tuple[list[tuple[str, int]], str | None, str | None, bool]:
    """`redis-cluster://[user:password@]host:port[,host:port...]` -> (nodes, username, password, tls)."""
    scheme, rest = url.split("://", 1)
    nodes, username, password = _hosts(rest.split("/", 1)[0].split("?", 1)[0], "redis-cluster URL")
    return nodes, username, password, scheme == "rediss-cluster"


@dataclass(frozen=True, slots=True)
class SentinelURL:
    sentinels: list[tuple[str, int]]
    master: str  # the name the sentinels monitor the primary under
    db: int
    username: str | None  # the primary's (and its replicas') credentials; the sentinels take none
    password: str | None


def parse_sentinel_url(url: str) -> SentinelURL:
    """`redis-sentinel://[user:password@]host:port[,host:port...]/master_name[/db]`; a ValueError names the
    part that is wrong."""
    if not url.startswith(SENTINEL_SCHEME):
        raise ValueError(f"not a sentinel URL: expected {SENTINEL_URL_FORM}")
    rest = url.removeprefix(SENTINEL_SCHEME)
    if "?" in rest or "#" in rest:
        raise ValueError(f"redis-sentinel URL: no query or fragment is read: expected {SENTINEL_URL_FORM}")
    hosts, _, path = rest.partition("/")
    nodes, username, password = _hosts(hosts, "redis-sentinel URL")
    parts = path.split("/") if path else []
    if not parts or not parts[0]:
        raise ValueError(f"redis-sentinel URL: the master name is missing: expected {SENTINEL_URL_FORM}")
    if len(parts) > 2 or (len(parts) == 2 and not parts[1].isdigit()):
        raise ValueError(f"redis-sentinel URL: after the master name only a DB number: expected {SENTINEL_URL_FORM}")
    return SentinelURL(nodes, unquote(parts[0]), int(parts[1]) if len(parts) == 2 else 0, username, password)


class _BlockingSentinelPool(SentinelConnectionPool, aioredis.BlockingConnectionPool):
    """The primary's connections found through the sentinels, waiting for a free one as the plain pool does.

    `changes` counts the primary addresses it has seen: a connection taken once the count is n talks to the n-th
    (or a later) one, since idle connections are closed at a change and busy ones when they come back."""

    changes = 0
    seen: Any = None  # the last address counted (compared after the await: lookups overlap)

    async def get_master_address(self) -> Any:
        address = await super().get_master_address()
        if address != self.seen:
            self.seen = address
            self.changes += 1
        return address

    async def release(self, connection: Any) -> None:
        if self.master_address is not None and (connection.host, connection.port) != self.master_address:
            await connection.disconnect()  # it talked to a former primary
        await super().release(connection)


def plain_client(url: str, *, connect_timeout: float = 2.0, socket_timeout: float = 5.0) -> Any:
    """A redis-py client with its own retries for any of the URL forms (the cluster membership's; the store
    keeps its own connections)."""
    if url.startswith(CLUSTER_SCHEMES):
        nodes, username, password, tls = parse_cluster_url(url)
        return RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in nodes], username=username,
                            password=password, ssl=tls, socket_connect_timeout=connect_timeout,
                            socket_timeout=socket_timeout)
    if url.startswith(SENTINEL_SCHEME):
        s = parse_sentinel_url(url)
        return Sentinel(s.sentinels, socket_connect_timeout=connect_timeout, socket_timeout=socket_timeout).master_for(
            s.master, db=s.db, username=s.username, password=s.password)
    return aioredis.Redis.from_url(url, socket_connect_timeout=connect_timeout, socket_timeout=socket_timeout)


def with_c_packing(connection_class: type[Any]) -> type[Any]:
    """`connection_class` packing commands with hiredis (its parser already) instead of redis-py's asyncio Python
    packer, which costs ~1 ms for an append of 300 messages (~2,000 arguments) against ~0.2 ms. The bytes are the
    same (redis-py's own sync connections pack this way); without hiredis the class is returned as it is."""
    if HiredisRespSerializer is None:
        return connection_class
    packer = HiredisRespSerializer()  # the general path: it copies every argument, ~0.5 ms for an append
    pack = hiredis.pack_command

    def pack_command(self: Any, *args: Any) -> list[bytes]:
        first = args[0]
        if b" " in first if isinstance(first, bytes) else " " in first:
            return packer.pack(*args)  # a command name with literal arguments ('CONFIG GET'): split by it
        try:
            return [pack(args)]
        except TypeError:  # a bytearray or memoryview argument
            return packer.pack(*args)

    return type(f"CPacked{connection_class.__name__}", (connection_class,), {"pack_command": pack_command})


class RedisConn:
    def __init__(self, url: str, *, connect_timeout: float, socket_timeout: float, max_connections: int,
                 pool_timeout: float) -> None:
        if max_connections < 1:
            raise ValueError("max_connections must be >= 1")
        self.url = url
        self.cluster = url.startswith(CLUSTER_SCHEMES)
        # A malformed URL fails at construction, not at open.
        self.sentinel = parse_sentinel_url(url) if url.startswith(SENTINEL_SCHEME) else None
        if self.cluster:
            parse_cluster_url(url)
        self._connect_timeout = connect_timeout
        self._socket_timeout = socket_timeout
        self._max_connections = max_connections
        self._pool_timeout = pool_timeout
        self._client: Any = None  # aioredis.Redis or RedisCluster (their command APIs differ in typing only)
        self._pool: aioredis.BlockingConnectionPool | None = None
        self._sentinels: Sentinel | None = None

    # --- lifecycle ----------------------------------------------------------------------------------------
    async def open(self) -> None:
        if self._client is not None:
            return
        pool: aioredis.BlockingConnectionPool | None
        if self.cluster:
            nodes, username, password, tls = parse_cluster_url(self.url)
            client: Any = RedisCluster(
                startup_nodes=[ClusterNode(h, p) for h, p in nodes], username=username, password=password,
                ssl=tls, socket_connect_timeout=self._connect_timeout, socket_timeout=self._socket_timeout,
                max_connections=self._max_connections,
                retry=Retry(ExponentialWithJitterBackoff(*CLUSTER_BACKOFF), CLUSTER_RETRIES))
            pool = None
        elif self.sentinel is not None:
            s = self.sentinel
            self._sentinels = Sentinel(s.sentinels, socket_connect_timeout=self._connect_timeout,
                                       socket_timeout=self._socket_timeout)
            pool = _BlockingSentinelPool(
                s.master, self._sentinels, max_connections=self._max_connections, timeout=self._pool_timeout,
                connection_class=with_c_packing(SentinelManagedConnection), db=s.db, username=s.username,
                password=s.password, socket_connect_timeout=self._connect_timeout,
                socket_timeout=self._socket_timeout, retry=Retry(NoBackoff(), 0))
            client = aioredis.Redis(connection_pool=pool)
        else:
            pool = aioredis.BlockingConnectionPool.from_url(
                self.url, max_connections=self._max_connections, timeout=self._pool_timeout,
                socket_connect_timeout=self._connect_timeout, socket_timeout=self._socket_timeout,
                retry=Retry(NoBackoff(), 0))
            pool.connection_class = with_c_packing(pool.connection_class)
            client = aioredis.Redis(connection_pool=pool)
        try:
            if self.cluster:
                await client.initialize()
            else:
                await client.ping()
        except BaseException as exc:
            await client.aclose()
            if pool is not None:
                await pool.aclose()
            await self._close_sentinels()
            if isinstance(exc, Exception) and _is_unavailable(exc):
                raise _unavailable(exc) from exc
            raise
        self._client, self._pool = client, pool

    async def close(self) -> None:
        client, self._client = self._client, None
        pool, self._pool = self._pool, None
        if client is not None:
            await client.aclose()
        if pool is not None:
            await pool.aclose()
        await self._close_sentinels()

    async def _close_sentinels(self) -> None:
        sentinels, self._sentinels = self._sentinels, None
        if sentinels is not None:
            await sentinels.aclose()

    @property
    def primary_changes(self) -> int:
        """How many primary addresses the sentinels have named so far (0 without sentinels): an append begun at
        count n wrote to the n-th primary or a later one."""
        return self._pool.changes if isinstance(self._pool, _BlockingSentinelPool) else 0

    @property
    def is_open(self) -> bool:
        return self._client is not None

    def check(self) -> Any:
        if self._client is None:
            raise StoreClosed("redis store is not open")
        return self._client

    # --- calls --------------------------------------------------------------------------------------------
    async def _recover(self, client: Any, attempt: int) -> None:
        """Before retrying after connection errors: after a Redis restart every idle pooled connection is dead
        too, so drop them (the retry connects afresh); on a cluster also back off and reload the slot table."""
        if self._pool is not None:
            await self._pool.disconnect(inuse_connections=False)
        if self.cluster:
            await asyncio.sleep(min(CLUSTER_BACKOFF[1], CLUSTER_BACKOFF[0] * 2**attempt))
            for node in client.get_nodes():
                await node.disconnect_free_connections()
            with contextlib.suppress(Exception):  # no node answers: the retry reports it
                await client.nodes_manager.initialize()

    async def _rediscover(self) -> None:
        """Behind sentinels: ask them for the primary now, so `primary_changes` counts a new one before the next
        call begins (it would otherwise learn it only while connecting)."""
        if isinstance(self._pool, _BlockingSentinelPool):
            with contextlib.suppress(Exception):  # no primary named yet: the next connection asks again
                await self._pool.get_master_address()

    async def _call(self, fn: Callable[[Any], Awaitable[T]], idempotent: bool) -> T:
        client = self.check()
        try:
            try:
                return await fn(client)
            except rexc.ConnectionError:
                await self._rediscover()
                if not idempotent or self.cluster:  # the cluster client has retried already
                    raise
                await self._recover(client, 1)
            return await fn(self.check())
        except Exception as exc:
            if _is_unavailable(exc):
                raise _unavailable(exc) from exc
            raise

    async def command(self, *args: str | bytes | int, idempotent: bool = True) -> Any:
        """One keyed command (routed by its key on a cluster)."""
        return await self._call(lambda c: c.execute_command(*args), idempotent)

    async def run(self, call: Call, *, idempotent: bool = True) -> Any:
        script, keys, args = call

        async def go(c: Any) -> Any:
            try:
                return await c.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
            except rexc.NoScriptError:
                return await c.execute_command("EVAL", script.src, len(keys), *keys, *args)

        return await self._call(go, idempotent)

    async def run_many(self, calls: Sequence[Call], *, idempotent: bool = True) -> list[Any]:
        """Run the calls pipelined; results in order. Raises the first error once every call has run (a caller
        of non-idempotent calls learns that some may have run).

        A cluster pipeline reports a node's connection error per call instead of retrying: idempotent calls
        that got one are sent again (`CLUSTER_RETRIES` times, after `_recover`)."""
        if len(calls) == 1:
            return [await self.run(calls[0], idempotent=idempotent)]

        async def go(c: Any) -> list[Any]:
            results: list[Any] = [None] * len(calls)
            todo = list(range(len(calls)))
            for attempt in itertools.count(1):
                got = await self._pipeline(c, [("EVALSHA", calls[i][0].sha, len(calls[i][1]), *calls[i][1],
                                                *calls[i][2]) for i in todo])
                missing = [j for j, r in enumerate(got) if isinstance(r, rexc.NoScriptError)]
                if missing:
                    again = await self._pipeline(c, [("EVAL", calls[todo[j]][0].src, len(calls[todo[j]][1]),
                                                      *calls[todo[j]][1], *calls[todo[j]][2]) for j in missing])
                    for j, r in zip(missing, again, strict=True):
                        got[j] = r
                for i, r in zip(todo, got, strict=True):
                    results[i] = r
                todo = [i for i, r in zip(todo, got, strict=True)
                        if isinstance(r, (rexc.ConnectionError, rexc.TimeoutError))]
                if not todo or not idempotent or not self.cluster or attempt > CLUSTER_RETRIES:
                    break
                await self._recover(c, attempt)
            for r in results:
                if isinstance(r, Exception):
                    raise r
            return results

        return await self._call(go, idempotent)

    @staticmethod
    async def _pipeline(client: Any, commands: list[tuple[Any, ...]]) -> list[Any]:
        pipe = client.pipeline(transaction=False)
        for args in commands:
            pipe.execute_command(*args)
        return list(await pipe.execute(raise_on_error=False))

    # --- durability ---------------------------------------------------------------------------------------
    async def wait_replicas(self, key: str, replicas: int, timeout_ms: int) -> tuple[int, str]:
        """How many replicas hold every write the primary had before this call, waiting up to `timeout_ms` for
        `replicas` of them (WAIT), and the primary's replication id (a promoted replica has a new one).

        WAIT covers the writes of its own connection only, so an INCR of `key` on that connection comes first:
        its replication offset is past every write the primary replied to before, whichever connection sent it.
        WAITAOF (Redis 7.2) would also wait for the replicas' fsync; WAIT is what Redis 7.0 has."""
        async def go(c: Any) -> tuple[int, str]:
            replies = await self._pipeline(c, [("INCR", key), ("WAIT", replicas, timeout_ms),
                                               ("INFO", "replication")])
            for r in replies:
                if isinstance(r, Exception):
                    raise r
            info = replies[2]
            return int(replies[1]), str(info.get("master_replid", "")) if isinstance(info, dict) else ""

        return await self._call(go, True)

    async def durability(self) -> bool | None:
        """True when every primary runs `appendonly yes` + `appendfsync always`; None when CONFIG is denied."""
        client = self.check()
        try:
            if self.cluster:
                confs = [await client.execute_command("CONFIG", "GET", "append*", target_nodes=node)
                         for node in client.get_primaries()]
            else:
                confs = [await client.config_get("append*")]
        except rexc.ResponseError:
            log.warning("store: cannot read the Redis AOF policy; acked writes are durable only with "
                        "appendonly yes + appendfsync always")
            return None
        except Exception as exc:
            if _is_unavailable(exc):
                raise _unavailable(exc) from exc
            raise
        durable = all(_fsyncs_always(conf) for conf in confs)
        if not durable:
            log.warning("store: Redis runs without appendonly yes + appendfsync always: a host crash can lose "
                        "acknowledged messages")
        return durable


def _fsyncs_always(conf: Any) -> bool:
    if isinstance(conf, list):  # a raw CONFIG GET reply: name, value, ...
        conf = dict(zip(conf[::2], conf[1::2], strict=True))
    get = {(k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
           for k, v in conf.items()}
    return get.get("appendonly") == "yes" and get.get("appendfsync") == "always"
