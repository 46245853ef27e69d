"""The deadlines of many connections (CONNECT timeout, keepalive, close drain) on one loop timer per listener:
the timer wheel every protocol's connections file themselves in."""

from __future__ import annotations

import asyncio
import heapq
import logging
from typing import Protocol

from tidewire.gateway.core.clock import SYSTEM_CLOCK, Clock

log = logging.getLogger("tidewire.listener")

DEADLINE_TICK_S = 0.1  # deadlines are kept to this grain: one may fire up to this late
_TIMER_SLACK_S = 0.002  # loop timers have 1 ms grain and may wake this much early: counted as on time


class Timed(Protocol):
    def deadline_due(self, now: float) -> None:
        """Its deadline passed (`now`: the deadlines' clock's monotonic time): act, or file itself again."""


Bucket = set[Timed]


class Deadlines:
    """The deadlines of many connections (CONNECT timeout, keepalive, close drain) on one timer instead of one
    each: a uvloop timer costs a connection ~0.5 KB and two loop calls. A connection sits in the bucket of the
    tick its deadline falls in; the timer wakes for the earliest tick and tells each connection of that bucket,
    which checks its own condition (its keepalive deadline may have moved since) and files itself again if it
    must. Times are `clock.monotonic()` (the node's clock)."""

    __slots__ = ("_armed", "_buckets", "_clock", "_handle", "_ticks")

    def __init__(self, clock: Clock = SYSTEM_CLOCK) -> None:
        self._clock = clock
        self._buckets: dict[int, Bucket] = {}
        self._ticks: list[int] = []  # heap: the tick of every bucket
        self._handle: asyncio.TimerHandle | None = None
        self._armed = 0  # the tick the timer is set for

    def __len__(self) -> int:
        return sum(map(len, self._buckets.values()))

    def file(self, item: Timed, when: float) -> Bucket:
        """Tell `item` at `when` (or up to one tick later); returns its bucket, for `Bucket.discard(item)`."""
        tick = -int(-when // DEADLINE_TICK_S)  # rounded up: never early
        bucket = self._buckets.get(tick)
        if bucket is None:
            bucket = self._buckets[tick] = set()
            heapq.heappush(self._ticks, tick)
            if self._handle is None or tick < self._armed:
                self._arm(tick)
        bucket.add(item)
        return bucket

    def _arm(self, tick: int) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._armed = tick
        delay = tick * DEADLINE_TICK_S - self._clock.monotonic()
        self._handle = asyncio.get_running_loop().call_later(delay if delay > 0 else 0, self._fire)

    def _fire(self) -> None:
        self._handle = None
        now = self._clock.monotonic() + _TIMER_SLACK_S
        ticks, buckets = self._ticks, self._buckets
        while ticks and ticks[0] * DEADLINE_TICK_S <= now:
            bucket = buckets.pop(heapq.heappop(ticks), None)
            while bucket:  # popped one by one: a connection closed by another's deadline leaves the bucket
                try:
                    bucket.pop().deadline_due(now)
                except Exception:  # one connection's bug must not stop the deadlines of all others
                    log.exception("deadline.failed")
        if ticks:
            self._arm(ticks[0])
