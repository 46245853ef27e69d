"""The lake at a month's scale (issue 24): file counts, and what the jobs cost on 1 day vs 30 days of history.

`python -m loadtest.lake_scale [--days 30] [--partitions 16] [--files-per-hour 4] [--rows-per-file 10]
[--compact 'tidewire lake compact --lake {lake}']`

The bridge writes one file per log partition per flush: at the default flush (`lake_flush_seconds` 5) that is
720 files per partition per hour, 8.3 million for 30 days of 16 partitions: more than this machine writes and
Spark lists in minutes. So the benchmark keeps the partitions and scales the flush: `--files-per-hour` files per
partition per hour (4: a 15-minute flush), each of `--rows-per-file` rows; what the jobs pay for is the number
of files, and the report prints it. The default (30 x 24 x 16 x 4) is 46,080 message files plus the events.

1. Writes the LAST day of the lake (messages, with a delivered and an acked event per message), and times
   `reports --since 1d` and `alerts --since 1d` (dry run) on it: the window is the lake's last day.
2. Adds the 29 days before it and times the same two runs again: with pruning they read the same partitions,
   so the times should match.
3. `aggregates`: runs the stream over the whole lake (`--batches-per-day` micro-batches, folding off), then
   times reading the final numbers (`minute_aggregates`) for the last day and for the 30 days; folds the closed
   days (`pipeline.fold`) and times both reads again.
4. With `--compact CMD` (`{lake}` is replaced by the lake's path): runs it, prints the file counts after it,
   and times the two `--since 1d` runs again (compaction of closed hours is another module's: this is its hook).

Spark is local (`--master local[2]`). The lake goes to a temp dir (or `--lake`), removed at the end unless
`--keep`.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from loadtest.spark_bench import events_table, messages_table
from loadtest.text_table import render
from tidewire.pipeline.lake.schema import EVENTS, MESSAGES
from tidewire.pipeline.lake.writer import hour_dir, message_file_name

DAY_MS = 86_400_000
HOUR_MS = 3_600_000
END_MS = 1_717_200_000_000 // DAY_MS * DAY_MS  # 2024-06-01T00:00Z: the lake's last day ends here
RULE = "temperature > 44 for 1 minute"
_TS = pa.timestamp("ms", tz="UTC")


@dataclass(frozen=True, slots=True)
class Config:
    days: int = 30
    partitions: int = 16
    files_per_hour: int = 4  # per partition: 720 at the default 5 s flush
    rows_per_file: int = 10
    devices: int = 200
    batches_per_day: int = 8  # the aggregates stream's micro-batches (a 5 s trigger makes 17,280)
    master: str = "local[2]"
    compact: str | None = None


@dataclass(slots=True)
class ScaleResult:
    files: dict[str, int] = field(default_factory=dict)  # "<stage> <table>" -> files
    seconds: dict[str, float] = field(default_factory=dict)  # "<what> @ <history>" -> s
    rows: dict[str, int] = field(default_factory=dict)  # what each timed run saw (the check)


def write_day(lake: Path, day: int, cfg: Config) -> int:
    """Day `day` (0 = the last, 1 = the one before, ...): files_per_hour files per partition per hour, each with
    its rows' delivered and acked events in the events table. Returns the message files written."""
    start = END_MS - (day + 1) * DAY_MS
    per_hour = cfg.partitions * cfg.files_per_hour
    n = cfg.rows_per_file
    gap = HOUR_MS // (per_hour * n)  # rows spread evenly over the hour
    files = 0
    for hour in range(24):
        events = []
        for k in range(per_hour):
            p = k % cfg.partitions
            first = 1 + ((day * 24 + hour) * per_hour + k) * n  # unique positions across the lake
            t0 = start + hour * HOUR_MS + k * n * gap
            received = pa.array([t0 + i * gap for i in range(n)], pa.int64()).cast(_TS)
            table = messages_table(first, n, cfg.devices, 1.0, seed=first)
            table = table.set_column(table.schema.get_field_index("received_at"), "received_at", received)
            table = table.set_column(table.schema.get_field_index("partition"), "partition",
                                     pa.array([p] * n, pa.int32()))
            bucket = (start + hour * HOUR_MS) // HOUR_MS
            final = lake / MESSAGES / hour_dir(bucket) / (message_file_name(p, first, first + n - 1) + ".parquet")
            final.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(table, final)  # no tmp + fsync: a benchmark's lake, written once
            files += 1
            events.append(events_table(table, cfg.devices, 1, 1.0, False, False))
        ev = pa.concat_tables(events)
        bucket = (start + hour * HOUR_MS) // HOUR_MS
        cuts = [f * ev.num_rows // cfg.files_per_hour for f in range(cfg.files_per_hour + 1)]
        for f in range(cfg.files_per_hour):  # one node's exporter: a file per flush
            final = lake / EVENTS / hour_dir(bucket) / f"bench-{bucket}-{f}.parquet"
            final.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(ev.slice(cuts[f], cuts[f + 1] - cuts[f]), final)
    return files


def count_files(root: Path) -> int:
    if not root.exists():
        return 0
    return sum(1 for dirpath, dirnames, names in os.walk(root)
               if not any(part.startswith((".", "_")) for part in Path(dirpath).relative_to(root).parts)
               for name in names if name.endswith(".parquet") and not name.startswith((".", "_")))


def _timed(r: ScaleResult, key: str, fn: Any) -> Any:
    began = time.monotonic()
    out = fn()
    r.seconds[key] = time.monotonic() - began
    return out


def time_since_1d(spark: Any, lake: Path, r: ScaleResult, history: str) -> None:
    from tidewire.pipeline.jobs import alerts, reports
    from tidewire.pipeline.spark import read_messages
    from tidewire.pipeline.window import TimeWindow

    w = TimeWindow(END_MS - DAY_MS, END_MS)
    _timed(r, f"reports --since 1d @ {history}", lambda: reports.run(spark, str(lake), w=w))
    r.rows[f"messages in the window @ {history}"] = read_messages(spark, str(lake), w.since_ms, w.until_ms).count()
    rule = alerts.parse_rule(RULE)
    found = _timed(r, f"alerts --since 1d @ {history}",
                   lambda: alerts.new_alerts(spark, str(lake), rule, [], 1_000_000, w))
    r.rows[f"alerts found @ {history}"] = len(found)


def time_aggregates(spark: Any, lake: Path, r: ScaleResult, cfg: Config) -> None:
    from pyspark.sql import functions as F

    from tidewire.pipeline.jobs import aggregates

    per_batch = max(1, cfg.partitions * cfg.files_per_hour * 24 // cfg.batches_per_day)
    run = _timed(r, f"aggregates stream ({cfg.batches_per_day} batches a day)",
                 lambda: aggregates.run(spark, str(lake), max_files=per_batch, folding=aggregates.Folding(days=0)))
    r.rows["aggregates stream rows"] = run.rows
    table = lake / "aggregates" / "device_minute"

    def read(since: int) -> int:
        row = aggregates.minute_aggregates(spark, str(lake), "device", since, END_MS).agg(
            F.sum("messages").alias("n")).first()
        return int(row["n"] or 0) if row is not None else 0

    for stage in ("unfolded", "folded"):
        if stage == "folded":
            closed = aggregates.Folding(days=cfg.days + 1, wall_ms=lambda: END_MS + 2 * HOUR_MS)
            _timed(r, "aggregates fold (all closed days)",
                   lambda c=closed: aggregates.fold_closed_days(spark, str(lake), 1 << 62, c))
        r.files[f"aggregates {stage}"] = count_files(table)
        r.rows[f"aggregates read 1 day {stage}"] = _timed(
            r, f"aggregates read final numbers, 1 day, {stage}", lambda: read(END_MS - DAY_MS))
        r.rows[f"aggregates read {cfg.days} days {stage}"] = _timed(
            r, f"aggregates read final numbers, {cfg.days} days, {stage}", lambda: read(END_MS - cfg.days * DAY_MS))


def bench(cfg: Config, lake: Path) -> ScaleResult:
    from tidewire.pipeline.spark import spark_session

    r = ScaleResult()
    _timed(r, "write 1 day", lambda: write_day(lake, 0, cfg))
    r.files["1 day messages"] = count_files(lake / MESSAGES)
    r.files["1 day events"] = count_files(lake / EVENTS)
    spark = spark_session(cfg.master, app="tidewire-lake-scale")
    try:
        time_since_1d(spark, lake, ScaleResult(), "warm-up")  # the JVM's first runs: not charged to a timed one
        time_since_1d(spark, lake, r, "1 day")
        _timed(r, f"write {cfg.days - 1} more days", lambda: [write_day(lake, d, cfg) for d in range(1, cfg.days)])
        r.files[f"{cfg.days} days messages"] = count_files(lake / MESSAGES)
        r.files[f"{cfg.days} days events"] = count_files(lake / EVENTS)
        time_since_1d(spark, lake, r, f"{cfg.days} days")
        time_aggregates(spark, lake, r, cfg)
        if cfg.compact:
            cmd = [a.replace("{lake}", str(lake)) for a in shlex.split(cfg.compact)]
            _timed(r, "compaction (--compact)", lambda: subprocess.run(cmd, check=True))
            r.files[f"{cfg.days} days messages compacted"] = count_files(lake / MESSAGES)
            r.files[f"{cfg.days} days events compacted"] = count_files(lake / EVENTS)
            time_since_1d(spark, lake, r, f"{cfg.days} days compacted")
    finally:
        spark.stop()
    return r


def format_result(r: ScaleResult, cfg: Config) -> str:
    head = (f"lake_scale: {cfg.days} days x 24 h x {cfg.partitions} partitions x {cfg.files_per_hour} files/h "
            f"(the default 5 s flush writes 720) x {cfg.rows_per_file} rows, master {cfg.master}")
    files = render([["files", "count"]] + [[k, f"{v:,}"] for k, v in r.files.items()])
    times = render([["run", "seconds"]] + [[k, f"{v:.2f}"] for k, v in r.seconds.items()])
    rows = render([["check", "rows"]] + [[k, f"{v:,}"] for k, v in r.rows.items()])
    return "\n\n".join([head, files, times, rows])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m loadtest.lake_scale", description=__doc__.splitlines()[0])
    ap.add_argument("--days", type=int, default=30)
    ap.add_argument("--partitions", type=int, default=16)
    ap.add_argument("--files-per-hour", type=int, default=4, help="per partition (720 at the default flush)")
    ap.add_argument("--rows-per-file", type=int, default=10)
    ap.add_argument("--devices", type=int, default=200)
    ap.add_argument("--batches-per-day", type=int, default=8, help="the aggregates stream's micro-batches a day")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--compact", default=None, help="a command compacting the lake ({lake}: its path)")
    ap.add_argument("--lake", type=Path, default=None, help="build the lake here (default: a temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the lake")
    a = ap.parse_args(argv)
    if a.days < 2 or min(a.partitions, a.files_per_hour, a.rows_per_file, a.devices, a.batches_per_day) < 1:
        ap.error("--days must be at least 2, the other sizes at least 1")
    cfg = Config(a.days, a.partitions, a.files_per_hour, a.rows_per_file, a.devices, a.batches_per_day, a.master,
                 a.compact)
    lake = a.lake or Path(tempfile.mkdtemp(prefix="tidewire-lake-scale-")) / "lake"
    if lake.exists() and any(lake.iterdir()):
        ap.error(f"{lake} is not empty")
    try:
        r = bench(cfg, lake)
    finally:
        if not a.keep:
            shutil.rmtree(lake if a.lake else lake.parent, ignore_errors=True)
    print(format_result(r, cfg))
    return 0


if __name__ == "__main__":
    sys.exit(main())
