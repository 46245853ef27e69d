"""Compaction: the many small files of a closed hour rewritten into few files of a target size, exactly once.

The bridge writes a file per partition per flush (about 720 an hour each at the default 5 s); readers slow down
with the number of files. A closed hour (its end at least `older_than` ago) is compacted per group: per log
partition for messages (`c-PP-first-last.parquet`, rows in position order), the whole hour for events
(`compacted-<ms>-<k>.parquet`). Committed files smaller than the target are packed in order into groups of at
most `target_bytes` (input bytes); each group of two or more files, one at least from the bridge, becomes one
output (outputs alone are left: they come out smaller than their inputs, and would be rewritten every pass).

The protocol, per hour directory, with `_compaction` (`pipeline.lake.reading`) as the hour's manifest:

1. each output is written as `.<name>.parquet.tmp` and fsynced;
2. the manifest gets an entry per output (output, inputs, commit time), written atomically: from here on the
   compaction completes, even across a crash;
3. each tmp file is renamed to its name (directory fsynced): readers that list now read the outputs, not the
   inputs (`reading.committed_in_hour`);
4. a grace period later (`grace_ms`) the inputs are deleted and the entry marked so; another grace period after
   that the entry goes. Readers that listed before step 3 read the inputs, which are still there.

`recover_hour` (at every pass, under the lake's compaction lock) rolls a step 2 forward (renames the tmp files of
entries whose output is missing) and deletes tmp files no entry names (a crash before step 2). The bridge's
writer only adds new files (never one a manifest names), so it runs alongside without a lock. One compactor at a
time per lake: a non-blocking `flock` on `<lake>/_tidewire/compact.lock` (the bridge's background pass, `tidewire
lake compact` and the Spark job's driver all take it).
"""

from __future__ import annotations

import calendar
import contextlib
import fcntl
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tidewire.pipeline.lake.reading import MANIFEST, PARQUET, Entry, committed_in_hour, hour_dirs, read_manifest
from tidewire.pipeline.lake.schema import EVENTS, MESSAGES, SPARKPLUG, STATE_DIR
from tidewire.pipeline.lake.writer import (
    DICTIONARY_COLUMNS,
    HOUR_MS,
    TMP_SUFFIX,
    VERSION_KEY,
    fsync_dir,
    write_json_atomic,
)

log = logging.getLogger(__name__)

LOCK_NAME = "compact.lock"
ROW_GROUP_BYTES = 64 << 20  # in-memory Arrow bytes gathered into one row group of an output
MESSAGES_OUTPUT = re.compile(r"c-[0-9]{2}-[0-9]+-[0-9]+")
EVENTS_OUTPUT = re.compile(r"compacted-[0-9]+-[0-9]+")
_HOUR = re.compile(r"dt=([0-9]{4})-([0-9]{2})-([0-9]{2})/hour=([0-9]{2})$")


@dataclass(slots=True)
class CompactStats:
    hours: int = 0  # closed hours looked at
    outputs: int = 0  # files written
    inputs: int = 0  # files they replace
    rows: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    deleted: int = 0  # replaced files deleted after the grace period
    rolled_forward: int = 0  # outputs of a crashed compaction put in place
    skipped: bool = False  # another compactor held the lake's lock

    def add(self, other: CompactStats) -> None:
        for f in fields(self):
            if f.name != "skipped":
                setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


def hour_start_ms(hour: Path) -> int | None:
    """The start of a `.../dt=YYYY-MM-DD/hour=HH` directory's hour (ms since the epoch, UTC); None: not one."""
    m = _HOUR.search(f"{hour.parent.name}/{hour.name}")
    if m is None:
        return None
    y, mo, d, h = (int(g) for g in m.groups())
    return calendar.timegm((y, mo, d, h, 0, 0, 0, 0, 0)) * 1000


def closed_hours(table_dir: Path, now_ms: int, older_than_ms: int) -> list[Path]:
    """The hour directories of a table whose hour ended at least `older_than_ms` before `now_ms`."""
    out = []
    for hour in hour_dirs(table_dir):
        start = hour_start_ms(hour)
        if start is not None and start + HOUR_MS + older_than_ms <= now_ms:
            out.append(hour)
    return out


