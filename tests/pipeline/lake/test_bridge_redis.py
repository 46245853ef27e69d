"""The bridge over a partitioned Redis store: two bridges (two owners, one lake): one works every partition, the
other takes them over when it stops, and together they export every position exactly once; then the standalone
command, from the same checkpoints."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.pipeline.lake.support import messages, read_lake
from tests.store import redis_server
from tests.waiting import until
from tidewire.pipeline.lake.bridge import LakeBridge

ROOT = Path(__file__).resolve().parents[3]
P = 3


@pytest.fixture
def server(tmp_path: Path) -> Iterator[redis_server.RedisServer]:
    if not redis_server.available():
        pytest.skip("redis-server is not installed")
    s = redis_server.RedisServer(tmp_path / "redis", appendfsync="no")
    s.start()
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture
async def store(server: redis_server.RedisServer) -> AsyncIterator[object]:
    from tidewire.store.redis.engine import RedisStore

    s = RedisStore(server.url, partitions=P)
    await s.open()
    yield s
    await s.close()


async def test_handover_between_owners(store: object, server: redis_server.RedisServer, tmp_path: Path) -> None:
    from tidewire.store.redis.engine import RedisStore

    assert isinstance(store, RedisStore)
    lake = tmp_path / "lake"
    opts = {"flush_rows": 300, "read_batch": 100, "flush_seconds": 0.2, "idle_s": 0.02, "lease_ttl_ms": 600}
    a, b = LakeBridge(store, lake, owner="a", **opts), LakeBridge(store, lake, owner="b", **opts)  # type: ignore[arg-type]
    sent = 0

    async def send_and_wait(n: int) -> None:
        nonlocal sent
        for _ in range(n // 100):
            await store.append(messages(100, start=sent))
            sent += 100
            await asyncio.sleep(0.01)  # pacing: appends spread over several reads
        await until(lambda: a.stats()["rows"] + b.stats()["rows"] >= sent, timeout=10,
                    what=lambda: f"{sent} rows exported, {a.stats()['rows']} + {b.stats()['rows']}")

    task_a = asyncio.create_task(a.run())
    await until(lambda: len(a.stats()["owned"]) == P, what=f"a owning all {P} partitions")
    task_b = asyncio.create_task(b.run())
    await send_and_wait(1000)
    assert a.stats()["owned"] == list(range(P)) and b.stats()["owned"] == []  # one bridge per partition
    await a.stop()
    await task_a
    await send_and_wait(1000)  # b takes the partitions over (within a ttl) from a's checkpoints
    assert b.stats()["owned"] == list(range(P))
    await b.stop()
    await task_b
    assert a.stats()["rows"] >= 1000 and b.stats()["rows"] > 0
    table = read_lake(lake)
    positions = table.column("position").to_pylist()
    assert len(positions) == sent == len(set(positions))
    assert set(table.column("partition").to_pylist()) == set(range(P))
    for p in range(P):
        assert (await store.log_holds(p))["lake"] > 0
    # The standalone command, from the checkpoints: nothing new, nothing twice.
    await store.append(messages(50, start=sent))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tidewire.pipeline.lake", "--store", server.url, "--partitions", str(P),
        "--lake", str(lake),
        "--once", "--log-level", "WARNING", cwd=ROOT, stdout=asyncio.subprocess.PIPE)
    out, _ = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0 and json.loads(out)["messages"]["rows"] == 50
    positions = read_lake(lake).column("position").to_pylist()
    assert len(positions) == sent + 50 == len(set(positions))
