"""Fixtures for the cluster fabric's tests: one private redis-server per module (no fsync: membership data is
rebuilt by heartbeats, durability is not under test) and a flushed redis-py client per test."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from tests.store import redis_server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[redis_server.RedisServer]:
    if not redis_server.available():
        pytest.skip("redis-server is not installed")
    s = redis_server.RedisServer(tmp_path_factory.mktemp("redis"), appendfsync="no")
    s.start()
    yield s
    s.stop()


@pytest.fixture
async def redis(server: redis_server.RedisServer) -> AsyncIterator[Any]:
    r = aioredis.Redis.from_url(server.url)
    await r.flushall()
    yield r
    await r.aclose()
