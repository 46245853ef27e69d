"""Sparkplug B metrics report: per group, edge node, device and metric, the values of a time window.

Reads the lake's `sparkplug` table (one row per metric of each Sparkplug B message: `pipeline.lake.schema`) over
`--since/--until` (`pipeline.window`; by default from where the last run stopped to now) and writes
`<lake>/reports/sparkplug_metrics/` (replaced on every run).

Definitions:
- the rows counted are the metrics of births and DATA messages (NBIRTH, DBIRTH, NDATA, DDATA); commands and
  deaths carry no measurements. `device` is null for an edge node's own metrics.
- a metric sent by alias whose name the bridge did not know when it wrote the row (its birth was in another log
  partition, not yet read) is named here from the latest birth in the lake up to the window's end that gave the
  alias (the device's DBIRTH, else its edge node's NBIRTH); still unknown: named `alias:<n>`.
- count: rows; nulls: rows with `is_null`; min, max, avg: over the numeric values (int, long, float, double
  columns as double; booleans as 0/1), null when none; last_value: the value of the latest row as text (bytes as
  hex), null for a null metric; last_time: the latest row's time (its metric timestamp, else the payload's, else
  when the gateway received it; ties broken by log position).
"""

from __future__ import annotations

import argparse
import sys
import time

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from tidewire.pipeline import window as windows
from tidewire.pipeline.spark import read_sparkplug, table_path
from tidewire.pipeline.window import RuleError, TimeWindow

REPORTS = "reports"
NAME = "sparkplug_metrics"
JOB = "sparkplug"  # the window checkpoint's name
MEASURED = ("NBIRTH", "DBIRTH", "NDATA", "DDATA")
BIRTHS = ("NBIRTH", "DBIRTH")
KEY = ["group_id", "edge_node", "device", "metric"]


def _numeric() -> Column:
    return F.coalesce(F.col("int_value").cast("double"), F.col("long_value").cast("double"),
                      F.col("float_value").cast("double"), F.col("double_value"),
                      F.col("boolean_value").cast("int").cast("double"))


def _text() -> Column:
    return F.coalesce(F.col("int_value").cast("string"), F.col("long_value").cast("string"),
                      F.col("float_value").cast("string"), F.col("double_value").cast("string"),
                      F.col("boolean_value").cast("string"), F.col("string_value"), F.hex(F.col("bytes_value")))


def _named(spark: SparkSession, lake: str, rows: DataFrame, until_ms: int | None) -> DataFrame:
    """`rows` with the metrics the bridge could not name named from the lake's births (see the module)."""
    births = (read_sparkplug(spark, lake, None, until_ms)
              .where(F.col("message_type").isin(*BIRTHS) & F.col("alias").isNotNull() & F.col("metric").isNotNull())
              .select("group_id", "edge_node", F.coalesce("device", F.lit("")).alias("dev"), "alias", "metric",
                      "received_at", "position"))
    latest = Window.partitionBy("group_id", "edge_node", "dev", "alias").orderBy(F.desc("received_at"),
                                                                                F.desc("position"))
    named = (births.withColumn("n", F.row_number().over(latest)).where("n = 1")
             .select("group_id", "edge_node", "dev", "alias", "metric"))
    device = named.withColumnRenamed("metric", "device_name").withColumnRenamed("dev", "device_key")
    node = (named.where(F.col("dev") == "").drop("dev").withColumnRenamed("metric", "node_name"))
    return (rows.withColumn("device_key", F.coalesce("device", F.lit("")))
            .join(device, ["group_id", "edge_node", "device_key", "alias"], "left")
            .join(node, ["group_id", "edge_node", "alias"], "left")
            .withColumn("metric", F.coalesce("metric", "device_name", "node_name",
                                             F.concat(F.lit("alias:"), F.col("alias").cast("string"))))
            .drop("device_key", "device_name", "node_name"))


def metrics(spark: SparkSession, lake: str, w: TimeWindow | None = None) -> DataFrame:
    """(group_id, edge_node, device, metric, datatype, count, nulls, min, max, avg, last_value, last_time)."""
    since, until = (None, None) if w is None else (w.since_ms, w.until_ms)
    rows = read_sparkplug(spark, lake, since, until).where(F.col("message_type").isin(*MEASURED))
    unnamed = rows.where(F.col("metric").isNull() & F.col("alias").isNotNull())
    if unnamed.limit(1).count():
        rows = _named(spark, lake, rows, until)
    at = F.coalesce("metric_timestamp", "payload_timestamp", "received_at")
    order = F.struct(at.alias("at"), F.col("position"))
    value = F.when(~F.coalesce(F.col("is_null"), F.lit(False)), _text())
    n = _numeric()
    return (rows.groupBy(*KEY)
            .agg(F.max_by(F.col("datatype"), F.when(F.col("datatype").isNotNull(), order)).alias("datatype"),
                 F.count("*").alias("count"),
                 F.count(F.when(F.col("is_null"), 1)).alias("nulls"),
                 F.min(n).alias("min"), F.max(n).alias("max"), F.avg(n).alias("avg"),
                 F.max_by(value, order).alias("last_value"), F.max(order)["at"].alias("last_time"))
            .orderBy(*KEY))


def report_path(lake: str) -> str:
    return table_path(lake, f"{REPORTS}/{NAME}")


def run(spark: SparkSession, lake: str, w: TimeWindow | None = None) -> DataFrame:
    """Compute and write the report of the window (None: the whole lake); returns it as read back."""
    path = report_path(lake)
    metrics(spark, lake, w).coalesce(1).write.mode("overwrite").parquet(path)
    return spark.read.parquet(path)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rows", type=int, default=50, help="rows of the report to print")
    windows.add_arguments(parser)


def main_job(spark: SparkSession, lake: str, args: argparse.Namespace) -> int:
    try:
        w = windows.resolve(lake, JOB, args.since, args.until, int(time.time() * 1000))
    except RuleError as e:
        print(f"sparkplug: {e}", file=sys.stderr)
        return 2
    print(f"sparkplug metrics over {w.describe()}")
    print(f"== {NAME} ({report_path(lake)})")
    run(spark, lake, w).show(args.rows, truncate=False)
    if "://" not in lake:
        windows.save_until(windows.checkpoint_path(lake, JOB), w.until_ms)
    return 0
