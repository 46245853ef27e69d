"""The lake bridge: tails each log partition it owns from its checkpoint and exports it as Parquet, exactly once.

Ownership of a partition takes two things: the store lease `lake/pN` (in a cluster, exactly one bridge works a
partition; renewed every ttl/3, and once more right before each flush commits, so a bridge that lost it stops
without committing) and a non-blocking `flock` on `<lake>/_tidewire/pNN.lock` (two bridges on one lake never both
write a partition, whatever their leases say). A partition not owned is tried again every ttl.

Per owned partition one task reads with a `LogReader` from the checkpoint, buffers, and flushes when the buffer
reaches `flush_rows` rows or `flush_bytes`, or `flush_seconds` after its first record (a quiet log still shows
up within that bound). Building the Arrow table and writing Parquet run in a worker thread, so the event loop of
a node hosting the bridge only ever pays for one `read_batch` of reading. After each commit the bridge holds the
log at its checkpoint (`hold_log(p, "lake", position)`, set at start too): retention keeps what is not exported.
With `retention_days` the bridge also applies the lake's retention (`pipeline.lake.retention`) and exports no
record older than it, counted as `expired`: its checkpoint and hold move past them.

Messages on Sparkplug B topics are also decoded into the `sparkplug` table, one row per metric, in the same flush
(`pipeline.lake.sparkplug_rows`); the births' aliases are shared by the bridge's partitions (one `AliasBook`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from tidewire.pipeline.lake.retention import RETENTION_EVERY_S, cutoff_ms, remove_expired
from tidewire.pipeline.lake.rows import messages_table
from tidewire.pipeline.lake.writer import Checkpoint, MessagesWriter, PartitionLock, write_json_atomic
from tidewire.pipeline.sparkplug.topics import PREFIX as SPARKPLUG_PREFIX
from tidewire.store.base import LogSource
from tidewire.store.log_reader import LogReader, LogRecord

log = logging.getLogger(__name__)

HOLDER = "lake"  # the bridge's hold on the log
MAX_FLUSH_BYTES = 1 << 30  # one flush's payloads fit one Arrow binary array (32-bit offsets)
STOP_DRAIN_S = 5.0  # a graceful stop exports what the log holds for at most this long, then commits
RECORD_OVERHEAD = 96  # bytes counted per buffered record besides payload and topic
RETRY_S = 1.0  # after a failed read or flush
BUILD_CHUNK = 4096  # rows converted to Arrow per call (see _write)
SPARKPLUG_BIRTHS = 50_000  # births (edge nodes and devices) whose aliases are kept; the oldest go first


def _sparkplug_rows() -> Any:
    """`pipeline.lake.sparkplug_rows`, or None without protobuf (then no `sparkplug` table is written)."""
    try:
        from tidewire.pipeline.lake import sparkplug_rows
    except ImportError as e:
        log.warning("lake: no Sparkplug B decoding (%s): install the lake extra", e)
        return None
    return sparkplug_rows


def _weight(records: list[LogRecord]) -> int:
    """What buffered records count against `flush_bytes`."""
    return sum(len(r.payload) + len(r.topic) for r in records) + RECORD_OVERHEAD * len(records)


@dataclass(eq=False)
class _Partition:
    index: int
    writer: MessagesWriter
    lock: PartitionLock
    task: asyncio.Task[None] | None = None
    owned: bool = False
    fenced: bool = False  # the lease was lost: stop without committing
    done: bool = False  # --once: exported up to the end, or skipped
    next_try: float = 0.0  # monotonic time of the next ownership attempt
    lease_valid_until: float = 0.0
    checkpoint: Checkpoint = field(default_factory=Checkpoint)
    reader: LogReader | None = None
    buffer: list[LogRecord] = field(default_factory=list)
    buffer_bytes: int = 0
    dirty_since: float | None = None  # monotonic: first buffered record (or moved position) since the commit
    lost_committed: int = 0  # reader.lost already counted in a checkpoint
    caught_up: bool = False  # the last read returned nothing
    rows: int = 0  # this run's counters
    expired: int = 0  # records past the lake's retention, not exported
    files: int = 0
    flushes: int = 0


class LakeBridge:
    def __init__(self, source: LogSource, lake_dir: str | Path, *, owner: str, flush_rows: int = 100_000,
                 flush_bytes: int = 64 << 20, flush_seconds: float = 5.0, read_batch: int = 5000,
                 lease_ttl_ms: int = 15_000, idle_s: float = 0.2, compression: str = "zstd",
                 holder: str = HOLDER, retention_days: int = 0, sparkplug_births: int = SPARKPLUG_BIRTHS,
                 wall_ms: Callable[[], int] = lambda: int(time.time() * 1000)) -> None:
        if flush_rows < 1 or read_batch < 1 or lease_ttl_ms < 3 or flush_seconds < 0 or idle_s <= 0:
            raise ValueError("flush_rows, read_batch, lease_ttl_ms and idle_s must be positive")
        if sparkplug_births < 1:
            raise ValueError("sparkplug_births must be positive")
        self.source = source
        self.lake = Path(lake_dir)
        self.owner = owner
        self.flush_rows = flush_rows
        self.flush_bytes = min(max(1, flush_bytes), MAX_FLUSH_BYTES)
        self.flush_seconds = flush_seconds
        self.read_batch = read_batch
        self.lease_ttl_ms = lease_ttl_ms
        self.idle_s = idle_s
        self.compression = compression
        self.holder = holder  # another name only for a second lake exported from the same log
        if retention_days < 0:
            raise ValueError("retention_days must be 0 (keep forever) or more")
        self.retention_days = retention_days
        self._next_retention = 0.0  # monotonic
        self.wall_ms = wall_ms  # the clock retention's cutoff is taken from
        self._parts = {p: _Partition(p, MessagesWriter(self.lake, p, compression), PartitionLock(self.lake, p))
                       for p in range(source.log_partitions())}
        self._stopping = asyncio.Event()
        self._wake = asyncio.Event()  # the ownership loop: stop() or a worker ended
        self._finished = asyncio.Event()
        self._running = False
        self.failed: set[int] = set()  # partitions whose export failed (`once`: not retried)
        # Sparkplug B messages are decoded into the `sparkplug` table when protobuf is installed (the lake extra).
        self._sparkplug = _sparkplug_rows()
        self._book: Any = self._sparkplug.AliasBook(sparkplug_births) if self._sparkplug is not None else None
        self._book_lock = threading.Lock()
        if self._sparkplug is not None:
            self._sparkplug.load_book(self.lake, self._book)

    # --- lifecycle ----------------------------------------------------------------------------------------
    async def run(self, once: bool = False) -> None:
        """Export until `stop()` (or, with `once`, until every partition this bridge could own is exported up to
        the end of the log as the bridge saw it; partitions owned elsewhere are skipped)."""
        if self._running:
            raise RuntimeError("the bridge is already running")
        self._running = True
        self._finished.clear()
        for part in self._parts.values():
            part.done, part.next_try = False, 0.0
        ttl_s = self.lease_ttl_ms / 1000
        try:
            while not self._stopping.is_set():
                now = time.monotonic()
                for part in self._parts.values():
                    if part.task is not None and part.task.done():
                        await self._reap(part, once)
                    if part.owned:
                        await self._renew(part)
                    elif not part.done and now >= part.next_try:
                        await self._take(part, once)
                if once and all(p.done for p in self._parts.values()):
                    break
                if self.retention_days and now >= self._next_retention:
                    self._next_retention = now + RETENTION_EVERY_S
                    try:
                        await asyncio.to_thread(remove_expired, self.lake, self.retention_days, self.wall_ms())
                    except OSError as e:
                        log.warning("lake: retention: %s", e)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), ttl_s / 3)
                self._wake.clear()
        finally:
            self._stopping.set()
            tasks = [p.task for p in self._parts.values() if p.task is not None]
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
            for part in self._parts.values():
                if part.task is not None:
                    await self._reap(part, once)
            self._running = False
            self._finished.set()

    async def stop(self) -> None:
        """Flush and commit what the partitions have buffered, give the partitions up, return when done."""
        self._stopping.set()
        self._wake.set()
        if self._running:
            await self._finished.wait()

    def stats(self) -> dict[str, Any]:
        now_ms = int(time.time() * 1000)
        parts: dict[int, dict[str, Any]] = {}
        for p, part in self._parts.items():
            cp = part.checkpoint
            # The age of the oldest record not exported yet: buffered, or (reading behind) newer than the newest
            # exported one.
            if part.buffer:
                lag = max(0, now_ms - part.buffer[0].received_ms)
            elif part.caught_up or not cp.newest_received_ms:
                lag = 0
            else:
                lag = max(0, now_ms - cp.newest_received_ms)
            parts[p] = {"owned": part.owned, "position": cp.position,
                        "read_position": part.reader.position if part.reader is not None else cp.position,
                        "buffered": len(part.buffer), "rows": part.rows, "files": part.files,
                        "flushes": part.flushes, "lost": cp.lost, "expired": part.expired,
                        "lag_ms": lag if part.owned else 0}
        vals = parts.values()
        cps = [part.checkpoint for part in self._parts.values()]
        return {"rows": sum(v["rows"] for v in vals), "files": sum(v["files"] for v in vals),
                "sparkplug": {"rows": sum(c.sparkplug_rows for c in cps),
                              "malformed": sum(c.sparkplug_malformed for c in cps),
                              "unresolved": sum(c.sparkplug_unresolved for c in cps)},
                "flushes": sum(v["flushes"] for v in vals), "lost": sum(v["lost"] for v in vals),
                "expired": sum(v["expired"] for v in vals),
                "lag_ms": max((v["lag_ms"] for v in vals), default=0),
                "owned": sorted(p for p, v in parts.items() if v["owned"]), "failed": sorted(self.failed),
                "partitions": parts}

    # --- ownership ----------------------------------------------------------------------------------------
    def _key(self, part: _Partition) -> str:
        return f"lake/p{part.index}"

    async def _take(self, part: _Partition, once: bool) -> None:
        part.next_try = time.monotonic() + self.lease_ttl_ms / 1000
        try:
            epoch = await self.source.lease(self._key(part), self.owner, self.lease_ttl_ms)
        except Exception as e:  # the store is away: try again later
            log.warning("lake: p%d: lease: %s", part.index, e)
            return
        # An flock refused after the lease was granted keeps the lease: its owner name may be shared with the
        # bridge holding the lock (same host), and releasing would take it from that one.
        if not epoch or not await asyncio.to_thread(part.lock.acquire):
            if once:
                log.info("lake: p%d is exported by another bridge: skipped", part.index)
                part.done = True
            return
        part.owned, part.fenced, part.caught_up = True, False, False
        part.lease_valid_until = time.monotonic() + self.lease_ttl_ms / 1000
        part.task = asyncio.get_running_loop().create_task(self._work(part, once), name=f"lake-p{part.index}")
        log.info("lake: took partition %d (owner %s)", part.index, self.owner)

    async def _renew(self, part: _Partition) -> None:
        try:
            epoch = await self.source.lease(self._key(part), self.owner, self.lease_ttl_ms)
        except Exception as e:
            log.warning("lake: p%d: lease renewal: %s", part.index, e)
            if time.monotonic() > part.lease_valid_until:
                part.fenced = True
            return
        if epoch:
            part.lease_valid_until = time.monotonic() + self.lease_ttl_ms / 1000
        else:
            log.warning("lake: lost the lease of partition %d: stopping its export", part.index)
            part.fenced = True

    async def _reap(self, part: _Partition, once: bool) -> None:
        """A worker ended (stopped, fenced, done or failed): give the partition up."""
        task, part.task = part.task, None
        if task is not None and not task.cancelled() and task.exception() is not None:
            log.error("lake: p%d worker failed", part.index, exc_info=task.exception())
            if once:
                part.done = True
                self.failed.add(part.index)
        part.lock.release()
        owned, part.owned = part.owned and not part.fenced, False
        part.buffer, part.buffer_bytes, part.dirty_since = [], 0, None
        if owned:
            try:
                await self.source.release(self._key(part), self.owner)
            except Exception as e:  # it lapses after its ttl anyway
                log.warning("lake: p%d: lease release: %s", part.index, e)

    # --- export -------------------------------------------------------------------------------------------
    async def _work(self, part: _Partition, once: bool) -> None:
        try:
            await self._export(part, once)
        finally:
            self._wake.set()

    async def _export(self, part: _Partition, once: bool) -> None:
        part.checkpoint = await asyncio.to_thread(part.writer.recover)
        part.lost_committed = 0
        await self.source.hold_log(part.index, self.holder, part.checkpoint.position)
        reader = part.reader = LogReader(self.source, part.index, part.checkpoint.position)
        while not part.fenced:
            if self._stopping.is_set():
                await self._drain(part, reader)
                await self._flush(part)
                return
            before = reader.position
            try:
                records = await reader.read(self.read_batch)
            except Exception as e:
                if once:
                    raise
                log.warning("lake: p%d: read: %s", part.index, e)
                await self._sleep(RETRY_S)
                continue
            # An in-process source (the embedded store) answers without suspending: yield once per batch, so
            # the loop is never held for more than one read_batch.
            await asyncio.sleep(0)
            now = time.monotonic()
            if records:
                part.buffer += records
                part.buffer_bytes += _weight(records)
            # A source may cut a read short (Redis bounds each call's work): caught up only when nothing moved.
            caught_up = part.caught_up = not records and reader.position == before
            if part.dirty_since is None and (records or reader.position != part.checkpoint.position
                                             or reader.lost != part.lost_committed):
                part.dirty_since = now
            if part.dirty_since is not None and (
                    self._full(part) or now - part.dirty_since >= self.flush_seconds or (once and caught_up)):
                await self._flush(part)
            if caught_up:
                if once:
                    part.done = True
                    return
                wait = self.idle_s
                if part.dirty_since is not None:
                    wait = min(wait, max(0.0, part.dirty_since + self.flush_seconds - time.monotonic()))
                await self._sleep(wait)

    async def _drain(self, part: _Partition, reader: LogReader) -> None:
        """On a graceful stop, read up to the end of the log (for at most STOP_DRAIN_S) so what was appended
        before the stop is exported now rather than by the next run."""
        deadline = time.monotonic() + STOP_DRAIN_S
        while not part.fenced and time.monotonic() < deadline:
            before = reader.position
            try:
                records = await reader.read(self.read_batch)
            except Exception as e:
                log.warning("lake: p%d: read while stopping: %s", part.index, e)
                return
            if records:
                part.buffer += records
                part.buffer_bytes += _weight(records)
                if part.dirty_since is None:
                    part.dirty_since = time.monotonic()
                if self._full(part):
                    await self._flush(part)
            elif reader.position == before:
                return
            await asyncio.sleep(0)

    def _full(self, part: _Partition) -> bool:
        return len(part.buffer) >= self.flush_rows or part.buffer_bytes >= self.flush_bytes

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)

    async def _flush(self, part: _Partition) -> None:
        reader = part.reader
        if reader is None or part.fenced:
            return
        records, position = part.buffer, reader.position
        lost = reader.lost - part.lost_committed
        if not records and position == part.checkpoint.position and not lost:
            part.dirty_since = None
            return
        # Renew right before committing: a bridge that lost the partition must not publish (the new owner reads
        # from the same checkpoint).
        await self._renew(part)
        if part.fenced:
            return
        part.buffer, part.buffer_bytes, part.dirty_since = [], 0, None
        if self.retention_days:
            # A record past retention would recreate a day retention removed: skipped, and the checkpoint (so
            # the hold on the log) still moves past it.
            cutoff = cutoff_ms(self.retention_days, self.wall_ms())
            kept = [r for r in records if r.received_ms >= cutoff]
            part.expired += len(records) - len(kept)
            records = kept
        try:
            cp = await asyncio.to_thread(self._write, part.writer, records, position, lost)
        except Exception as e:
            log.error("lake: p%d: flush to %d failed: %s", part.index, position, e)
            cp = await asyncio.to_thread(part.writer.recover)  # completes the flush if it got past its manifest
            if cp.position < position:  # not committed: keep the records for the next try
                part.buffer = records + part.buffer
                part.buffer_bytes += _weight(records)
                part.dirty_since = time.monotonic() - self.flush_seconds + RETRY_S
                part.checkpoint = cp
                return
        part.lost_committed += lost
        part.rows += cp.rows - part.checkpoint.rows
        part.files += cp.files - part.checkpoint.files
        part.flushes += 1
        part.checkpoint = cp
        try:
            await self.source.hold_log(part.index, self.holder, cp.position)
        except Exception as e:  # the next commit sets it again; meanwhile the older hold protects more
            log.warning("lake: p%d: hold: %s", part.index, e)

    def _write(self, writer: MessagesWriter, records: list[LogRecord], position: int, lost: int) -> Checkpoint:
        # Built in chunks: converting a column of Python objects holds the GIL for the whole call, and the event
        # loop's thread waits on that GIL; a chunk keeps each hold to a few milliseconds.
        if len(records) <= BUILD_CHUNK:
            table = messages_table(records)
        else:
            table = pa.concat_tables([messages_table(records[i:i + BUILD_CHUNK])
                                      for i in range(0, len(records), BUILD_CHUNK)])
        sparkplug = None
        if self._sparkplug is not None and any(r.topic.startswith(SPARKPLUG_PREFIX) for r in records):
            sparkplug = self._sparkplug.sparkplug_table(records, self._book)
            # Saved before the commit: births in this flush are in the file before the checkpoint passes them (a
            # crash in between reads them again, which learns the same).
            with self._book_lock:  # a partition that finds nothing changed finds the file written
                if self._book.changed:
                    write_json_atomic(self._sparkplug.book_path(self.lake, self.owner), self._book.to_json())
        return writer.flush(table, position, lost, sparkplug)
