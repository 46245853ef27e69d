"""The clock, passed in: whatever reads time (connections' deadlines, message timestamps) takes a `Clock`, so a
test can move time by hand instead of sleeping."""

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
