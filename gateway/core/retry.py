"""Exponential backoff for a background loop's store calls, logged once per failure streak: a store that is
down must neither end the loop nor flood the log."""

from __future__ import annotations

import asyncio
import logging

from tidewire.gateway.core.clock import Clock
from tidewire.gateway.core.store_health import StoreHealth

log = logging.getLogger("tidewire.node")

RETRY_FIRST_S = 0.01  # backoff of a failing store call: doubles per failure up to RETRY_MAX_S
RETRY_MAX_S = 1.0
STORE_RETRY_S = 0.2  # a session's failed store read is tried again after this (the node's loops log the outage)


class Backoff:
    """Exponential backoff for one background loop's store calls, logged once per failure streak."""

    __slots__ = ("clock", "delay", "failures", "health", "since", "what")

    def __init__(self, what: str, clock: Clock, health: StoreHealth | None = None) -> None:
        self.what = what
        self.clock = clock  # how long a streak lasted (logged when it ends)
        self.health = health  # told of every failure and of the success that ends a streak
        self.delay = 0.0
        self.failures = 0
        self.since = 0.0

    def failed(self, exc: Exception) -> float:
        """Count a failure; returns the seconds to wait before the next attempt."""
        if not self.failures:
            self.since = self.clock.monotonic()
            log.error("store.failing", extra={"loop": self.what, "error": f"{type(exc).__name__}: {exc}"},
                      exc_info=exc)
        self.failures += 1
        if self.health is not None:
            self.health.report(self.what, exc)
        self.delay = min(RETRY_MAX_S, self.delay * 2 if self.delay else RETRY_FIRST_S)
        return self.delay

    def succeeded(self) -> None:
        if self.failures:
            if self.health is not None:
                self.health.report(self.what, None)
            log.warning("store.recovered", extra={"loop": self.what, "failures": self.failures,
                                                  "down_s": round(self.clock.monotonic() - self.since, 3)})
            self.failures = 0
            self.delay = 0.0


def stop_if_cancelled() -> None:
    """Call where a loop catches a store error: a client library (redis-py does) may turn the CancelledError of
    a stop into an error of its own, and a loop that retried it would never end."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
