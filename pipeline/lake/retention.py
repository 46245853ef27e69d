"""Lake retention: the day partitions older than a configured age are removed, whole, atomically for readers.

A day `dt=D` of a table goes once all of it is older than the age: when D's end (the next midnight, UTC) is at
least `days` before now. Every table with day partitions goes by the same rule: `messages/`, `events/` and the
aggregates' `aggregates/device_minute/`, `aggregates/topic_minute/`. A day is first renamed to a hidden
`.dt=D.expired` (one atomic rename: a reader lists the whole day or none of it, never a part), then deleted; a
removal cut short by a crash leaves only hidden names, which the next run deletes.

Who runs it: the bridge (`lake_retention_days`, checked every `RETENTION_EVERY_S`) and `tidewire lake retention
--lake DIR --days N`. The bridge also exports no record received before the cutoff (it would recreate a day
retention removed): it counts them as `expired` and its checkpoint, and so its hold on the log, moves past
them, so the store does not keep log records for days the lake no longer has.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tidewire.pipeline.lake.partitions import DAY_MS, day_name, parse_day
from tidewire.pipeline.lake.schema import EVENTS, MESSAGES, SPARKPLUG

log = logging.getLogger(__name__)

TABLES = (MESSAGES, EVENTS, SPARKPLUG, "aggregates/device_minute", "aggregates/topic_minute")
EXPIRED_SUFFIX = ".expired"
RETENTION_EVERY_S = 600.0  # how often a bridge applies retention


def cutoff_ms(days: int, now_ms: int) -> int:
    """Rows received before this are past retention (a whole day is removed once its end is before it)."""
    return now_ms - days * DAY_MS


@dataclass(slots=True)
class RetentionRun:
    removed: list[str] = field(default_factory=list)  # "<table>/dt=D"


def remove_expired(lake: str | Path, days: int, now_ms: int) -> RetentionRun:
    """Remove every day partition past retention (`days` 0: keep forever, nothing is removed)."""
    result = RetentionRun()
    if days <= 0:
        return result
    cutoff = cutoff_ms(days, now_ms)
    for table in TABLES:
        table_dir = Path(lake) / table
        try:
            names = os.listdir(table_dir)
        except FileNotFoundError:
            continue
        for name in sorted(names):
            if name.startswith(".dt=") and name.endswith(EXPIRED_SUFFIX):  # a removal a crash cut short
                shutil.rmtree(table_dir / name, ignore_errors=True)
                continue
            day = parse_day(name)
            if day is None:
                continue
            end_ms = int(dt.datetime(day.year, day.month, day.day, tzinfo=dt.UTC).timestamp() * 1000) + DAY_MS
            if end_ms > cutoff:
                continue
            hidden = table_dir / f".{day_name(day)}{EXPIRED_SUFFIX}"
            try:
                os.rename(table_dir / name, hidden)
            except FileNotFoundError:  # another bridge removed it first
                continue
            shutil.rmtree(hidden, ignore_errors=True)
            result.removed.append(f"{table}/{name}")
    if result.removed:
        log.info("lake retention (%d days): removed %s", days, ", ".join(result.removed))
    return result


def main(argv: list[str] | None = None) -> int:
    """`tidewire lake retention --lake DIR --days N`: remove the lake's days older than N days, print them."""
    p = argparse.ArgumentParser(prog="tidewire lake retention",
                                description="Remove the lake's day partitions older than an age.")
    p.add_argument("--lake", type=Path, required=True, help="the lake directory")
    p.add_argument("--days", type=int, required=True, help="keep this many days (whole days older are removed)")
    args = p.parse_args(argv)
    if args.days < 1:
        p.error("--days must be at least 1 (0 would mean: keep forever, nothing to do)")
    if not args.lake.is_dir():
        print(f"tidewire lake retention: no lake at {args.lake}", file=sys.stderr)
        return 1
    res = remove_expired(args.lake, args.days, int(time.time() * 1000))
    print(json.dumps({"removed": res.removed}))
    return 0
