"""Waiting on conditions, not sleeping: the one polling helper of the suite.

`until` (in a coroutine) and `wait_until` (in a thread: subprocess gateways, paho clients) poll a predicate until
it is true and raise AssertionError naming what was awaited when `timeout` passes first. A wait ends as soon as
the condition holds, so it is both faster and safer than a sleep long enough for a slow machine.

`what` names the awaited condition in the failure message; a callable is called at failure time, to report the
state that was seen (e.g. `what=lambda: f"3 messages, got {got}"`). Without it the message quotes the predicate's
source line.

A sleep left in a test is the behaviour under test (a keepalive, an expiry, a rate limit refilling) or a check
that nothing happens within a time (there is no event to wait on); both say so in a comment where they sleep.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable

__all__ = ["describe", "until", "wait_until"]

Description = str | Callable[[], str] | None


def describe(predicate: Callable[[], object], what: Description = None) -> str:
    """`what` (called if callable) or, without one, the predicate's source line."""
    if what is None:
        try:
            return inspect.getsource(predicate).strip()
        except (OSError, TypeError):
            return getattr(predicate, "__qualname__", repr(predicate))
    return what() if callable(what) else what


async def until(predicate: Callable[[], object | Awaitable[object]], timeout: float = 5.0,
                what: Description = None, interval: float = 0.005) -> None:
    """Poll `predicate` (a function, or a coroutine function) every `interval` seconds until it returns a true
    value; raise AssertionError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {describe(predicate, what)}")
        await asyncio.sleep(interval)


def wait_until(predicate: Callable[[], object], timeout: float = 5.0, what: Description = None,
               interval: float = 0.02) -> None:
    """`until` for threads: poll `predicate` every `interval` seconds (blocking) until it returns a true value;
    raise AssertionError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {describe(predicate, what)}")
        time.sleep(interval)
