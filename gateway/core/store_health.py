"""Whether this node can reach its store now, from the store calls its loops make anyway (the publish pipeline,
housekeeping every second, cluster heartbeats): no probe of its own.

The store is down from the first failure of any loop's store call until every loop that failed has had a call
succeed again (each keeps trying: `gateway.core.retry.Backoff`). While it is down the node refuses new clients
(`gateway.transport.admission`: MQTT CONNACK 0x88 / 3), /readyz answers 503 with `reason()`, and the metric
`tidewire_store_up` reads 0; clients already connected stay, their publishes acked only once stored. One log line
when the store goes, one when it is back.
"""

from __future__ import annotations

import logging

from tidewire.gateway.core.clock import Clock

log = logging.getLogger("tidewire.node")


class StoreHealth:
    """Failure streaks of the node's store-calling loops, by loop name."""

    __slots__ = ("_clock", "_failing", "_since")

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._failing: dict[str, str] = {}  # loop -> its last error
        self._since = 0.0  # monotonic: when the store went down

    @property
    def down(self) -> bool:
        return bool(self._failing)

    def report(self, what: str, error: BaseException | None) -> None:
        """A store call of loop `what` failed with `error`, or (None) succeeded."""
        if error is None:
            if self._failing.pop(what, None) is not None and not self._failing:
                log.warning("store.reachable", extra={"down_s": round(self._clock.monotonic() - self._since, 3)})
            return
        if not self._failing:
            self._since = self._clock.monotonic()
            log.error("store.unreachable", extra={"loop": what, "error": _describe(error),
                                                  "effect": "refusing new clients until the store answers"})
        self._failing[what] = _describe(error)

    def down_for(self) -> float:
        """Seconds since the store went down (0 while it is up)."""
        return self._clock.monotonic() - self._since if self._failing else 0.0

    def reason(self) -> str | None:
        """Why the store counts as down, for /readyz; None while it is up."""
        if not self._failing:
            return None
        what, error = next(iter(self._failing.items()))
        return f"store unreachable for {self.down_for():.1f} s ({what}: {error})"


def _describe(error: BaseException) -> str:
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
