"""QueueCache over the real embedded store: one pull per queue, bounded size, misses behind the head."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.store.delaying import DelayingStore
from tidewire.cache.queue_cache import QueueCache
from tidewire.store.base import Message, Slice
from tidewire.store.embedded.engine import EmbeddedStore


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

    async def counting_read(queue: str, after: int, limit: int, seal: int = 0) -> Slice:
        nonlocal reads
        reads += 1
        return await real_read(queue, after, limit, seal)

    store.read = counting_read  # type: ignore[method-assign,assignment]
    await cache.refresh("t")
    assert reads == 3  # 25 messages in batches of 10: one pull loop, whoever waits on the queue
    got = cache.get("t", start, 100)
    assert got is not None and [m.payload for m in got[0]] == [str(i).encode() for i in range(25)]
    assert got[1] == store.last_seq()  # complete up to the store's end
    assert cache.get("t", start - 1, 10) is None  # behind the head: caller reads the store
    assert cache.get("t", got[0][-1].seq, 10) == ([], store.last_seq())
    cut = cache.get("t", start, 10)
    assert cut is not None and cut[1] == cut[0][-1].seq  # cut at the limit: complete only up to its last
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
    assert tail is not None and len(tail[0]) == 10
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


async def test_a_queue_is_known_up_to_the_store_end_not_its_last_message(tmp_path: Path) -> None:
    """The bug a merge of queues hit on a slow store: a refreshed queue with nothing new must still say how far
    it is complete, and a queue not refreshed must not claim to know past its last refresh."""
    store = await _store(tmp_path)
    cache = QueueCache(store)
    cache.track("x")
    cache.track("y")
    await store.append(_msgs(1, "x"))
    await store.append(_msgs(1, "y"))
    await cache.refresh("y")
    x, y = cache.get("x", 0, 10), cache.get("y", 0, 10)
    assert x == ([], 0)  # x was not refreshed: known only up to where it started
    assert y is not None and len(y[0]) == 1 and y[1] == store.last_seq()
    assert cache.known_upto("x") == 0 < y[0][0].seq  # a merging reader must wait for x
    await cache.refresh("x", seal=y[0][0].seq)
    x = cache.get("x", 0, 10)
    assert x is not None and len(x[0]) == 1 and x[1] >= y[0][0].seq
    await store.close()


async def test_concurrent_refreshes_share_one_read_and_all_see_its_result(tmp_path: Path) -> None:
    store = DelayingStore(await _store(tmp_path), max_delay_ms=20, seed=7)
    cache = QueueCache(store)
    cache.track("t")
    await store.append(_msgs(5))
    before = store.calls
    await asyncio.gather(*(cache.refresh("t") for _ in range(10)))
    assert store.calls - before <= 2  # one pull, looped at most once for the callers that came during it
    got = cache.get("t", 0, 100)
    assert got is not None and len(got[0]) == 5  # every caller returned only once the pull had the messages
    await store.close()
