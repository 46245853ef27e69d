"""Folding the aggregates: a closed day's partial files (one set per micro-batch) become one set, exactly.

The `aggregates` stream writes `dt=D/batch=N/` per micro-batch: at a 5 s trigger, 17,280 sets a day, and reading
a month would mean listing and opening half a million files. Partials merge associatively (count and sum add,
min and max take theirs), so the partials of a day merged by (key, minute, field) are again valid partials with
the same final numbers: folding a day replaces its N sets with one, `dt=D/batch=M/` where M is the newest batch
folded (a late batch for that day later gets a higher id, and is folded with it next time).

Which days: a day is folded once it is closed (it ended `after` ago, 1 h by default), when all of its batches are
committed in the stream's checkpoint (a batch Spark may still re-run is never folded: its replay would count
twice), and only within the last `days` days (late data older than that stays unfolded: exact, only more
files), so the cost of a fold pass does not grow with the lake's age.

How it commits: the folded set is written (by Spark) to the hidden `.dt=D.fold/` beside the day, then the two
directories are swapped in one `renameat2(RENAME_EXCHANGE)`: a reader lists either the day's batches or the
folded set, never both, never neither. The old batches, now under the hidden name, are renamed
`.dt=D.old-<ms>` and deleted by a later pass after `KEEP_OLD_S` (a reader that listed them just before the swap
can still open them). Interrupted at any point, the next pass finds one of: `.dt=D.fold` beside `dt=D`
(staging not finished, or swapped but not yet renamed: either way the hidden copy is redundant and deleted), or
only `.dt=D.fold` (the fallback below, between its two renames: rolled forward). Where the filesystem has no
RENAME_EXCHANGE (not Linux, or a filesystem without it) the swap is two renames, `dt=D` away then the fold in:
for that instant a reader finds no day D (never a row twice).

It runs inside the aggregates job (after an `availableNow` run, and between micro-batches of a continuous
one): the only writer of the table, so no lock is needed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import datetime as dt
import errno
import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from tidewire.pipeline.lake.partitions import DAY_MS, day_name

log = logging.getLogger(__name__)

FOLD_SUFFIX = ".fold"
OLD_MARK = ".old-"
KEEP_OLD_S = 3600.0  # folded-away batches stay (hidden) this long for readers that listed them
DEFAULT_FOLD_DAYS = 7  # how many days back a pass looks
DEFAULT_AFTER_MS = 3_600_000  # a day is closed this long after its end
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def _renameat2() -> Any:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.renameat2
    except (OSError, AttributeError):
        return None


_RENAMEAT2 = _renameat2()


def exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically; False where the system cannot (then nothing changed)."""
    if _RENAMEAT2 is None:
        return False
    rc = _RENAMEAT2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(a))


def committed_upto(checkpoint: Path) -> int:
    """The newest batch id the stream committed (-1: none)."""
    try:
        names = os.listdir(checkpoint / "commits")
    except FileNotFoundError:
        return -1
    return max((int(n) for n in names if n.isdigit()), default=-1)


def _batch_ids(day_dir: Path) -> list[int]:
    out = []
    for name in os.listdir(day_dir):
        if name.startswith("batch="):
            try:
                out.append(int(name[6:]))
            except ValueError:
                continue
    return sorted(out)


@dataclass(slots=True)
class FoldRun:
    days: list[str] = field(default_factory=list)  # "<table>/dt=D" folded this pass
    batches: int = 0  # batch sets folded away


def recover(table_dir: Path, now_s: float) -> None:
    """Finish or undo what an interrupted pass left (see the module docstring); delete old sets past their keep."""
    try:
        names = os.listdir(table_dir)
    except FileNotFoundError:
        return
    for name in names:
        path = table_dir / name
        if name.startswith(".dt=") and name.endswith(FOLD_SUFFIX):
            day = name[1:-len(FOLD_SUFFIX)]
            if (table_dir / day).exists():
                shutil.rmtree(path, ignore_errors=True)
            else:  # the two-rename swap was cut between its renames: complete it
                os.rename(path, table_dir / day)
        elif name.startswith(".dt=") and OLD_MARK in name:
            try:
                made_s = int(name.rsplit(OLD_MARK, 1)[1]) / 1000
            except ValueError:
                continue
            if now_s - made_s >= KEEP_OLD_S:
                shutil.rmtree(path, ignore_errors=True)


def stage(spark: SparkSession, table_dir: Path, day: dt.date, batches: list[int], schema: StructType) -> Path:
    """Write the merged partials of `batches` of `day` to `.dt=D.fold/batch=<newest>/`; returns that folder."""
    day_dir = table_dir / day_name(day)
    staging = table_dir / f".{day_name(day)}{FOLD_SUFFIX}"
    shutil.rmtree(staging, ignore_errors=True)
    paths = [str(day_dir / f"batch={b}") for b in batches]
    partials = spark.read.schema(schema).parquet(*paths)
    key = partials.columns[0]
    merged = (partials.groupBy(key, "minute", "field")
              .agg(F.sum("count").alias("count"), F.sum("sum").alias("sum"), F.min("min").alias("min"),
                   F.max("max").alias("max")))
    merged.coalesce(1).write.parquet(str(staging / f"batch={batches[-1]}"))
    return staging


def swap(table_dir: Path, day: dt.date, staging: Path, now_ms: int) -> None:
    """The commit: the folded set takes the day's place; the old batches go to a hidden name."""
    day_dir = table_dir / day_name(day)
    old = table_dir / f".{day_name(day)}{OLD_MARK}{now_ms}"
    while old.exists():  # folded twice within a millisecond (or a clock that stands still)
        now_ms += 1
        old = table_dir / f".{day_name(day)}{OLD_MARK}{now_ms}"
    if exchange(staging, day_dir):
        os.rename(staging, old)  # now the old batches
    else:
        os.rename(day_dir, old)
        os.rename(staging, day_dir)


def fold_table(spark: SparkSession, table_dir: Path, schema: StructType, *, committed: int, now_ms: int,
               days: int = DEFAULT_FOLD_DAYS, after_ms: int = DEFAULT_AFTER_MS) -> FoldRun:
    """Fold every closed day of the last `days` whose batches are all committed (ids <= `committed`) and are
    more than one set."""
    result = FoldRun()
    recover(table_dir, now_ms / 1000)
    newest_closed = dt.datetime.fromtimestamp((now_ms - after_ms - DAY_MS) / 1000, dt.UTC).date()
    for i in range(days):
        day = newest_closed - dt.timedelta(days=i)
        day_dir = table_dir / day_name(day)
        if not day_dir.is_dir():
            continue
        batches = _batch_ids(day_dir)
        if len(batches) < 2 or batches[-1] > committed:
            continue
        staging = stage(spark, table_dir, day, batches, schema)
        swap(table_dir, day, staging, now_ms)
        result.days.append(f"{table_dir.name}/{day_name(day)}")
        result.batches += len(batches)
        log.info("aggregates: folded %d batches of %s/%s", len(batches), table_dir.name, day_name(day))
    return result
