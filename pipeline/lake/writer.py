"""Parquet files that appear atomically in the lake, and the messages' exactly-once flush protocol per partition.

A file is written as `.<name>.parquet.tmp` next to its final name, fsynced, renamed, and its directory fsynced:
readers (which skip names starting with `.` or `_`) never see a partial file.

Exactly once for messages, per log partition, with state under `<lake>/_tidewire/`:

1. `stage`: every file of the flush is written as a tmp file and fsynced;
2. `write_manifest`: `pending-pNN.json` (atomically) lists the renames and the checkpoint they lead to;
3. `publish`: every tmp file is renamed to its final name (directories fsynced);
4. `commit`: `checkpoint-pNN.json` (atomically) takes the new position; the manifest is deleted.

`recover` (at start, and whenever a bridge takes a partition over) rolls a leftover manifest forward (renames
the tmp files it lists that still exist, then commits its checkpoint) and deletes this partition's other tmp
files: a crash before step 2 loses only unpublished work, re-read from the old checkpoint; after it the flush
completes. Final names carry the partition and the first and last position of their rows, so exporting a range
again can only replace a file by the same name, never add a second copy under another.
The `sparkplug` table's files of a flush (the metric rows of its Sparkplug B messages, named like the messages'
files) go through the same four steps in the same manifest: they appear with their messages, exactly once.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tidewire.pipeline.lake.schema import FORMAT_VERSION, MESSAGES, SPARKPLUG, STATE_DIR

log = logging.getLogger(__name__)

VERSION_KEY = b"tidewire.lake.version"
HOUR_MS = 3_600_000
TMP_SUFFIX = ".parquet.tmp"
# Columns worth a dictionary (few distinct values); the rest (payloads, JSON) would only pay for a failed try.
DICTIONARY_COLUMNS = ["topic", "first_level", "client_id", "protocol", "content_type", "response_topic",
                      "event", "node", "reason", "detail",
                      "group_id", "edge_node", "device", "message_type", "metric", "datatype"]


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def hour_dir(hour_bucket: int) -> str:
    """`dt=YYYY-MM-DD/hour=HH` of an hour since the epoch (UTC)."""
    t = time.gmtime(hour_bucket * 3600)
    return f"dt={t.tm_year:04d}-{t.tm_mon:02d}-{t.tm_mday:02d}/hour={t.tm_hour:02d}"


def split_by_hour(table: pa.Table, ts_column: str) -> list[tuple[int, pa.Table]]:
    """(hour since the epoch, rows of that hour) for each hour of `ts_column`, ascending, rows in table order."""
    if table.num_rows == 0:
        return []
    ms = table.column(ts_column).cast(pa.int64())
    buckets = pc.floor(pc.divide(ms.cast(pa.float64()), float(HOUR_MS))).cast(pa.int64())
    lo, hi = pc.min_max(buckets).values()
    if lo.as_py() == hi.as_py():
        return [(lo.as_py(), table)]
    return [(b, table.filter(pc.equal(buckets, b))) for b in sorted(pc.unique(buckets).to_pylist())]


def write_tmp(table: pa.Table, final: Path, compression: str = "zstd") -> Path:
    """Write `table` as the tmp file of `final` (`.<name>.tmp` beside it) and fsync it. Returns the tmp path."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name("." + final.name + ".tmp")
    meta = dict(table.schema.metadata or {})
    meta[VERSION_KEY] = str(FORMAT_VERSION).encode()
    table = table.replace_schema_metadata(meta)
    dictionary = [c for c in DICTIONARY_COLUMNS if c in table.schema.names]
    with open(tmp, "wb") as f:
        pq.write_table(table, f, compression=compression, use_dictionary=dictionary)
        f.flush()
        os.fsync(f.fileno())
    return tmp


def publish_file(tmp: Path, final: Path) -> None:
    """Rename a synced tmp file to its final name and make the rename durable."""
    os.replace(tmp, final)
    fsync_dir(final.parent)


def write_json_atomic(path: Path, obj: dict[str, Any]) -> None:
    tmp = path.with_name("." + path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f, separators=(",", ":"))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def write_split(table: pa.Table, table_dir: Path, ts_column: str, name: Callable[[int, pa.Table], str],
                compression: str = "zstd") -> list[Path]:
    """Write `table` split by hour of `ts_column` as `table_dir/dt=/hour=/<name(hour, rows)>.parquet`, each file
    atomically (no manifest: for data written at most once, the events). Returns the final paths."""
    out = []
    for hour, part in split_by_hour(table, ts_column):
        final = table_dir / hour_dir(hour) / (name(hour, part) + ".parquet")
        publish_file(write_tmp(part, final, compression), final)
        out.append(final)
    return out