def _per_partition(table: str) -> bool:
    """Files named by log partition and positions (messages, and the sparkplug rows written with them)."""
    return table in (MESSAGES, SPARKPLUG)


def _output_pattern(table: str) -> re.Pattern[str]:
    return MESSAGES_OUTPUT if _per_partition(table) else EVENTS_OUTPUT


def _tmp(hour: Path, name: str) -> Path:
    return hour / ("." + name + TMP_SUFFIX)


def _write_manifest(hour: Path, entries: list[Entry]) -> None:
    if entries:
        write_json_atomic(hour / MANIFEST, {"entries": [e.to_json() for e in entries]})
    else:
        with contextlib.suppress(FileNotFoundError):
            (hour / MANIFEST).unlink()
            fsync_dir(hour)


def recover_hour(hour: Path, table: str, now_ms: int, grace_ms: int) -> CompactStats:
    """Roll forward entries whose output is still a tmp file, delete tmp files of no entry, delete the inputs of
    entries older than the grace period and forget entries a grace period after that."""
    stats = CompactStats()
    entries = read_manifest(hour)
    outputs = {e.output for e in entries}
    pattern = _output_pattern(table)
    for e in entries:
        final = hour / e.output
        if not final.exists():
            try:
                os.replace(_tmp(hour, e.output.removesuffix(PARQUET)), final)
                fsync_dir(hour)
                stats.rolled_forward += 1
            except FileNotFoundError:
                if not e.deleted_ms:
                    log.error("lake compaction: %s: the output %s and its tmp file are gone", hour, e.output)
    for name in os.listdir(hour):
        stem = name[1:-len(TMP_SUFFIX)] if name.startswith(".") and name.endswith(TMP_SUFFIX) else ""
        if (stem and pattern.fullmatch(stem) and stem + PARQUET not in outputs) or name == f".{MANIFEST}.tmp":
            with contextlib.suppress(FileNotFoundError):
                os.unlink(hour / name)
    for e in sorted(entries, key=lambda e: e.committed_ms):  # older first: an output is deleted after its inputs
        if not e.deleted_ms and e.committed_ms + grace_ms <= now_ms and (hour / e.output).exists():
            for name in e.inputs:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(hour / name)
                    stats.deleted += 1
            fsync_dir(hour)
            e.deleted_ms = now_ms
            _write_manifest(hour, entries)  # before a later entry deletes this one's output
    kept = [e for e in entries if not (e.deleted_ms and e.deleted_ms + grace_ms <= now_ms)]
    if len(kept) != len(entries):
        _write_manifest(hour, kept)
    return stats


def _group_key(table: str, name: str) -> str:
    """The log partition of a messages file (`PP-...`, or `c-PP-...` compacted); one group for events."""
    if not _per_partition(table):
        return ""
    return name[2:4] if name.startswith("c-") else name[:2]


def plan_hour(hour: Path, table: str, target_bytes: int) -> list[list[Path]]:
    """Groups of committed files to rewrite: per group key, the files smaller than the target in name order
    (positions for messages), packed greedily up to `target_bytes`; only groups of two or more files."""
    by_key: dict[str, list[tuple[Path, int]]] = {}
    for path in committed_in_hour(hour):
        size = path.stat().st_size
        if size < target_bytes:
            by_key.setdefault(_group_key(table, path.name), []).append((path, size))
    groups: list[list[Path]] = []
    for key in sorted(by_key):
        current: list[Path] = []
        total = 0
        for path, size in by_key[key]:
            if current and total + size > target_bytes:
                groups.append(current)
                current, total = [], 0
            current.append(path)
            total += size
        groups.append(current)
    # A group of outputs only stays as it is: outputs come out smaller than their inputs (a file's overhead and
    # better compression), so packing them again would rewrite the same rows on every pass.
    pattern = _output_pattern(table)
    return [g for g in groups
            if len(g) >= 2 and any(not pattern.fullmatch(p.name.removesuffix(PARQUET)) for p in g)]


