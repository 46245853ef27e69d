"""De-duplication keys a node stored for publishers that name their messages (a RocketMQ message id, an AMQP
message-id), each released a set time after the store took it, so a retry of the send within that time, on any
node, is not stored twice (`store.base.Message.dedupe`).

A node killed first leaves its keys held: a retry of those ids is still answered as a retry. The releases go
through the node's ordered writes (`gateway.core.writes.RecordWrites.release_keys`), batched per scope.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque

from tidewire.gateway.core.clock import Clock
from tidewire.gateway.core.writes import RecordWrites


class HeldKeys:
    """Keys released in the order they were held, `seconds` after (one task while any is held)."""

    __slots__ = ("_clock", "_held", "_task", "_writes", "seconds")

    def __init__(self, writes: RecordWrites, clock: Clock, seconds: float) -> None:
        self._writes = writes
        self._clock = clock
        self.seconds = seconds
        self._held: deque[tuple[float, str, str]] = deque()  # (monotonic deadline, scope, id)
        self._task: asyncio.Task[None] | None = None

    def hold(self, scope: str, key_id: str) -> None:
        """The store took a message with this key: release it `seconds` from now."""
        self._held.append((self._clock.monotonic() + self.seconds, scope, key_id))
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._release_due())

    async def _release_due(self) -> None:
        held = self._held
        clock = self._clock
        while held:
            wait = held[0][0] - clock.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            now = clock.monotonic()
            due: dict[str, list[str]] = {}
            while held and held[0][0] <= now:
                _, scope, key_id = held.popleft()
                due.setdefault(scope, []).append(key_id)
            for scope, ids in due.items():
                self._writes.release_keys(scope, ids)
        self._task = None

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
