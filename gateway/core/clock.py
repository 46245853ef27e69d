"""The clock, passed in: whatever reads time (connections' deadlines, message timestamps, expiry) takes a `Clock`,
so a test can move time by hand instead of sleeping. A node has one (`Node(..., clock=...)`, `node.clock`) and
hands it to its parts; nothing under gateway/ or admin/ reads the system's time itself
(`tests/gateway/core/test_clock.py`). Epoch milliseconds are `int(clock.time() * 1000)`."""

from __future__ import annotations

import time as _time
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds for intervals and deadlines (never goes back)."""

    def time(self) -> float:
        """Epoch seconds, for timestamps and wall-clock expiry (a token's `exp`)."""


class SystemClock:
    """The system's clocks; the functions themselves, so a read costs no extra Python call."""

    __slots__ = ()
    monotonic = staticmethod(_time.monotonic)
    time = staticmethod(_time.time)


SYSTEM_CLOCK = SystemClock()
