"""The append stage (`gateway.core.appends`) over real stores: batches land in the order they were taken, with
two in flight on Redis and one at a time on the embedded store, also when an append fails or is refused as
stale while another is under way."""
# ruff: noqa: F811 - the fixture imported from tests.lookup is requested by name as a parameter

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.lookup.redis_fixtures import server  # noqa: F401 - a fixture, found by name
from tests.store import redis_server
from tests.waiting import until
from tidewire.gateway.core.appends import Appends, Landed
from tidewire.store.base import Message, Store
from tidewire.store.embedded.engine import EmbeddedStore
from tidewire.store.redis.engine import RedisStore


class Indexer:
    """Indexes topic t into queues (t, "all"); `version` is what appends are checked against."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.version = -1
        self.refreshed = 0

    @property
    def wildcard_version(self) -> int:
        return self.version

    def queues_for(self, topic: str) -> tuple[str, ...]:
        return (topic, "all")

    async def refresh_wildcards(self) -> None:
        self.refreshed += 1
        self.version = (await self.store.wildcards())[0]


class Pipeline:
    def __init__(self, store: Store) -> None:
        self.woken = asyncio.Event()
        self.indexer = Indexer(store)
        self.appends = Appends(store, self.indexer, asyncio.get_running_loop().time, self.woken.set)
        self.landed: list[Landed] = []

    def publish(self, *topics: str) -> None:
        for topic in topics:
            self.appends.add(Message(topic, b"x", qos=1), f"ack-{topic}")

    async def step(self) -> None:
        self.woken.clear()
        self.landed += await self.appends.step()

    async def run_until_idle(self) -> None:
        """Step as the node's flush loop does: again whenever an append in flight ends."""
        while True:
            await self.step()
            if self.appends.idle:
                return
            await asyncio.wait_for(self.woken.wait(), 5)

    def acks(self) -> list[Any]:
        return [ack for landed in self.landed for ack in landed.acks]


@pytest.fixture
async def redis_store(server: redis_server.RedisServer) -> AsyncIterator[RedisStore]:
    server.flushall()
    store = RedisStore(server.url, connect_timeout=0.5, socket_timeout=2.0)
    await store.open()
    yield store
    await store.close()


async def stored(store: Store) -> list[str]:
    return [m.topic for m in (await store.read("all", 0, 10_000)).messages]


def hold_appends(store: RedisStore) -> asyncio.Event:
    """Every append's round trip waits (after the store placed it in its order) until the event is set."""
    released = asyncio.Event()
    conn: Any = store._conn
    run_many = conn.run_many

    async def held(calls: Any, **kw: Any) -> Any:
        if calls[0][0].name == "append":
            await released.wait()
        return await run_many(calls, **kw)

    conn.run_many = held
    return released


async def test_two_appends_in_flight_on_redis_land_in_order(redis_store: RedisStore) -> None:
    p = Pipeline(redis_store)
    assert p.appends.depth == 2
    released = hold_appends(redis_store)
    p.publish("a0", "a1")
    await p.step()  # the first append starts
    p.publish("b0")
    await p.step()  # not yet the second: the first has not called the store (its place in the order) yet
    assert p.appends.waiting
    await until(lambda: p.woken.is_set())  # it has
    await p.step()  # the second starts while the first is under way
    assert not p.appends.waiting
    p.publish("c0", "c1")
    await p.step()  # no third: these wait
    assert p.appends.unlanded == 5 and p.appends.waiting and p.landed == []
    released.set()
    await p.run_until_idle()
    assert [m.topic for landed in p.landed for m in landed.batch] == ["a0", "a1", "b0", "c0", "c1"]
    assert p.acks() == ["ack-a0", "ack-a1", "ack-b0", "ack-c0", "ack-c1"]
    assert [len(landed.batch) for landed in p.landed] == [2, 1, 2]
    assert await stored(redis_store) == ["a0", "a1", "b0", "c0", "c1"] and p.appends.unlanded == 0


