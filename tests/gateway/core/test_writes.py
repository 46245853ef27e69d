"""Ordered fire-and-forget store writes: per-key order on a store that answers out of order, retries on
OSError, `settled`, and a bounded `close`."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable

from tidewire.gateway.core.writes import OrderedWrites


async def test_writes_of_one_key_land_in_issue_order_others_interleave() -> None:
    landed: list[tuple[str, int]] = []
    rng = random.Random(7)

    def write(key: str, n: int) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            await asyncio.sleep(rng.random() / 200)  # a store that answers late and out of order
            landed.append((key, n))
        return run

    writes = OrderedWrites()
    for n in range(20):
        for key in ("a", "b", "c"):
            writes.write(key, write(key, n))
    for key in ("a", "b", "c"):
        await writes.settled(key)
    for key in ("a", "b", "c"):
        assert [n for k, n in landed if k == key] == list(range(20))
    assert len(landed) == 60


async def test_a_failing_store_is_retried_until_it_recovers() -> None:
    attempts = 0

    async def flaky() -> None:
        nonlocal attempts
        attempts += 1
        if attempts < 4:
            raise ConnectionError("store down")

    done: list[str] = []

    async def after() -> None:
        done.append("after")

    writes = OrderedWrites()
    writes.write("k", flaky)
    writes.write("k", after)
    await writes.settled("k")
    assert attempts == 4 and done == ["after"]


async def test_close_waits_then_cancels_what_cannot_finish() -> None:
    async def forever() -> None:
        raise OSError("down for good")

    writes = OrderedWrites()
    writes.write("k", forever)
    assert await writes.close(timeout=0.05) == 1
    assert await writes.close(timeout=0.05) == 0
