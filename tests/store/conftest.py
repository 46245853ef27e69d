"""Shared fixtures of the store tests: the embedded store, and `engine` (every engine) for the contract suite."""

from __future__ import annotations

import zlib
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from tests.store import redis_server
from tests.store.delaying import DelayingStore
from tests.store.redis.redis_cluster_support import redis_cluster_for_module  # noqa: F401 - a fixture
from tidewire.store.base import Store
from tidewire.store.embedded.engine import EmbeddedStore


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[EmbeddedStore]:
    s = EmbeddedStore(tmp_path / "data", fsync="batch", segment_bytes=4096)
    await s.open()
    yield s
    await s.close()


# --- engines for the store contract suite (tests/store/test_contract.py) ----------------------------------


class Engine:
    """An opened store of one engine, with what the contract suite needs to know about it.

    `reopen()` closes the store and opens a fresh one over the same data, as after a restart; only engines
    that persist (`persistent`) support it. The Redis engine also kills and restarts its server in between.
    """

    def __init__(self, name: str, factory: Callable[[], Store], persistent: bool,
                 restart: Callable[[], None] | None = None) -> None:
        self.name = name
        self.persistent = persistent
        self._factory = factory
        self._restart = restart  # between close and open: e.g. kill -9 and restart a server
        self.store: Store = factory()

    async def reopen(self) -> Store:
        if not self.persistent:
            pytest.skip(f"{self.name} does not persist across a reopen")
        await self.store.close()
        if self._restart is not None:
            self._restart()
        self.store = self._factory()
        await self.store.open()
        return self.store


# Small enough that the contract suite stays quick (every call waits up to this), large enough to reorder.
CONTRACT_DELAY_MS = 2.0


@pytest.fixture(scope="module")
def redis_server_for_module(tmp_path_factory: pytest.TempPathFactory) -> Iterator[redis_server.RedisServer]:
    """One private redis-server (AOF, appendfsync always) per test module; tests flush it before use."""
    if not redis_server.available():
        pytest.skip("redis-server is not installed")
    server = redis_server.RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


async def flush_redis(url: str) -> None:
    import redis.asyncio as aioredis

    r = aioredis.Redis.from_url(url)
    try:
        await r.flushall()
    finally:
        await r.aclose()


@pytest.fixture(params=["embedded", "delaying", "redis", "redis_cluster"])
async def engine(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Engine]:
    data = tmp_path / "contract"

    def embedded() -> EmbeddedStore:
        # Small segments: reads after a reopen come from several files, not the in-memory tail.
        return EmbeddedStore(data, fsync="batch", segment_bytes=4096)

    if request.param == "embedded":
        eng = Engine("embedded", embedded, persistent=True)
    elif request.param == "redis":
        from tidewire.store.redis.engine import RedisStore

        server: redis_server.RedisServer = request.getfixturevalue("redis_server_for_module")
        await flush_redis(server.url)
        # A reopen is a crash of Redis itself (kill -9, restart from the AOF) and a new client.
        eng = Engine("redis", lambda: RedisStore(server.url), persistent=True, restart=server.restart)
    elif request.param == "redis_cluster":
        from tidewire.store.redis.engine import RedisStore

        cluster: redis_server.RedisClusterServers = request.getfixturevalue("redis_cluster_for_module")
        cluster.flushall()
        # A reopen is a crash of every master (kill -9, restart from its AOF) and a new client.
        eng = Engine("redis_cluster", lambda: RedisStore(cluster.url, partitions=16), persistent=True,
                     restart=cluster.restart)
    else:
        # A seed per test: a failure reproduces, while each test sees a different interleaving.
        seed = zlib.crc32(request.node.nodeid.encode())
        eng = Engine("delaying", lambda: DelayingStore(embedded(), CONTRACT_DELAY_MS, seed), persistent=True)
    await eng.store.open()
    try:
        yield eng
    finally:
        await eng.store.close()
