"""Compaction of the lake's closed hours as a Spark job: one task per hour directory, for a lake too big for one
machine.

The same protocol as the bridge and `tidewire lake compact` (`pipeline.lake.compaction`): the driver takes the
lake's compaction lock and lists the closed hours; each executor task recovers and compacts one hour directory
with pyarrow (an hour's manifest is only ever written by the one task that has it). The lake must be a
filesystem every executor mounts (a `flock` the driver holds is the lock); object stores are not compacted.

    tidewire pipeline run compact --lake /shared/lake [--older-than 1h] [--target-bytes N] [--grace 1h]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from tidewire.pipeline.lake.compact_command import CompactOptions
from tidewire.pipeline.lake.compaction import CompactStats, closed_hours, compact_hour, compaction_lock
from tidewire.pipeline.lake.schema import EVENTS, MESSAGES, SPARKPLUG
from tidewire.pipeline.window import seconds


def _compact_unit(unit: tuple[str, str], opts: CompactOptions, now_ms: int) -> dict[str, Any]:
    """One executor task: one hour directory of one table."""
    hour, table = unit
    stats = compact_hour(Path(hour), table, target_bytes=opts.target_bytes, now_ms=now_ms,
                         grace_ms=int(opts.grace_s * 1000), compression=opts.compression)
    return asdict(stats)


def run(spark: SparkSession, lake: str, opts: CompactOptions, clock: Callable[[], float] = time.time) -> CompactStats:
    """Compact every hour closed for `opts.after_s`, an executor task per hour; `skipped` when another compactor
    holds the lake."""
    if "://" in lake:
        raise ValueError(f"compaction needs the lake on a mounted filesystem, not {lake}")
    root = Path(lake)
    total = CompactStats()
    with compaction_lock(root) as held:
        if not held:
            total.skipped = True
            return total
        now_ms = int(clock() * 1000)
        units = [(str(h), table) for table in (MESSAGES, EVENTS, SPARKPLUG)
                 for h in closed_hours(root / table, now_ms, int(opts.after_s * 1000))]
        if not units:
            return total
        results = (spark.sparkContext.parallelize(units, len(units))
                   .map(lambda u: _compact_unit(u, opts, now_ms)).collect())
    for r in results:
        total.add(CompactStats(**r))
    return total


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = CompactOptions()
    parser.add_argument("--older-than", type=seconds, default=d.after_s,
                        help="compact hours that ended at least this long ago (default 1h)")
    parser.add_argument("--target-bytes", type=int, default=d.target_bytes, help="size of the files written")
    parser.add_argument("--grace", type=seconds, default=d.grace_s,
                        help="replaced files stay this long for readers that listed them (default 1h)")


def main_job(spark: SparkSession, lake: str, args: argparse.Namespace) -> int:
    try:
        stats = run(spark, lake, CompactOptions(args.target_bytes, args.older_than, args.grace))
    except ValueError as e:
        print(f"compact: {e}", file=sys.stderr)
        return 2
    print(json.dumps(asdict(stats)))
    return 3 if stats.skipped else 0