def output_name(table: str, group: list[Path], now_ms: int, k: int) -> str:
    if _per_partition(table):
        first = group[0].name.removesuffix(PARQUET).removeprefix("c-").split("-")
        last = group[-1].name.removesuffix(PARQUET).removeprefix("c-").split("-")
        return f"c-{first[0]}-{first[1]}-{last[2]}{PARQUET}"
    return f"compacted-{now_ms}-{k}{PARQUET}"


def rewrite(group: list[Path], tmp: Path, compression: str = "zstd") -> int:
    """Write the rows of `group`, in order, into `tmp` (row groups of about ROW_GROUP_BYTES) and fsync it."""
    # Every file's columns: a lake written across an upgrade that added a column (events' consumer_group) has
    # files with and without it, and the first one's schema would drop it from the others.
    schema = pa.unify_schemas([pq.read_schema(path) for path in group])
    meta = dict(pq.read_schema(group[0]).metadata or {})
    meta.setdefault(VERSION_KEY, b"1")
    schema = schema.with_metadata(meta)
    dictionary = [c for c in DICTIONARY_COLUMNS if c in schema.names]
    rows = 0
    with open(tmp, "wb") as f:
        writer = pq.ParquetWriter(f, schema, compression=compression, use_dictionary=dictionary)
        pending: list[pa.Table] = []
        size = 0
        for path in group:
            table = pq.read_table(path, schema=schema, partitioning=None)
            pending.append(table)
            size += table.nbytes
            rows += table.num_rows
            if size >= ROW_GROUP_BYTES:
                writer.write_table(pa.concat_tables(pending))
                pending, size = [], 0
        if pending:
            writer.write_table(pa.concat_tables(pending))
        writer.close()
        f.flush()
        os.fsync(f.fileno())
    return rows


def compact_hour(hour: Path, table: str, *, target_bytes: int, now_ms: int, grace_ms: int,
                 compression: str = "zstd", stop: threading.Event | None = None) -> CompactStats:
    """Recover, then compact one closed hour directory (the caller holds the lake's compaction lock)."""
    stats = recover_hour(hour, table, now_ms, grace_ms)
    stats.hours = 1
    for k, group in enumerate(plan_hour(hour, table, target_bytes)):
        if stop is not None and stop.is_set():
            break
        name = output_name(table, group, now_ms, k)
        tmp = _tmp(hour, name.removesuffix(PARQUET))
        stats.rows += rewrite(group, tmp, compression)  # step 1
        entries = read_manifest(hour)
        entries.append(Entry(name, [p.name for p in group], now_ms))
        _write_manifest(hour, entries)  # step 2
        os.replace(tmp, hour / name)  # step 3
        fsync_dir(hour)
        stats.outputs += 1
        stats.inputs += len(group)
        stats.bytes_in += sum(p.stat().st_size for p in group)
        stats.bytes_out += (hour / name).stat().st_size
    return stats


@contextlib.contextmanager
def compaction_lock(lake: Path) -> Iterator[bool]:
    """The lake's compaction lock, without waiting: yields False when another compactor holds it."""
    path = lake / STATE_DIR / LOCK_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            yield False
            return
        yield True
    finally:
        os.close(fd)  # drops the lock (the kernel drops it too when the holder dies, even by kill -9)


def compact_lake(lake: str | Path, *, older_than_ms: int, target_bytes: int, grace_ms: int,
                 clock: Callable[[], float] = time.time, compression: str = "zstd",
                 tables: tuple[str, ...] = (MESSAGES, EVENTS, SPARKPLUG),
                 stop: threading.Event | None = None) -> CompactStats:
    """Compact every closed hour of the lake's tables, one hour at a time (see the module docstring)."""
    lake = Path(lake)
    total = CompactStats()
    with compaction_lock(lake) as held:
        if not held:
            total.skipped = True
            return total
        for table in tables:
            for hour in closed_hours(lake / table, int(clock() * 1000), older_than_ms):
                if stop is not None and stop.is_set():
                    return total
                total.add(compact_hour(hour, table, target_bytes=target_bytes, now_ms=int(clock() * 1000),
                                       grace_ms=grace_ms, compression=compression, stop=stop))
    return total
