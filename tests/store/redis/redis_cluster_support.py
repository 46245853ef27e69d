"""Support for the Redis store tests: a real 3-master Redis Cluster fixture, and helpers.

`redis_cluster_for_module`: one cluster for the whole session (skipped when redis-server or redis-cli is
missing; starting one costs 2-7 s), shared by every store test module through `tests/store/conftest.py`, which
imports it (a module importing it again would start a cluster of its own); tests empty it with
`cluster.flushall()` before use. `cluster_store(cluster)` builds a `RedisStore` on it. `Target` says where a
partitioned store runs (one server or the cluster) with an admin client and script counters; `part`/`topics_in`
name partitions of topics; `client_commands` lists what clients sent while an action ran (MONITOR).
"""

from __future__ import annotations

import asyncio
import itertools
import random
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from tests.store import redis_server
from tests.store.redis_server import RedisClusterServers, RedisServer, command
from tidewire.store.base import Message
from tidewire.store.redis.engine import DEFAULT_CLUSTER_PARTITIONS, RedisStore

P = DEFAULT_CLUSTER_PARTITIONS  # the partition count of the partitioned tests


@pytest.fixture(scope="session")
def redis_cluster_for_module(tmp_path_factory: pytest.TempPathFactory) -> Iterator[redis_server.RedisClusterServers]:
    if not redis_server.cluster_available():
        pytest.skip("redis-server / redis-cli are not installed")
    cluster = redis_server.RedisClusterServers(tmp_path_factory.mktemp("redis-cluster"))
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


OPEN = Callable[..., Awaitable[RedisStore]]


@pytest.fixture
def server(redis_server_for_module: RedisServer) -> RedisServer:
    redis_server_for_module.start()  # a test may have left it stopped
    redis_server_for_module.flushall()
    return redis_server_for_module


@pytest.fixture
def cluster(redis_cluster_for_module: RedisClusterServers) -> RedisClusterServers:
    redis_cluster_for_module.flushall()
    return redis_cluster_for_module


@pytest.fixture
async def opened() -> AsyncIterator[OPEN]:
    """`await opened(url, **kw)`: an open RedisStore, closed after the test."""
    made: list[RedisStore] = []

    async def make(url: str, **kw: Any) -> RedisStore:
        s = RedisStore(url, connect_timeout=0.5, socket_timeout=2.0, **kw)
        await s.open()
        made.append(s)
        return s

    yield make
    for s in made:
        await s.close()


@pytest.fixture(params=["single", "cluster"])
def target(request: pytest.FixtureRequest) -> Target:
    if request.param == "cluster":
        c: RedisClusterServers = request.getfixturevalue("cluster")
        return Target("cluster", c.url, c.ports)
    s: RedisServer = request.getfixturevalue("server")
    return Target("single", s.url, [s.port])


def cluster_store(cluster: redis_server.RedisClusterServers, partitions: int = DEFAULT_CLUSTER_PARTITIONS,
                  **kwargs: object) -> RedisStore:
    return RedisStore(cluster.url, partitions=partitions, **kwargs)  # type: ignore[arg-type]


class Target:
    """Where a partitioned store runs: 16 partitions on one redis-server, or on the 3-master cluster."""

    def __init__(self, name: str, url: str, ports: list[int]) -> None:
        self.name, self.url, self.ports = name, url, ports

    def admin(self) -> Any:
        if self.name == "cluster":
            return RedisCluster.from_url(f"redis://127.0.0.1:{self.ports[0]}")
        return aioredis.Redis.from_url(self.url)

    def scripts_run(self) -> int:
        """EVALSHA + EVAL calls so far, over every node."""
        total = 0
        for port in self.ports:
            for line in command(port, "INFO", "commandstats").decode().splitlines():
                if line.startswith(("cmdstat_evalsha:", "cmdstat_eval:")):
                    total += int(line.split("calls=", 1)[1].split(",", 1)[0])
        return total


def part(topic: str) -> int:
    """The partition of a topic, as the store's docstring defines it."""
    return zlib.crc32(topic.encode()) % P


def topics_in(partitions: set[int], prefix: str, count: int) -> list[str]:
    return list(itertools.islice((t for t in (f"{prefix}{i}" for i in itertools.count()) if part(t) in partitions),
                                 count))


def msg(topic: str, *queues: str, payload: bytes = b"x" * 100) -> Message:
    return Message(topic, payload, qos=1, publisher="p", queues=queues or (topic,))


async def client_commands(url: str, admin: aioredis.Redis, action: Callable[[], Awaitable[object]]) -> list[str]:
    """Names of the commands clients sent while `action` ran (commands run inside scripts excluded)."""
    marker = f"end-{random.getrandbits(64)}"
    seen: list[str] = []
    await admin.ping()  # connected before MONITOR starts: its handshake is not counted
    watcher = aioredis.Redis.from_url(url)
    try:
        async with watcher.monitor() as mon:
            await action()
            await admin.echo(marker)
            while True:
                cmd = await asyncio.wait_for(mon.next_command(), 5)
                if cmd["client_type"] == "lua":
                    continue
                if marker in cmd["command"]:
                    return seen
                seen.append(cmd["command"].split(" ", 1)[0].lower())
    finally:
        await watcher.aclose()