def remove_tmp_files(table_dir: Path, name: re.Pattern[str]) -> int:
    """Delete tmp files under `table_dir` whose name (`.<name>.parquet.tmp`) minus the leading dot and the suffix
    fully matches `name` (a crashed writer's leftovers). Returns how many."""
    removed = 0
    if not table_dir.is_dir():
        return 0
    for dt in os.scandir(table_dir):
        if not (dt.is_dir() and dt.name.startswith("dt=")):
            continue
        for hour in os.scandir(dt.path):
            if not (hour.is_dir() and hour.name.startswith("hour=")):
                continue
            for f in os.scandir(hour.path):
                if (f.name.startswith(".") and f.name.endswith(TMP_SUFFIX)
                        and name.fullmatch(f.name[1:-len(TMP_SUFFIX)])):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(f.path)
                        removed += 1
    return removed


@dataclass(slots=True)
class Checkpoint:
    """A partition's committed export: every record with seq <= position is in the lake (or was lost)."""

    position: int = 0
    lost: int = 0  # records retention removed before they were exported (cumulative)
    files: int = 0  # files published (cumulative)
    rows: int = 0  # rows published (cumulative)
    flushes: int = 0
    newest_received_ms: int = 0  # received time of the newest exported record (0: none yet)
    updated_ms: int = 0
    sparkplug_rows: int = 0  # metric rows published to the `sparkplug` table (cumulative)
    sparkplug_malformed: int = 0  # messages on Sparkplug B topics whose payload did not decode (cumulative)
    sparkplug_unresolved: int = 0  # DATA metrics sent by an alias no birth the bridge knew named (cumulative)

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Checkpoint:
        known = set(cls.__dataclass_fields__)
        return cls(**{k: int(v) for k, v in obj.items() if k in known})


@dataclass(slots=True)
class Pending:
    """A staged flush: tmp files to rename (paths relative to the lake) and the checkpoint they lead to."""

    partition: int
    renames: list[tuple[str, str]] = field(default_factory=list)
    checkpoint: Checkpoint = field(default_factory=Checkpoint)


class SparkplugRows(Protocol):
    """What a flush writes to the `sparkplug` table (`pipeline.lake.sparkplug_rows.SparkplugBatch`)."""

    table: pa.Table
    malformed: int
    unresolved: int


def message_file_name(partition: int, first: int, last: int) -> str:
    return f"{partition:02d}-{first:020d}-{last:020d}"


