"""The gateway's session and delivery events (`gateway.core.event_buffer.EventBuffer`) exported to `<lake>/events/`.

Files are `events/dt=YYYY-MM-DD/hour=HH/<node>-<first time ms>-<n>.parquet` (`n` counts this exporter's files),
each written under a leading-dot name, synced and renamed. Events are AT MOST ONCE: they live only in the
gateway's memory until a flush, so a crash (or kill -9) loses what was buffered (uncounted: at most the
`buffered` of `stats()` at that moment), a full buffer drops new events (`buffer.dropped`) and a failed conversion
or write loses what it held (`buffer.failed`); both counted, in `stats()` and in the node's
tidewire_lake_events_dropped_total. They are observations for analytics, not data: the messages themselves are
exported exactly once from the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from tidewire.gateway.core.event_buffer import EventBuffer
from tidewire.pipeline.lake.rows import events_table
from tidewire.pipeline.lake.schema import EVENTS
from tidewire.pipeline.lake.writer import hour_dir, remove_tmp_files, write_split

log = logging.getLogger(__name__)

_UNSAFE = re.compile(r"[^A-Za-z0-9_.=+-]")


def node_file_prefix(node: str) -> str:
    """The node id as a file name part: no path separators, no leading `.`/`_` (readers would skip the file)."""
    safe = _UNSAFE.sub("_", node) or "node"
    return "n" + safe if safe[0] in "._" else safe


class EventExporter:
    """Drains `buffer` every `poll_s` into Arrow (in a worker thread: the node's tuples never pile up as
    Python objects, so no large conversion or garbage collection lands on the gateway's loop) and writes an
    events file every `flush_seconds` (sooner once `flush_rows` are converted)."""

    def __init__(self, buffer: EventBuffer, lake_dir: str | Path, node: str, flush_rows: int = 100_000,
                 flush_seconds: float = 5.0, compression: str = "zstd", poll_s: float = 0.05) -> None:
        self.buffer = buffer
        self.lake = Path(lake_dir)
        self.node = node
        self.prefix = node_file_prefix(node)
        self.flush_rows = max(1, flush_rows)
        self.flush_seconds = flush_seconds
        self.compression = compression
        self.poll_s = poll_s
        self.rows = 0
        self.files = 0
        self.flushes = 0
        self._seq = 0
        self._tables: list[pa.Table] = []  # converted, not yet written
        self._converted = 0
        self._stopping = asyncio.Event()
        self._cleaned = False

    async def run(self) -> None:
        """Export until `stop()`; the last flush happens on the way out."""
        last = time.monotonic()
        try:
            while not self._stopping.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), min(self.poll_s, self.flush_seconds or self.poll_s))
                await self._convert()
                now = time.monotonic()
                if self._converted >= self.flush_rows or now - last >= self.flush_seconds:
                    await self.flush()
                    last = now
        finally:
            await self.flush()

    async def stop(self) -> None:
        self._stopping.set()

    async def _convert(self) -> None:
        events = self.buffer.drain()
        if not events:
            return
        try:
            table = await asyncio.to_thread(events_table, events, self.node)
        except Exception as e:  # a bad event must not stop the exporter (the buffer would only fill up)
            self.buffer.lost(len(events))
            log.error("lake: converting %d events failed (lost): %s", len(events), e)
            return
        self._tables.append(table)
        self._converted += len(events)

    async def flush(self) -> int:
        """Write what the buffer holds now; returns how many events were written."""
        await self._convert()
        tables, count = self._tables, self._converted
        self._tables, self._converted = [], 0
        if not count:
            return 0
        try:
            written = await asyncio.to_thread(self._write, tables)
        except Exception as e:
            self.buffer.lost(count)
            log.error("lake: writing %d events failed (lost): %s", count, e)
            return 0
        self.rows += count
        self.files += written
        self.flushes += 1
        return count

    def _write(self, tables: list[pa.Table]) -> int:
        if not self._cleaned:  # a previous process of this node may have died mid-write
            remove_tmp_files(self.lake / EVENTS, re.compile(re.escape(self.prefix) + "-[0-9]+-[0-9]+"))
            self._cleaned = True
        table = pa.concat_tables(tables)

        def name(hour: int, part: pa.Table) -> str:
            first = pc.min(part.column("time").cast(pa.int64())).as_py()
            while True:  # a restarted exporter counts from 1 again: never replace an older file
                self._seq += 1
                candidate = f"{self.prefix}-{first}-{self._seq}"
                if not (self.lake / EVENTS / hour_dir(hour) / (candidate + ".parquet")).exists():
                    return candidate

        return len(write_split(table, self.lake / EVENTS, "time", name, self.compression))

    def stats(self) -> dict[str, Any]:
        return {"rows": self.rows, "files": self.files, "flushes": self.flushes, "failed": self.buffer.failed,
                "dropped": self.buffer.dropped, "buffered": len(self.buffer.items) + self._converted}
