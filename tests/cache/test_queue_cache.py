"""QueueCache over the real embedded store: one pull per queue, bounded size, misses behind the head."""

from __future__ import annotations

from pathlib import Path

from cache.queue_cache import QueueCache
from store.base import Message
from store.embedded import EmbeddedStore


def _msgs(n: int, queue: str = "t") -> list[Message]:
    return [Message("t", str(i).encode(), queues=(queue,)) for i in range(n)]


async def _store(tmp_path: Path) -> EmbeddedStore:
    store = EmbeddedStore(tmp_path, fsync="never")
    await store.open()
    return store


async def test_tracked_queue_serves_new_messages_from_one_pull(tmp_path: Path) -> None:
    store = await _store(tmp_path)
    await store.append(_msgs(3))  # before tracking: not the cache's business
    cache = QueueCache(store, per_queue=100, pull_batch=10)
    cache.track("t")
    start = store.last_seq()
    await store.append(_msgs(25))
    reads = 0
    real_read = store.read

    async def counting_read(queue: str, after: int, limit: int) -> list[Message]:
        nonlocal reads
        reads += 1
        return await real_read(queue, after, limit)

    store.read = counting_read  # type: ignore[method-assign,assignment]
    await cache.refresh("t")
    assert reads == 3  # 25 messages in batches of 10: one pull loop, whoever waits on the queue
    got = cache.get("t", start, 100)
    assert got is not None and [m.payload for m in got] == [str(i).encode() for i in range(25)]
    assert cache.get("t", start - 1, 10) is None  # behind the head: caller reads the store
    assert cache.get("t", got[-1].seq, 10) == []
    await store.close()


async def test_cache_is_bounded_and_moves_its_head(tmp_path: Path) -> None:
    store = await _store(tmp_path)
    cache = QueueCache(store, per_queue=64, pull_batch=50)
    cache.track("t")
    start = store.last_seq()
    await store.append(_msgs(500))
    await cache.refresh("t")
    assert cache.get("t", start, 10) is None  # the oldest were dropped
    tail = cache.get("t", store.last_seq() - 10, 100)
    assert tail is not None and len(tail) == 10
    await store.close()


async def test_untracked_queue_is_forgotten(tmp_path: Path) -> None:
    store = await _store(tmp_path)
    cache = QueueCache(store)
    cache.track("t")
    cache.track("t")
    cache.untrack("t")
    assert cache.tracked("t")
    cache.untrack("t")
    assert not cache.tracked("t")
    assert cache.get("t", 0, 10) is None
    await store.close()
