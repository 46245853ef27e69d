"""Per-device and per-topic per-minute aggregates of the lake's messages (Structured Streaming, exact).

Design: a watermark + append file sink never emits the newest minute in an `availableNow` run (that minute
waits for a later event to pass the watermark), and late rows after it are lost; an update-mode sink cannot
upsert Parquet. So the stream is stateless: each micro-batch (a set of new lake files, fixed in the checkpoint's
offset log) is reduced to PARTIAL aggregates per (key, minute, field) — count, sum, min, max — written with
dynamic partition overwrite to `dt=<day>/batch=<batch id>/`. A batch Spark re-runs after a crash has the same
id and the same files, so it replaces its own output instead of adding to it: exactly once. count, sum, min and
max merge associatively, so `minute_aggregates` (the reader) folds any number of partials into the exact final
numbers: counts, bytes, min and max exact, avg = sum/count (floating-point sum). No state store, no watermark:
late data for an old minute is simply one more partial.

Layout under the lake:

    aggregates/device_minute/dt=YYYY-MM-DD/batch=N/*.parquet   partial rows keyed by client_id
    aggregates/topic_minute/dt=YYYY-MM-DD/batch=N/*.parquet    partial rows keyed by topic
    _spark/checkpoints/aggregates/                             the stream's checkpoint (or --checkpoint)

A partial row: (client_id | topic, minute, field, count, sum, min, max, dt, batch); `field` null is the message
row (count = messages, sum/min/max of payload_size), else a numeric JSON field (dotted path) and its values.
Any SQL engine gets the final numbers with `GROUP BY key, minute, field` and sum(count), sum(sum), min(min),
max(max). Every micro-batch adds files, so the partials of a closed day are folded into one set per day
(`pipeline.fold`, inside this job: between micro-batches and at the end of a run; `--fold-days 0` turns
it off): reading a month costs about what reading a day did. A day still being written (the current day, and
late data for an old day until it is folded again) has one set per batch.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pyspark.errors import AnalysisException
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from tidewire.pipeline import fold
from tidewire.pipeline.lake.partitions import day_paths
from tidewire.pipeline.lake.reading import BRIDGE_FILES_GLOB
from tidewire.pipeline.lake.schema import MESSAGES
from tidewire.pipeline.spark import MESSAGES_SPARK_SCHEMA, table_path
from tidewire.pipeline.window import parse_duration, positive_int

AGGREGATES = "aggregates"
KEYS = {"device": "client_id", "topic": "topic"}
TABLES = {"device": "device_minute", "topic": "topic_minute"}
DEFAULT_MAX_FILES = 1000  # lake files per micro-batch
DEFAULT_CHECKPOINT = "_spark/checkpoints/aggregates"
POLL_SECONDS = 1  # how often a processing-time run checks for a stop request

By = Literal["device", "topic"]


def partial_schema(by: By) -> T.StructType:
    return T.StructType([
        T.StructField(KEYS[by], T.StringType()),
        T.StructField("minute", T.TimestampType()),
        T.StructField("field", T.StringType()),
        T.StructField("count", T.LongType()),
        T.StructField("sum", T.DoubleType()),
        T.StructField("min", T.DoubleType()),
        T.StructField("max", T.DoubleType()),
        T.StructField("dt", T.DateType()),
        T.StructField("batch", T.LongType()),
    ])


def output_path(lake: str, by: By) -> str:
    return table_path(lake, f"{AGGREGATES}/{TABLES[by]}")


def partials(messages: DataFrame, by: By) -> DataFrame:
    """The partial aggregates of a set of messages (no `batch` column): one scan, one shuffle."""
    key = KEYS[by]
    minute = F.date_trunc("minute", F.col("received_at")).alias("minute")
    # One pass: the message row (field null, value payload_size) followed by the numeric fields' rows.
    whole = F.array(F.struct(F.lit(None).cast("string").alias("field"),
                             F.col("payload_size").cast("double").alias("value")))
    fields = F.transform(F.map_entries(F.col("json_numbers")),
                         lambda e: F.struct(e["key"].alias("field"), e["value"].alias("value")))
    entries = F.when(F.col("json_numbers").isNull(), whole).otherwise(F.concat(whole, fields))
    rows = messages.select(F.col(key), minute, F.inline(entries))
    value = F.col("value")
    return (rows.groupBy(key, "minute", "field")
            .agg(F.count(value).alias("count"), F.sum(value).alias("sum"), F.min(value).alias("min"),
                 F.max(value).alias("max"))
            .withColumn("dt", F.to_date(F.col("minute"))))


def write_partials(batch: DataFrame, batch_id: int, lake: str) -> int:
    """foreachBatch: both tables' partials of one micro-batch, replacing any earlier run of the same batch id.
    Returns the batch's row count. The batch's files are scanned three times (count, two tables): re-reading a
    few Parquet columns measured as fast as caching the batch, without the memory."""
    rows = batch.count()
    if rows == 0:
        return 0
    by: By
    for by in ("device", "topic"):
        (partials(batch, by).withColumn("batch", F.lit(batch_id).cast("long"))
         .repartition("dt")  # one file per day per batch
         .write.mode("overwrite").option("partitionOverwriteMode", "dynamic")
         .partitionBy("dt", "batch").parquet(output_path(lake, by)))
    return rows


@dataclass(slots=True)
class AggregatesRun:
    batches: int = 0
    rows: int = 0
    seconds: float = 0.0  # wall time of the run
    busy: float = 0.0  # time spent in micro-batches (a processing-time run idles between them)
    batch_ids: list[int] = field(default_factory=list)
    folded: list[str] = field(default_factory=list)  # days whose partials were folded into one set

    @property
    def rows_per_second(self) -> float:
        """Throughput while working: rows / time in micro-batches."""
        return self.rows / self.busy if self.busy > 0 else 0.0


@dataclass(frozen=True, slots=True)
class Folding:
    """Folding closed days (`pipeline.fold`): on unless `days` is 0."""

    days: int = fold.DEFAULT_FOLD_DAYS
    after_ms: int = fold.DEFAULT_AFTER_MS
    wall_ms: Callable[[], int] = lambda: int(time.time() * 1000)


def fold_closed_days(spark: SparkSession, lake: str, committed: int, folding: Folding) -> list[str]:
    """One fold pass over both tables: the closed days whose batches are all <= `committed`."""
    if folding.days <= 0 or "://" in lake:
        return []
    out: list[str] = []
    by: By
    for by in ("device", "topic"):
        out += fold.fold_table(spark, Path(output_path(lake, by)), partial_schema(by), committed=committed,
                               now_ms=folding.wall_ms(), days=folding.days, after_ms=folding.after_ms).days
    return out


def run(spark: SparkSession, lake: str, *, checkpoint: str | None = None, every: float | None = None,
        max_files: int = DEFAULT_MAX_FILES, duration: float | None = None,
        stop: threading.Event | None = None, folding: Folding | None = None) -> AggregatesRun:
    """Run the stream: `every` None is `availableNow` (all files present at the start, then stop); else a
    processing-time trigger every `every` seconds until `duration` (None: until `stop` is set or interrupted).
    Setting `stop` (e.g. on SIGTERM) ends the run between polls: the query stops, committed batches stay.
    Closed days are folded between micro-batches and at the end (`folding`; None: the defaults)."""
    source = table_path(lake, MESSAGES)
    if "://" not in source:
        os.makedirs(source, exist_ok=True)  # a lake the bridge has not written to yet is an empty stream
    result = AggregatesRun()
    folding = folding or Folding()
    checkpoint_dir = checkpoint or table_path(lake, DEFAULT_CHECKPOINT)

    def on_batch(batch: DataFrame, batch_id: int) -> None:
        began = time.monotonic()
        # Batch `batch_id - 1` is committed before this one starts; this one is not yet (Spark may re-run it).
        result.folded += fold_closed_days(spark, lake, batch_id - 1, folding)
        result.rows += write_partials(batch, batch_id, lake)
        result.busy += time.monotonic() - began
        result.batches += 1
        result.batch_ids.append(batch_id)

    # The bridge's own files only: a compacted output holds rows of files the stream has read already.
    stream = (spark.readStream.schema(MESSAGES_SPARK_SCHEMA).option("maxFilesPerTrigger", max_files)
              .option("pathGlobFilter", BRIDGE_FILES_GLOB).parquet(source))
    writer = (stream.writeStream.queryName("tidewire_aggregates").foreachBatch(on_batch)
              .option("checkpointLocation", checkpoint_dir))
    writer = writer.trigger(availableNow=True) if every is None else writer.trigger(processingTime=f"{every} seconds")
    started = time.monotonic()
    query = writer.start()
    deadline = None if every is None or duration is None else started + duration
    try:
        while query.isActive and (deadline is None or time.monotonic() < deadline):
            if stop is not None and stop.is_set():
                break
            query.awaitTermination(POLL_SECONDS)
    finally:
        if query.isActive:
            query.stop()
    result.seconds = time.monotonic() - started
    exc = query.exception()
    if exc is not None:
        raise exc
    if "://" not in checkpoint_dir:
        result.folded += fold_closed_days(spark, lake, fold.committed_upto(Path(checkpoint_dir)), folding)
    return result


# -- the reader: partials -> final numbers -------------------------------------------------------------------

def read_partials(spark: SparkSession, lake: str, by: By, since_ms: int | None = None,
                  until_ms: int | None = None) -> DataFrame:
    """The partial rows; with bounds, only the `dt=` days overlapping [since_ms, until_ms) are listed."""
    path = output_path(lake, by)
    try:
        reader = spark.read.schema(partial_schema(by)).option("basePath", path)
        if (since_ms is None and until_ms is None) or "://" in lake:
            return reader.parquet(path)
        days = day_paths(lake, f"{AGGREGATES}/{TABLES[by]}", since_ms, until_ms)
        if not days:
            return spark.createDataFrame([], partial_schema(by))
        return reader.parquet(*(str(d) for d in days))
    except AnalysisException as e:
        if e.getCondition() != "PATH_NOT_FOUND":
            raise
        return spark.createDataFrame([], partial_schema(by))


def minute_aggregates(spark: SparkSession, lake: str, by: By = "device", since_ms: int | None = None,
                      until_ms: int | None = None) -> DataFrame:
    """The exact per-minute aggregates: (client_id | topic, minute, dt, messages, bytes, fields) where `fields`
    maps each numeric JSON field (dotted path) to (count, min, max, avg) over that minute. With bounds: the days
    overlapping [since_ms, until_ms) (whole days)."""
    key = KEYS[by]
    merged = (read_partials(spark, lake, by, since_ms, until_ms).groupBy(key, "minute", "field")
              .agg(F.sum("count").alias("count"), F.sum("sum").alias("sum"), F.min("min").alias("min"),
                   F.max("max").alias("max")))
    is_message_row = F.col("field").isNull()
    stats: Column = F.struct(F.col("count"), F.col("min"), F.col("max"),
                             (F.col("sum") / F.col("count")).alias("avg"))
    entry = F.when(~is_message_row & (F.col("count") > 0), F.struct(F.col("field").alias("key"), stats.alias("value")))
    return (merged.groupBy(key, "minute")
            .agg(F.max(F.when(is_message_row, F.col("count"))).alias("messages"),
                 F.max(F.when(is_message_row, F.col("sum"))).cast("long").alias("bytes"),
                 F.map_from_entries(F.collect_list(entry)).alias("fields"))
            .withColumn("dt", F.to_date(F.col("minute")))
            .select(key, "minute", "dt", "messages", "bytes", "fields"))


# -- command line --------------------------------------------------------------------------------------------

def parse_every(text: str) -> float:
    """`10s`, `2m`, `500ms` -> seconds > 0 (an argparse type)."""
    try:
        seconds = parse_duration(text).total_seconds()
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"must be longer than 0: {text!r}")
    return seconds


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", help=f"the stream's checkpoint (default <lake>/{DEFAULT_CHECKPOINT})")
    parser.add_argument("--every", type=parse_every, default=None,
                        help="a processing-time trigger (e.g. 10s) instead of availableNow")
    parser.add_argument("--duration", type=parse_every, default=None,
                        help="with --every: stop after this long (default: until interrupted)")
    parser.add_argument("--max-files", type=positive_int, default=DEFAULT_MAX_FILES, help="lake files per micro-batch")
    parser.add_argument("--fold-days", type=int, default=fold.DEFAULT_FOLD_DAYS,
                        help="fold the partials of closed days this many days back into one set per day (0: off)")
    parser.add_argument("--fold-after", type=parse_every, default=fold.DEFAULT_AFTER_MS / 1000,
                        help="a day is closed (and folded) this long after its end (default 1h)")


def main_job(spark: SparkSession, lake: str, args: argparse.Namespace) -> int:
    folding = Folding(days=args.fold_days, after_ms=round(args.fold_after * 1000))
    res = run(spark, lake, checkpoint=args.checkpoint, every=args.every, max_files=args.max_files,
              duration=args.duration, stop=getattr(args, "stop", None), folding=folding)
    print(f"aggregates: {res.rows} rows in {res.batches} batches ({res.busy:.1f} s of {res.seconds:.1f} s), "
          f"{res.rows_per_second:,.0f} rows/s -> {output_path(lake, 'device')}, {output_path(lake, 'topic')}; "
          f"{len(res.folded)} days folded")
    return 0