class MessagesWriter:
    """The messages of one log partition: flushes under the manifest protocol (see the module docstring).

    Not thread-safe; one writer per partition at a time (the bridge holds `PartitionLock` while using it)."""

    def __init__(self, lake_dir: str | Path, partition: int, compression: str = "zstd") -> None:
        self.lake = Path(lake_dir)
        self.partition = partition
        self.compression = compression
        self.state_dir = self.lake / STATE_DIR
        self.table_dir = self.lake / MESSAGES
        self.sparkplug_dir = self.lake / SPARKPLUG
        self.checkpoint_path = self.state_dir / f"checkpoint-p{partition:02d}.json"
        self.manifest_path = self.state_dir / f"pending-p{partition:02d}.json"
        self.checkpoint = Checkpoint()

    def _load_checkpoint(self) -> Checkpoint:
        try:
            return Checkpoint.from_json(json.loads(self.checkpoint_path.read_text()))
        except FileNotFoundError:
            return Checkpoint()

    def recover(self) -> Checkpoint:
        """Roll a leftover manifest forward, delete this partition's stray tmp files, load the checkpoint."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.checkpoint = self._load_checkpoint()
        try:
            manifest = json.loads(self.manifest_path.read_text())
        except FileNotFoundError:
            manifest = None
        if manifest is not None:
            pending = Pending(self.partition, [(a, b) for a, b in manifest["renames"]],
                              Checkpoint.from_json(manifest["checkpoint"]))
            missing = [b for a, b in pending.renames
                       if not (self.lake / a).exists() and not (self.lake / b).exists()]
            if missing:
                log.error("lake: p%d manifest lists files that are gone: %s", self.partition, missing[:5])
            log.info("lake: p%d rolling forward a flush of %d files to position %d", self.partition,
                     len(pending.renames), pending.checkpoint.position)
            self.publish(pending)
            if pending.checkpoint.position >= self.checkpoint.position:
                self.commit(pending)
            else:
                self.manifest_path.unlink()
        stray = sum(remove_tmp_files(d, re.compile(f"{self.partition:02d}-[0-9]+-[0-9]+"))
                    for d in (self.table_dir, self.sparkplug_dir))
        if stray:
            log.info("lake: p%d deleted %d unpublished tmp files", self.partition, stray)
        for p in self.state_dir.glob(f".*-p{self.partition:02d}.json.tmp"):
            p.unlink(missing_ok=True)
        return self.checkpoint

    def stage(self, table: pa.Table, position: int, lost: int = 0, sparkplug: SparkplugRows | None = None) -> Pending:
        """Step 1: write `table` (MESSAGES_SCHEMA rows of this partition) as synced tmp files; the flush moves the
        checkpoint to `position` (>= the table's last position) with `lost` more records lost to retention.
        `sparkplug`: the metric rows of these messages (SPARKPLUG_SCHEMA) and their counts, published with them."""
        cp = self.checkpoint
        new = Checkpoint(position=max(position, cp.position), lost=cp.lost + lost, files=cp.files,
                         rows=cp.rows + table.num_rows, flushes=cp.flushes + 1,
                         newest_received_ms=cp.newest_received_ms, updated_ms=int(time.time() * 1000),
                         sparkplug_rows=cp.sparkplug_rows, sparkplug_malformed=cp.sparkplug_malformed,
                         sparkplug_unresolved=cp.sparkplug_unresolved)
        pending = Pending(self.partition, [], new)
        self._stage_table(table, self.table_dir, pending)
        if sparkplug is not None:
            self._stage_table(sparkplug.table, self.sparkplug_dir, pending)
            new.sparkplug_rows += sparkplug.table.num_rows
            new.sparkplug_malformed += sparkplug.malformed
            new.sparkplug_unresolved += sparkplug.unresolved
        if table.num_rows:
            newest = pc.max(table.column("received_at").cast(pa.int64())).as_py()
            new.newest_received_ms = max(cp.newest_received_ms, newest)
        new.files += len(pending.renames)
        return pending

    def _stage_table(self, table: pa.Table, table_dir: Path, pending: Pending) -> None:
        for hour, part in split_by_hour(table, "received_at"):
            lo, hi = pc.min_max(part.column("position")).values()
            final = table_dir / hour_dir(hour) / (
                message_file_name(self.partition, lo.as_py(), hi.as_py()) + ".parquet")
            tmp = write_tmp(part, final, self.compression)
            pending.renames.append((str(tmp.relative_to(self.lake)), str(final.relative_to(self.lake))))

    def write_manifest(self, pending: Pending) -> None:
        """Step 2: from here on the flush completes, even across a crash."""
        write_json_atomic(self.manifest_path, {"renames": pending.renames, "checkpoint": asdict(pending.checkpoint)})

    def publish(self, pending: Pending) -> None:
        """Step 3: rename every tmp file that is still there (idempotent)."""
        dirs = set()
        for tmp, final in pending.renames:
            try:
                os.replace(self.lake / tmp, self.lake / final)
            except FileNotFoundError:
                continue  # renamed before a crash
            dirs.add((self.lake / final).parent)
        for d in dirs:
            fsync_dir(d)

    def commit(self, pending: Pending) -> Checkpoint:
        """Step 4: the checkpoint takes the new position; the manifest goes."""
        write_json_atomic(self.checkpoint_path, asdict(pending.checkpoint))
        self.manifest_path.unlink(missing_ok=True)
        self.checkpoint = pending.checkpoint
        return pending.checkpoint

    def flush(self, table: pa.Table, position: int, lost: int = 0,
              sparkplug: SparkplugRows | None = None) -> Checkpoint:
        """The four steps; a flush that writes no file (nothing buffered, only a moved position) skips the
        manifest."""
        pending = self.stage(table, position, lost, sparkplug)
        if pending.renames:
            self.write_manifest(pending)
            self.publish(pending)
        return self.commit(pending)


SPARKPLUG_COUNTERS = ("sparkplug_rows", "sparkplug_malformed", "sparkplug_unresolved")


def sparkplug_counts(lake: Path) -> dict[str, int]:
    """The lake's Sparkplug counters as its partitions' checkpoints committed them (every bridge's, cumulative):
    `sparkplug_rows`, `sparkplug_malformed`, `sparkplug_unresolved`. Reads a small file per log partition."""
    totals = dict.fromkeys(SPARKPLUG_COUNTERS, 0)
    for path in (lake / STATE_DIR).glob("checkpoint-p*.json"):
        try:
            checkpoint = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # replaced while read: the next scrape reads it
        for name in SPARKPLUG_COUNTERS:
            value = checkpoint.get(name, 0)
            totals[name] += value if isinstance(value, int) else 0
    return totals


class PartitionLock:
    """A non-blocking `flock` on `<lake>/_tidewire/pNN.lock`: two bridges on one lake never write one partition
    at once, whatever their leases say (the kernel drops it when the holder dies, even by kill -9)."""

    def __init__(self, lake_dir: str | Path, partition: int) -> None:
        self.path = Path(lake_dir) / STATE_DIR / f"p{partition:02d}.lock"
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> bool:
        if self._fd is not None:
            return True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # closing the only descriptor drops the lock
