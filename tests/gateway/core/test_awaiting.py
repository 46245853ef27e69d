"""`gateway.core.awaiting.awaited`: a plain await (result, exception, cancellation reach where they would) that
tells whether the coroutine suspended."""

from __future__ import annotations

import asyncio

import pytest

from tidewire.gateway.core.awaiting import awaited


async def test_awaited_is_a_plain_await_that_tells_whether_it_suspended() -> None:
    async def at_once() -> int:
        return 1

    async def later() -> int:
        await asyncio.sleep(0)  # suspends once
        return 2

    async def fails() -> None:
        await asyncio.sleep(0)  # suspends once
        raise ValueError("boom")

    assert await awaited(at_once()) == (1, False)
    assert await awaited(later()) == (2, True)
    with pytest.raises(ValueError, match="boom"):
        await awaited(fails())

    seen: list[str] = []

    async def waits() -> None:
        try:
            await asyncio.sleep(10)  # suspended until cancelled
        except asyncio.CancelledError:
            seen.append("cancelled inside")
            raise

    async def outer() -> None:
        await awaited(waits())

    task = asyncio.get_running_loop().create_task(outer())
    await asyncio.sleep(0)  # one turn: the task starts and suspends inside `waits`
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen == ["cancelled inside"]
