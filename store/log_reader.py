"""Reading the log from a position: `LogReader` over any `LogSource`, yielding engine-neutral `LogRecord`s.

This is the API for everything that consumes the log outside the gateway's delivery path (the lake bridge, any
future reader): it uses only the `LogSource` calls, never a store's internals or the record bytes. A reader
keeps its position (the last seq it has read) in one partition; persisting it (a checkpoint) and setting a hold
(`LogSource.hold_log`) are the caller's business.

Records removed by retention before the reader got to them are skipped, counted and logged: `lost` adds up the
seqs skipped (the embedded engine numbers records consecutively, so there that is the number of records lost;
a Redis partition's seqs are sparse, so there it only bounds them) and `gaps` counts the times it happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

from tidewire.store.base import PROTOCOL_NAMES, LogSource, Message
from tidewire.store.properties import Properties

log = logging.getLogger("tidewire.store.reader")


@dataclass(frozen=True, slots=True)
class LogRecord:
    """One message of the log, as a reader sees it. `properties` are the neutral properties (their
    `expiry_interval` stays None: the deadline is `expires_at_ms`, 0 for never)."""

    position: int  # the record's seq: unique in the log, ascending within a partition
    partition: int
    received_ms: int
    topic: str
    first_level: str
    client_id: str  # the publisher ("" for messages the gateway made itself)
    protocol: str  # "mqtt", "amqp", "rocketmq", "bridge" (store.base.PROTOCOL_NAMES)
    qos: int
    retain: bool
    payload: bytes
    expires_at_ms: int
    properties: Properties


def protocol_name(protocol: int) -> str:
    return PROTOCOL_NAMES[protocol] if 0 <= protocol < len(PROTOCOL_NAMES) else f"protocol-{protocol}"


def to_record(message: Message, partition: int) -> LogRecord:
    topic = message.topic
    return LogRecord(
        position=message.seq,
        partition=partition,
        received_ms=message.timestamp_ms,
        topic=topic,
        first_level=topic.split("/", 1)[0],
        client_id=message.publisher,
        protocol=protocol_name(message.protocol),
        qos=message.qos,
        retain=message.retain,
        payload=message.payload,
        expires_at_ms=message.expires_at_ms,
        properties=Properties.from_block(message.properties),
    )


class LogReader:
    """Reads one partition of `source` from `position` (exclusive) on."""

    def __init__(self, source: LogSource, partition: int, position: int) -> None:
        if not 0 <= partition < source.log_partitions():
            raise ValueError(f"partition {partition} is not one of the log's {source.log_partitions()}")
        self.source = source
        self.partition = partition
        self.position = position
        self.lost = 0  # seqs skipped because retention removed them first (see the module)
        self.gaps = 0
        self._closed = asyncio.Event()

    async def read(self, limit: int) -> list[LogRecord]:
        """The next records (at most `limit`), possibly none; `position` moves past them, and past every seq
        the source says holds nothing more."""
        answer = await self.source.read_log(self.partition, self.position, limit)
        if answer.trimmed > self.position:
            skipped = answer.trimmed - self.position
            self.lost += skipped
            self.gaps += 1
            log.warning("log reader: partition %d: retention removed seqs %d..%d before they were read",
                        self.partition, self.position + 1, answer.trimmed)
            self.position = answer.trimmed
        partition = self.partition
        records = [to_record(m, partition) for m in answer.messages if m.seq > self.position]
        self.position = max(self.position, answer.upto)
        return records

    async def tail(self, limit: int, idle_s: float) -> AsyncIterator[list[LogRecord]]:
        """Non-empty batches as they come; once caught up (nothing read and the position did not move), wait
        `idle_s` before reading again. Ends when `close()` is called."""
        while not self._closed.is_set():
            before = self.position
            batch = await self.read(limit)
            if batch:
                yield batch
            # A source may cut a read short of `limit` (Redis bounds each call's work): only an answer that moved
            # nothing means caught up.
            if not batch and self.position == before and not self._closed.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._closed.wait(), idle_s)

    def close(self) -> None:
        """Stop `tail` (at its next wait, or after the batch it is reading)."""
        self._closed.set()
