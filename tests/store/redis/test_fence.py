"""The append fence of the Redis engine (`store.redis.fence`): one writer's appends in flight at once land in
the order it issued them, on a real redis-server, even when the later one reaches Redis first or the earlier
one fails. The order of arrival is forced by holding the earlier append's round trip back in the client."""
# ruff: noqa: F811 - the fixtures imported from the support module are requested by name as parameters

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.store.redis.redis_cluster_support import OPEN, msg, opened, server  # noqa: F401 - fixtures by name
from tests.store.redis_server import RedisServer
from tests.waiting import until
from tidewire.store.base import append_depth
from tidewire.store.redis.engine import RedisStore
from tidewire.store.redis.fence import PredecessorFailed


class HeldFirstAppend:
    """The store's next append waits (after its fence ticket is issued, before it is sent) until `release()`,
    then is sent, or fails as a lost connection would before sending; `answered` counts the other appends'
    round trips that came back (only appends: the store's sealer makes round trips of its own meanwhile)."""

    def __init__(self, store: RedisStore, *, then_fail: bool = False) -> None:
        self.released = asyncio.Event()
        self.answered = 0
        conn: Any = store._conn
        run_many = conn.run_many
        held = False

        async def run_many_holding_the_first(calls: Any, **kw: Any) -> Any:
            nonlocal held
            append = bool(calls) and calls[0][0].name == "append"
            if append and not held:
                held = True
                await self.released.wait()
                if then_fail:
                    raise ConnectionResetError("connection lost before the append was sent")
                return await run_many(calls, **kw)
            got = await run_many(calls, **kw)
            self.answered += append
            return got

        conn.run_many = run_many_holding_the_first

    def release(self) -> None:
        self.released.set()


async def topics(store: RedisStore, queue: str) -> list[str]:
    return [m.topic for m in (await store.read(queue, 0, 1000)).messages]


async def test_a_later_append_arriving_first_waits_for_the_earlier(server: RedisServer, opened: OPEN) -> None:
    store = await opened(server.url)
    assert append_depth(store) == 2
    await store.append([msg("warm", "q")])  # scripts loaded
    held = HeldFirstAppend(store)
    first = asyncio.create_task(store.append([msg("first", "q")]))
    second = asyncio.create_task(store.append([msg("second", "q")]))
    await until(lambda: held.answered == 1)  # the second reached Redis first and was refused by the fence
    assert not second.done() and await topics(store, "q") == ["warm"]  # it waits; nothing stored
    held.release()
    await asyncio.gather(first, second)
    assert await topics(store, "q") == ["warm", "first", "second"]


async def test_when_the_earlier_append_fails_the_later_is_not_stored_either(server: RedisServer,
                                                                          opened: OPEN) -> None:
    store = await opened(server.url)
    await store.append([msg("warm", "q")])
    held = HeldFirstAppend(store, then_fail=True)
    first = asyncio.create_task(store.append([msg("first", "q")]))
    second = asyncio.create_task(store.append([msg("second", "q")]))
    await until(lambda: held.answered == 1)  # refused by the fence: it waits for the first
    held.release()
    with pytest.raises(ConnectionResetError):
        await first
    with pytest.raises(PredecessorFailed):
        await second
    assert await topics(store, "q") == ["warm"]  # the caller sends both again, in order
    await store.append([msg("first", "q")])
    await store.append([msg("second", "q")])
    assert await topics(store, "q") == ["warm", "first", "second"]


async def test_many_appends_in_flight_land_in_call_order(server: RedisServer, opened: OPEN) -> None:
    store = await opened(server.url)
    await asyncio.gather(*(store.append([msg(f"t{i}", "q"), msg(f"u{i}", "q")]) for i in range(60)))
    assert await topics(store, "q") == [t for i in range(60) for t in (f"t{i}", f"u{i}")]


async def test_with_several_partitions_a_caller_appends_one_at_a_time(server: RedisServer, opened: OPEN) -> None:
    # Measured: two in flight let publishers outrun what other nodes read back across the partitions.
    assert append_depth(await opened(server.url, partitions=16)) == 1
