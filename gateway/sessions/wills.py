"""Wills waiting for their delay (MQTT 5 Will Delay Interval): published when it runs out, unless the client
comes back first; the stored will record is deleted once it is published."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Any, Protocol

from tidewire.gateway.core.writes import RecordWrites
from tidewire.store.base import Message, Store, WillRecord, expiry_deadline


class _Timer(Protocol):
    def cancel(self) -> None: ...


CallLater = Callable[..., _Timer]  # (delay, callback, *args) -> a timer, as `loop.call_later`


def _loop_call_later(delay: float, callback: Callable[..., None], *args: Any) -> _Timer:
    return asyncio.get_running_loop().call_later(delay, callback, *args)


class DelayedWills:
    """`call_later` arms the delay's timer (the running loop's by default; a test passes its own clock's)."""

    __slots__ = ("_call_later", "_publish", "_timers", "_writes")

    def __init__(self, publish: Callable[[Message], None], writes: RecordWrites,
                 call_later: CallLater = _loop_call_later) -> None:
        self._publish = publish
        self._writes = writes
        self._call_later = call_later
        self._timers: dict[str, _Timer] = {}

    def publish_after(self, client_id: str, message: Message, delay: int) -> None:
        self.cancel(client_id)
        if delay <= 0:
            self._fire(client_id, message)
        else:
            self._timers[client_id] = self._call_later(delay, self._fire, client_id, message)

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


async def delay_left(store: Store, will: WillRecord, now_ms: int) -> int:
    """Seconds left of a stored will's delay (MQTT 5 3.1.2.5), for a will whose connection ended in a process that
    is gone: counted from its session's disconnect, and no later than the session's end; 0 when the session is
    gone or ends with its connection."""
    if will.delay_interval <= 0:
        return 0
    record = await store.get_session(will.client_id)
    if record is None or not record.disconnected_at_ms:
        return 0
    left_ms = will.delay_interval * 1000 - (now_ms - record.disconnected_at_ms)
    deadline = expiry_deadline(record)
    if deadline is not None:
        left_ms = min(left_ms, deadline - now_ms)
    return max(0, math.ceil(left_ms / 1000))
