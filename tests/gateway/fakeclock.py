"""A clock moved by hand (`gateway.core.clock.Clock`): give it to a node (`Node(..., clock=clock)`) or a channel and
move it with `advance`; every reading of the time the node makes sees it, so a test of expiry, timeouts or
deadlines waits for nothing. What the node bounds by its clock (the drain's and stop's deadlines) then ends by its
own condition, or when the test moves the clock past it."""

from __future__ import annotations


class FakeClock:
    def __init__(self, mono: float = 1000.0, wall: float = 1_800_000_000.0) -> None:
        self.mono = mono
        self.wall = wall

    def monotonic(self) -> float:
        return self.mono

    def time(self) -> float:
        return self.wall

    def advance(self, seconds: float) -> None:
        self.mono += seconds
        self.wall += seconds
