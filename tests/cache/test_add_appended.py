"""QueueCache.add_appended: a batch this node just appended fills a cached queue without a store read, only when
nothing else can lie in the batch's range; otherwise `refresh` reads it, and nothing is cached twice."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tidewire.cache.queue_cache import QueueCache
from tidewire.store.base import Message, Slice
from tidewire.store.embedded.engine import EmbeddedStore


class CountingStore(EmbeddedStore):
    reads = 0
    slow = False
    lagging = False
    failing = False

    async def read(self, queue: str, after_seq: int, limit: int, seal: int = 0) -> Slice:
        self.reads += 1
        if self.slow:
            await asyncio.sleep(0.01)  # a read that takes a while (a networked store's)
        got = await super().read(queue, after_seq, limit, seal)
        if self.lagging:
            await asyncio.sleep(0.01)  # the answer is on its way back: what is appended meanwhile is not in it
        if self.failing:
            raise OSError("the store went away")
        return got


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
    after = await store.append(batch)
    assert cache.add_appended(batch, after) == {"t", "u"}
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
    assert cache.add_appended(mine, await store.append(mine)) == set()
    await cache.refresh("t")
    assert _payloads(cache, "t", start) == [b"other0", b"other1", b"mine0", b"mine1"]
    await store.close()


async def test_a_batch_the_store_cannot_vouch_for_is_not_taken(tmp_path: Path) -> None:
    store = await _store(tmp_path)
    cache = QueueCache(store, per_queue=100, pull_batch=50)
    cache.track("t")
    batch = _msgs(3)
    after = await store.append(batch)
    assert cache.add_appended(batch, None) == set()  # e.g. several partitions: others' seqs may lie between
    batch[0].seq, batch[1].seq = batch[1].seq, batch[0].seq
    assert cache.add_appended(batch, after) == set()  # not ascending: not a batch as the store numbers one
    assert cache.known_upto("t") < min(m.seq for m in batch)
    await store.close()


async def test_a_sparse_batch_is_taken_when_the_store_vouches_for_its_range(tmp_path: Path) -> None:
    store = await _store(tmp_path)
    cache = QueueCache(store, per_queue=100, pull_batch=50)
    cache.track("t")
    await cache.refresh("t")
    tail = cache.known_upto("t")
    batch = _msgs(3)
    await store.append(batch)
    # A clock-numbered store (Redis): seqs far apart, and the store's answer for what lies around them.
    for i, m in enumerate(batch):
        m.seq = tail + 1000 * (i + 1)
    assert cache.add_appended(batch, tail + 10) == set()  # the cache does not know (tail, tail + 10]
    assert cache.add_appended(batch, tail - 5) == {"t"}
    assert cache.known_upto("t") == batch[-1].seq
    await store.close()


async def test_a_queue_being_read_is_not_fed_twice(tmp_path: Path) -> None:
    store = await _store(tmp_path)
    cache = QueueCache(store, per_queue=100, pull_batch=50)
    cache.track("t")
    start = store.last_seq()
    store.slow = True
    first = _msgs(1, tag="a")
    after = await store.append(first)
    reading = asyncio.get_running_loop().create_task(cache.refresh("t"))
    await asyncio.sleep(0)  # one turn: the read has started (store.reads == 1); it will find `first`
    assert store.reads == 1
    assert cache.add_appended(first, after) == set()
    await reading
    second = _msgs(1, tag="b")
    assert cache.add_appended(second, await store.append(second)) == {"t"}  # current again: fed
    assert _payloads(cache, "t", start) == [b"a0", b"b0"]
    await store.close()


async def test_a_batch_appended_during_a_read_is_taken_when_the_read_ends(tmp_path: Path) -> None:
    store = await _store(tmp_path)
    cache = QueueCache(store, per_queue=100, pull_batch=50)
    cache.track("t")
    start = store.last_seq()
    first = _msgs(2, tag="a")
    await store.append(first)
    store.lagging = True
    reading = asyncio.get_running_loop().create_task(cache.refresh("t"))
    await asyncio.sleep(0)  # the read has its answer (`first`) and is on its way back
    second = _msgs(2, tag="b")
    assert cache.add_appended(second, await store.append(second)) == set()  # parked: the read is under way
    await reading
    assert store.reads == 1  # not read back
    assert cache.known_upto("t") == second[-1].seq
    assert _payloads(cache, "t", start) == [b"a0", b"a1", b"b0", b"b1"]
    await store.close()


async def test_a_parked_batch_behind_an_unknown_range_is_left_to_a_read(tmp_path: Path) -> None:
    store = await _store(tmp_path)
    cache = QueueCache(store, per_queue=100, pull_batch=50)
    cache.track("t")
    start = store.last_seq()
    store.lagging = True
    reading = asyncio.get_running_loop().create_task(cache.refresh("t"))
    await asyncio.sleep(0)  # the read found nothing and is on its way back
    await store.append(_msgs(1, tag="other"))  # another writer: not in that answer
    mine = _msgs(1, tag="mine")
    cache.add_appended(mine, await store.append(mine))  # the store vouches from `other`'s seq on only
    await reading
    assert cache.known_upto("t") < mine[0].seq  # `mine` not taken over the unknown `other`
    await cache.refresh("t")
    assert _payloads(cache, "t", start) == [b"other0", b"mine0"] and store.reads == 2
    await store.close()


async def test_a_failed_read_drops_what_it_parked(tmp_path: Path) -> None:
    store = await _store(tmp_path)
    cache = QueueCache(store, per_queue=100, pull_batch=50)
    cache.track("t")
    known = cache.known_upto("t")
    store.lagging = store.failing = True
    reading = asyncio.get_running_loop().create_task(cache.refresh("t"))
    await asyncio.sleep(0)
    batch = _msgs(1)
    cache.add_appended(batch, await store.append(batch))
    with pytest.raises(OSError):
        await reading
    assert cache.known_upto("t") == known  # nothing taken on the strength of a read that failed
    store.lagging = store.failing = False
    await cache.refresh("t")
    assert cache.known_upto("t") == batch[0].seq
    await store.close()
