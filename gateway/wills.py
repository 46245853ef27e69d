"""Wills waiting for their delay (MQTT 5 Will Delay Interval): published when it runs out, unless the client
comes back first; the stored will record is deleted once it is published."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from gateway.writes import RecordWrites
from store.base import Message


class DelayedWills:
    __slots__ = ("_publish", "_timers", "_writes")

    def __init__(self, publish: Callable[[Message], None], writes: RecordWrites) -> None:
        self._publish = publish
        self._writes = writes
        self._timers: dict[str, asyncio.TimerHandle] = {}

    def publish_after(self, client_id: str, message: Message, delay: int) -> None:
        self.cancel(client_id)
        if delay <= 0:
            self._fire(client_id, message)
        else:
            self._timers[client_id] = asyncio.get_running_loop().call_later(delay, self._fire, client_id, message)

    def cancel(self, client_id: str) -> None:
        """The client is back: its will is not published."""
        handle = self._timers.pop(client_id, None)
        if handle is not None:
            handle.cancel()

    def cancel_all(self) -> None:
        """Shutdown: the wills stay stored and are published by the next start."""
        for handle in self._timers.values():
            handle.cancel()
        self._timers.clear()

    def _fire(self, client_id: str, message: Message) -> None:
        self._timers.pop(client_id, None)
        self._publish(message)
        self._writes.drop_will(client_id)
