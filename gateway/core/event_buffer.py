"""Session and delivery events (connected, delivered, acked, ...) kept in a bounded buffer for an exporter.

The gateway only appends tuples; an exporter (the lake bridge's event writer) drains them on its own schedule.
When the buffer is full new events are counted in `dropped` and discarded: recording never blocks, allocates
beyond the bound, or slows a delivery down waiting for the exporter. The exporter counts what it took and could
not write in `failed` (`lost`), so every loss the buffer knows of is counted (`losses`): only what a crash takes
(at most `len(items)` plus what the exporter holds) is never counted.
"""

from __future__ import annotations

# (event, time_ms, client_id, protocol, topic, position, qos, dup, reason, detail, consumer_group, consumer_tag);
# the event names are pipeline.lake.event_names, the meaning of each field per event that of
# pipeline.lake.schema.EVENTS_SCHEMA.
Event = tuple[str, int, str, str, str | None, int | None, int | None, bool, str | None, str | None, str | None,
              str | None]

BUFFER_FULL = "buffer_full"  # `losses` reasons, the label of tidewire_lake_events_dropped_total
WRITE_FAILED = "write_failed"


class EventBuffer:
    """A bounded list of events; `drain()` takes them all at once (one swap, no copy)."""

    __slots__ = ("capacity", "dropped", "failed", "items", "recorded")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.items: list[Event] = []
        self.dropped = 0  # events discarded because the buffer was full (the exporter fell behind)
        self.failed = 0  # events drained but never written (the exporter's conversion or write failed)
        self.recorded = 0  # events taken into the buffer

    def add(self, event: str, time_ms: int, client_id: str, protocol: str = "mqtt", topic: str | None = None,
            position: int | None = None, qos: int | None = None, dup: bool = False, reason: str | None = None,
            detail: str | None = None, consumer_group: str | None = None, consumer_tag: str | None = None) -> None:
        items = self.items
        if len(items) >= self.capacity:
            self.dropped += 1
            return
        items.append((event, time_ms, client_id, protocol, topic, position, qos, dup, reason, detail, consumer_group,
                      consumer_tag))
        self.recorded += 1

    def drain(self) -> list[Event]:
        items = self.items
        self.items = []
        return items

    def lost(self, count: int) -> None:
        """`count` drained events will never be written."""
        self.failed += count

    def losses(self) -> dict[str, int]:
        """Events lost so far, by reason."""
        return {BUFFER_FULL: self.dropped, WRITE_FAILED: self.failed}
