"""`awaited`: a plain `await` that also tells whether the awaited coroutine suspended.

A module of its own because it must stay interpreted: `types.coroutine` makes a generator awaitable, which a
compiled (mypyc) generator cannot be, and the dispatch that uses it is compiled.
"""

from __future__ import annotations

import types
from collections.abc import Coroutine, Generator
from typing import Any, TypeVar

T = TypeVar("T")


@types.coroutine
def awaited(coro: Coroutine[Any, Any, T]) -> Generator[Any, Any, tuple[T, bool]]:
    """`await coro` in the calling task: its result, and whether it suspended (False: it ran to its end at once).

    Exactly `yield from`: whatever the coroutine waits on is handed to the calling task, and what the task
    sends or throws back is handed on, so it runs in the caller's task as a plain `await` would."""
    try:
        pending = coro.send(None)
    except StopIteration as done:
        return done.value, False
    while True:
        try:
            sent = yield pending
        except GeneratorExit:
            coro.close()
            raise
        except BaseException as exc:  # a cancel, too, is the coroutine's to handle
            try:
                pending = coro.throw(exc)
            except StopIteration as done:
                return done.value, True
        else:
            try:
                pending = coro.send(sent)
            except StopIteration as done:
                return done.value, True