async def test_a_failed_append_lands_again_in_its_place(redis_store: RedisStore) -> None:
    p = Pipeline(redis_store)
    conn: Any = redis_store._conn
    run_many = conn.run_many
    failed: list[str] = []

    async def failing_once(calls: Any, **kw: Any) -> Any:
        if not failed and calls[0][0].name == "append":
            failed.append("append")
            raise ConnectionResetError("the connection broke before the append was sent")
        return await run_many(calls, **kw)

    conn.run_many = failing_once
    p.publish("a0")
    await p.step()
    p.publish("b0")
    await p.step()
    p.publish("c0")
    await p.run_until_idle()
    assert failed == ["append"]
    assert [m.topic for landed in p.landed for m in landed.batch] == ["a0", "b0", "c0"]
    assert p.acks() == ["ack-a0", "ack-b0", "ack-c0"]
    assert await stored(redis_store) == ["a0", "b0", "c0"]  # b0 could not land before a0: sent again after it


async def test_a_stale_append_in_flight_is_indexed_again_and_lands_in_its_place(redis_store: RedisStore) -> None:
    p = Pipeline(redis_store)
    await p.indexer.refresh_wildcards()
    await redis_store.add_wildcards(["x/+"], "other")  # another node changed the set: this indexer's version is stale
    p.publish("a0")
    await p.step()
    p.publish("b0")
    await p.run_until_idle()
    assert p.indexer.refreshed == 2
    assert [m.topic for landed in p.landed for m in landed.batch] == ["a0", "b0"]
    assert await stored(redis_store) == ["a0", "b0"]


async def test_the_embedded_store_appends_one_batch_at_a_time_in_the_step(tmp_path: Path) -> None:
    store = EmbeddedStore(tmp_path, fsync="never")
    await store.open()
    try:
        p = Pipeline(store)
        assert p.appends.depth == 1
        p.publish("a0", "a1")
        await p.step()  # appended and landed within the step: no task, no wake-up
        assert [m.topic for landed in p.landed for m in landed.batch] == ["a0", "a1"] and p.appends.idle
        assert p.landed[0].after == p.landed[0].batch[0].seq - 1
    finally:
        await store.close()


async def test_a_message_is_indexed_into_its_routes_too(tmp_path: Path) -> None:
    store = EmbeddedStore(tmp_path, fsync="never")
    await store.open()
    try:
        p = Pipeline(store)
        p.appends.add(Message("t", b"x", qos=1, routes=("$queue/q", "all")), "ack")
        await p.run_until_idle()
        assert p.landed[0].batch[0].queues == ("t", "all", "$queue/q")  # each once
        assert [m.topic for m in (await store.read("$queue/q", 0, 10)).messages] == ["t"]
    finally:
        await store.close()


async def test_at_stop_the_acks_not_landed_are_taken_and_what_is_in_flight_still_lands(
        redis_store: RedisStore) -> None:
    p = Pipeline(redis_store)
    p.publish("a0")
    await p.step()
    p.publish("b0", "b1")
    await p.step()
    p.publish("c0")
    assert p.appends.take_acks() == ["ack-a0", "ack-b0", "ack-b1", "ack-c0"]  # refused: the node stops
    landed = await p.appends.step(wait=True)  # in flight: they still land, with no acks left to send
    landed += await p.appends.step(wait=True)  # c0, started by the step before
    assert [m.topic for x in landed for m in x.batch] == ["a0", "b0", "b1", "c0"]
    assert all(not x.acks for x in landed) and p.appends.idle


class FailingOddAppends(EmbeddedStore):
    """Appends 1, 3, 5, ... raise before touching the log (as a failed write does); the others go through."""

    calls = 0

    async def append(self, messages: Any, wildcard_version: int = -1) -> int | None:
        self.calls += 1
        if self.calls % 2:
            raise OSError("disk full")
        return await super().append(messages, wildcard_version)


async def test_what_landed_is_handed_over_before_the_next_append_may_fail(tmp_path: Path) -> None:
    store = FailingOddAppends(tmp_path, fsync="never")
    await store.open()
    try:
        p = Pipeline(store)
        p.publish("a0")
        with pytest.raises(OSError):
            await p.step()  # a0 fails; it stays first
        p.publish("b0")
        await p.step()  # a0 lands; b0 is not tried in this step (it would fail, and a0's landing with it)
        with pytest.raises(OSError):
            await p.step()
        await p.step()
        assert [m.topic for landed in p.landed for m in landed.batch] == ["a0", "b0"]
        assert p.acks() == ["ack-a0", "ack-b0"] and p.appends.idle
        assert await stored(store) == ["a0", "b0"]
    finally:
        await store.close()
