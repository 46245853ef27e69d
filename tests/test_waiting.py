"""The suite's wait helpers end as soon as the condition holds and fail, naming it, when it never does."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.waiting import until, wait_until


def counter() -> tuple[list[int], Callable[[int], Callable[[], bool]]]:
    """`calls` and `at_least(n)`: a predicate counting its calls, true from the n-th."""
    calls: list[int] = []

    def at_least(n: int) -> Callable[[], bool]:
        def predicate() -> bool:
            calls.append(1)
            return len(calls) >= n
        return predicate

    return calls, at_least


async def test_until_returns_once_the_predicate_holds() -> None:
    calls, at_least = counter()
    await until(at_least(3), timeout=1.0)
    assert len(calls) == 3


async def test_until_awaits_a_coroutine_predicate() -> None:
    seen: list[int] = []

    async def ready() -> bool:
        seen.append(1)
        return len(seen) == 2

    await until(ready, timeout=1.0)
    assert len(seen) == 2


async def test_until_fails_naming_what_it_waited_for() -> None:
    with pytest.raises(AssertionError, match=r"timed out after 0.05s waiting for the answer"):
        await until(lambda: False, timeout=0.05, what="the answer")
    with pytest.raises(AssertionError, match=r"waiting for 2 messages, got 1"):
        await until(lambda: False, timeout=0.05, what=lambda: "2 messages, got 1")
    with pytest.raises(AssertionError, match=r"lambda: 1 == 2"):  # no `what`: the predicate's source
        await until(lambda: 1 == 2, timeout=0.05)


def test_wait_until_returns_once_the_predicate_holds_and_fails_naming_it() -> None:
    calls, at_least = counter()
    wait_until(at_least(2), timeout=1.0, interval=0.001)
    assert len(calls) == 2
    with pytest.raises(AssertionError, match=r"timed out after 0.05s waiting for the port"):
        wait_until(lambda: False, timeout=0.05, what="the port")
