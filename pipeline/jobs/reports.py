"""Batch reports over the lake: delivery latency per topic, devices online per minute, top talkers, drop and
retry rates; each written as Parquet under `<lake>/reports/<name>/` (replaced on every run).

Incremental: a run covers a time window (`pipeline.window`: `--since/--until`, by default from where the
last run stopped to now) and reads only that window's `dt=/hour=` partitions (`pipeline.lake.partitions`), so
its cost follows the window, not the lake's age. Latency also reads the messages received up to `--lookback`
(1h) before the window: a delivery in the window may be of a message received before it.

Definitions:
- latency: per topic, over the FIRST `delivered` (and first `acked`) event per (client, position), joined to
  the message on position: event time - message received_at, in ms. p50/p99 are `percentile_approx` with
  accuracy 10000: the smallest observed value v with at least p of the values <= v (nearest rank), within a
  rank error of n/10000 — exact for fewer than 10000 values per topic.
- online: a client is online from each `connected` until its next connected/disconnected event (a disconnect
  for a session taken over does not end it: the new connection continues it); still connected at the end:
  until the last event in the lake; a disconnect with no earlier event: from the first event in the lake. A
  minute counts every client online at any instant of it (closed intervals); minutes with nobody online are 0.
- top_talkers: client_id by messages and by bytes (payload), the top N of either (ties by client_id).
- rates: per topic and for all topics (topic `#`): drop_rate = dropped / (first-time deliveries + dropped),
  retry_rate = resends (`dup`) / all deliveries; null when the denominator is 0.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from tidewire.pipeline import window as windows
from tidewire.pipeline.lake.event_names import ACKED, CONNECTED, DELIVERED, DISCONNECTED, DROPPED
from tidewire.pipeline.spark import read_events, read_messages, table_path
from tidewire.pipeline.window import RuleError, TimeWindow, parse_duration, positive_int

REPORTS = "reports"
ACCURACY = 10_000
DEFAULT_TOP = 10
ALL_TOPICS = "#"  # never a topic name, so it cannot collide with a real topic's row
TAKEOVER_REASONS = ("session taken over", "takeover")  # a disconnect that the next connection continues
DEFAULT_LOOKBACK = "1h"  # latency: how long before a delivery its message may have been received


def _range(w: TimeWindow | None) -> tuple[int | None, int | None]:
    return (None, None) if w is None else (w.since_ms, w.until_ms)


def _ms(col: str) -> Column:
    return F.unix_millis(F.col(col))


def latency(spark: SparkSession, lake: str, w: TimeWindow | None = None, lookback_ms: int = 3_600_000) -> DataFrame:
    """(topic, delivered, delivery_p50_ms, delivery_p99_ms, delivery_max_ms, acked, ack_p50_ms, ack_p99_ms,
    ack_max_ms) of the deliveries in the window, whose messages were received up to `lookback_ms` before it."""
    first = (read_events(spark, lake, *_range(w))
             .where(F.col("event").isin(DELIVERED, ACKED) & F.col("position").isNotNull())
             .groupBy("event", "client_id", "position").agg(F.min("time").alias("time")))
    earlier = None if w is None else w.widened(lookback_ms)
    messages = read_messages(spark, lake, *_range(earlier)).select("position", "topic", "received_at")
    timed = (first.join(messages, "position")
             .withColumn("ms", _ms("time") - _ms("received_at")))
    cols: list[Column] = []
    for event, prefix in ((DELIVERED, "delivery"), (ACKED, "ack")):
        ms = F.when(F.col("event") == event, F.col("ms"))
        pct = F.percentile_approx(ms, [0.5, 0.99], ACCURACY)
        cols += [F.count(ms).alias(event), pct[0].alias(f"{prefix}_p50_ms"),
                 pct[1].alias(f"{prefix}_p99_ms"), F.max(ms).alias(f"{prefix}_max_ms")]
    return timed.groupBy("topic").agg(*cols).orderBy("topic")


def _bounds(spark: SparkSession, lake: str, w: TimeWindow | None) -> tuple[int, int] | None:
    row = read_events(spark, lake, *_range(w)).agg(F.min(_ms("time")).alias("a"), F.max(_ms("time")).alias("b")).first()
    if row is None or row["a"] is None:
        return None
    return int(row["a"]), int(row["b"])


def online(spark: SparkSession, lake: str, w: TimeWindow | None = None) -> DataFrame:
    """(minute, online): distinct clients online during each minute from the first to the last event (of the
    window: a session begun before it counts from the window's first event)."""
    bounds = _bounds(spark, lake, w)
    if bounds is None:
        return spark.createDataFrame([], "minute timestamp, online long")
    first = F.timestamp_millis(F.lit(bounds[0]))
    last = F.timestamp_millis(F.lit(bounds[1]))
    sessions = read_events(spark, lake, *_range(w)).where(
        (F.col("event") == CONNECTED)
        | ((F.col("event") == DISCONNECTED) & ~F.coalesce(F.col("reason").isin(*TAKEOVER_REASONS), F.lit(False))))
    # connected before disconnected at the same instant: a session shorter than a millisecond stays closed
    order = Window.partitionBy("client_id").orderBy("time", F.when(F.col("event") == CONNECTED, 0).otherwise(1))
    marked = (sessions.withColumn("next_time", F.lead("time").over(order))
              .withColumn("prev_event", F.lag("event").over(order)))
    intervals = marked.select(
        "client_id",
        F.when(F.col("event") == CONNECTED, F.col("time")).otherwise(first).alias("start"),
        F.when(F.col("event") == CONNECTED, F.coalesce(F.col("next_time"), last))
         .otherwise(F.col("time")).alias("end"),
        ((F.col("event") == CONNECTED) | F.col("prev_event").isNull()).alias("keep"),
    ).where("keep")
    minute = F.explode(F.sequence(F.date_trunc("minute", F.col("start")), F.date_trunc("minute", F.col("end")),
                                  F.expr("INTERVAL 1 MINUTE"))).alias("minute")
    counts = (intervals.select("client_id", minute).distinct()
              .groupBy("minute").agg(F.count("*").alias("online")))
    every = spark.range(1).select(F.explode(F.sequence(F.date_trunc("minute", first), F.date_trunc("minute", last),
                                                       F.expr("INTERVAL 1 MINUTE"))).alias("minute"))
    return (every.join(counts, "minute", "left")
            .select("minute", F.coalesce(F.col("online"), F.lit(0)).cast("long").alias("online"))
            .orderBy("minute"))


def top_talkers(spark: SparkSession, lake: str, n: int = DEFAULT_TOP, w: TimeWindow | None = None) -> DataFrame:
    """(client_id, messages, bytes, messages_rank, bytes_rank) for the top `n` by messages or by bytes."""
    per_client = (read_messages(spark, lake, *_range(w)).groupBy("client_id")
                  .agg(F.count("*").alias("messages"), F.sum("payload_size").cast("long").alias("bytes")))
    # One row per client after the groupBy: a global window over them is small.
    by_messages = Window.orderBy(F.desc("messages"), "client_id")
    by_bytes = Window.orderBy(F.desc("bytes"), "client_id")
    return (per_client.withColumn("messages_rank", F.row_number().over(by_messages))
            .withColumn("bytes_rank", F.row_number().over(by_bytes))
            .where((F.col("messages_rank") <= n) | (F.col("bytes_rank") <= n))
            .orderBy("messages_rank"))


def rates(spark: SparkSession, lake: str, w: TimeWindow | None = None) -> DataFrame:
    """(topic, delivered, first_deliveries, retries, dropped, drop_rate, retry_rate); topic `#` is all topics."""
    events = read_events(spark, lake, *_range(w)).where(F.col("event").isin(DELIVERED, DROPPED))
    delivered = F.col("event") == DELIVERED
    dup = F.coalesce(F.col("dup"), F.lit(False))
    counts = (events.rollup("topic")
              .agg(F.count(F.when(delivered, 1)).alias("delivered"),
                   F.count(F.when(delivered & ~dup, 1)).alias("first_deliveries"),
                   F.count(F.when(delivered & dup, 1)).alias("retries"),
                   F.count(F.when(F.col("event") == DROPPED, 1)).alias("dropped"),
                   F.grouping("topic").alias("all")))
    attempts = F.col("first_deliveries") + F.col("dropped")
    return (counts.select(
        F.when(F.col("all") == 1, F.lit(ALL_TOPICS)).otherwise(F.col("topic")).alias("topic"),
        "delivered", "first_deliveries", "retries", "dropped",
        F.when(attempts > 0, F.col("dropped") / attempts).alias("drop_rate"),
        F.when(F.col("delivered") > 0, F.col("retries") / F.col("delivered")).alias("retry_rate"))
        .orderBy(F.col("topic") == ALL_TOPICS, "topic"))


def report_path(lake: str, name: str) -> str:
    return table_path(lake, f"{REPORTS}/{name}")


def build(spark: SparkSession, lake: str, top: int = DEFAULT_TOP, w: TimeWindow | None = None,
          lookback_ms: int = 3_600_000) -> dict[str, Callable[[], DataFrame]]:
    return {"latency": lambda: latency(spark, lake, w, lookback_ms), "online": lambda: online(spark, lake, w),
            "top_talkers": lambda: top_talkers(spark, lake, top, w), "rates": lambda: rates(spark, lake, w)}


NAMES = ("latency", "online", "top_talkers", "rates")


def run(spark: SparkSession, lake: str, names: Sequence[str] = NAMES, top: int = DEFAULT_TOP,
        w: TimeWindow | None = None, lookback_ms: int = 3_600_000) -> dict[str, DataFrame]:
    """Compute and write each report of the window (None: the whole lake), replacing the previous one; returns
    them as read back from the lake."""
    makers = build(spark, lake, top, w, lookback_ms)
    out: dict[str, DataFrame] = {}
    for name in names:
        path = report_path(lake, name)
        makers[name]().coalesce(1).write.mode("overwrite").parquet(path)
        out[name] = spark.read.parquet(path)
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--only", default=",".join(NAMES),
                        help=f"comma-separated reports to run (default all: {','.join(NAMES)})")
    parser.add_argument("--top", type=positive_int, default=DEFAULT_TOP, help="how many top talkers")
    parser.add_argument("--rows", type=positive_int, default=50, help="rows of each report to print")
    parser.add_argument("--lookback", default=DEFAULT_LOOKBACK,
                        help=f"latency: messages received this long before the window are read too "
                             f"(default {DEFAULT_LOOKBACK})")
    windows.add_arguments(parser)


def main_job(spark: SparkSession, lake: str, args: argparse.Namespace) -> int:
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = sorted(set(names) - set(NAMES))
    if unknown:
        print(f"reports: unknown report(s) {unknown}; known: {', '.join(NAMES)}", file=sys.stderr)
        return 2
    try:
        lookback_ms = round(parse_duration(args.lookback).total_seconds() * 1000)
        w = windows.resolve(lake, REPORTS, args.since, args.until, int(time.time() * 1000))
    except RuleError as e:
        print(f"reports: {e}", file=sys.stderr)
        return 2
    print(f"reports over {w.describe()}")
    for name, df in run(spark, lake, names, args.top, w, lookback_ms).items():
        print(f"== {name} ({report_path(lake, name)})")
        df.show(args.rows, truncate=False)
    if "://" not in lake:
        windows.save_until(windows.checkpoint_path(lake, REPORTS), w.until_ms)
    return 0
