"""QueueCache.add_appended: a batch this node just appended fills a cached queue without a store read, only when
nothing else can lie in the batch's range; otherwise `refresh` reads it, and nothing is cached twice."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tidewire.cache.queue_cache import QueueCache
from tidewire.store.base import Message, Slice
from tidewire.store.embedded.engine import EmbeddedStore


class CountingStore(EmbeddedStore):
    reads = 0
    slow = False

    async def read(self, queue: str, after_seq: int, limit: int, seal: int = 0) -> Slice:
        self.reads += 1
        if self.slow:
            await asyncio.sleep(0.01)  # a read that takes a while (a networked store's)
        return await super().read(queue, after_seq, limit, seal)


def _msgs(n: int, queues: tuple[str, ...] = ("t",), tag: str = "") -> list[Message]:
    return [Message("t", f"{tag}{i}".encode(), queues=queues) for i in range(n)]


async def _store(tmp_path: Path) -> CountingStore:
    store = CountingStore(tmp_path, fsync="never")
    await store.open()
    return store


def _payloads(cache: QueueCache, queue: str, after: int) -> list[bytes]:
    got = cache.get(queue, after, 1000)
    assert got is not None
    return [m.payload for m in got[0]]


async def test_a_current_queue_takes_its_share_without_a_read(tmp_path: Path) -> None:
    store = await _store(tmp_path)
    cache = QueueCache(store, per_queue=100, pull_batch=50)
    cache.track("t")
    cache.track("u")
    start = store.last_seq()
    batch = _msgs(3, ("t", "x")) + _msgs(2, ("u",), "u")
    await store.append(batch)
    assert cache.add_appended(batch) == {"t", "u"}
    assert store.reads == 0
    assert _payloads(cache, "t", start) == [b"0", b"1", b"2"]
    assert _payloads(cache, "u", start) == [b"u0", b"u1"]
    assert cache.known_upto("t") == cache.known_upto("u") == store.last_seq()
    await cache.refresh("t")  # nothing new: the read finds nothing to add
    assert _payloads(cache, "t", start) == [b"0", b"1", b"2"]
    await store.close()


async def test_a_queue_behind_the_batch_is_left_to_refresh(tmp_path: Path) -> None:
    store = await _store(tmp_path)
    cache = QueueCache(store, per_queue=100, pull_batch=50)
    cache.track("t")
    start = store.last_seq()
    await store.append(_msgs(2, tag="other"))  # another writer: the cache has not seen these
    mine = _msgs(2, tag="mine")
    await store.append(mine)
    assert cache.add_appended(mine) == set()
    await cache.refresh("t")
    assert _payloads(cache, "t", start) == [b"other0", b"other1", b"mine0", b"mine1"]
    await store.close()


async def test_a_batch_with_a_gap_is_not_taken(tmp_path: Path) -> None:
    store = await _store(tmp_path)
    cache = QueueCache(store, per_queue=100, pull_batch=50)
    cache.track("t")
    batch = _msgs(3)
    await store.append(batch)
    batch[1].seq += 100  # as if the store had numbered another message in between
    assert cache.add_appended(batch) == set()
    assert cache.known_upto("t") < batch[0].seq
    await store.close()


async def test_a_queue_being_read_is_not_fed_twice(tmp_path: Path) -> None:
    store = await _store(tmp_path)
    cache = QueueCache(store, per_queue=100, pull_batch=50)
    cache.track("t")
    start = store.last_seq()
    store.slow = True
    first = _msgs(1, tag="a")
    await store.append(first)
    reading = asyncio.get_running_loop().create_task(cache.refresh("t"))
    await asyncio.sleep(0)  # one turn: the read has started (store.reads == 1); it will find `first`
    assert store.reads == 1
    assert cache.add_appended(first) == set()
    await reading
    second = _msgs(1, tag="b")
    await store.append(second)
    assert cache.add_appended(second) == {"t"}  # current again: fed
    assert _payloads(cache, "t", start) == [b"a0", b"b0"]
    await store.close()
