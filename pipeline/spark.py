"""The SparkSession the jobs run on, and the lake's tables read as Spark DataFrames with explicit schemas.

Local by default (`local[2]`, UI off, few shuffle partitions, UTC, loopback driver, the running interpreter for
Python workers, no Hive); under `spark-submit` the master and cluster settings come from spark-submit and are
left alone. Nothing is downloaded at run time: no `spark.jars.packages`.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import pyarrow as pa
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from tidewire.pipeline.lake.partitions import partition_paths
from tidewire.pipeline.lake.reading import committed_files, committed_in_hour
from tidewire.pipeline.lake.schema import (
    EVENTS,
    EVENTS_SCHEMA,
    MESSAGES,
    MESSAGES_SCHEMA,
    SPARKPLUG,
    SPARKPLUG_SCHEMA,
)

DEFAULT_MASTER = "local[2]"
DEFAULT_SHUFFLE_PARTITIONS = 4
LOOPBACK = "127.0.0.1"
LOG_LEVEL = "ERROR"

# The Hive-style partition columns of `messages/` and `events/` (see pipeline.lake.schema).
PARTITION_FIELDS = [T.StructField("dt", T.DateType()), T.StructField("hour", T.IntegerType())]


def under_spark_submit() -> bool:
    """True when this interpreter was started by spark-submit (or a pyspark shell): the JVM is already up with
    its master and deploy settings, which the jobs must not override."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def spark_session(master: str | None = DEFAULT_MASTER, app: str = "tidewire",
                  conf: dict[str, str] | None = None,
                  shuffle_partitions: int = DEFAULT_SHUFFLE_PARTITIONS) -> SparkSession:
    """Get or create the session. `master` is ignored under spark-submit (its `--master` wins); None means
    `local[2]` otherwise. `conf` entries are applied last (they override the defaults here)."""
    submitted = under_spark_submit()
    builder: Any = SparkSession.builder.appName(app)
    settings: dict[str, str] = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": str(shuffle_partitions),
        "spark.default.parallelism": str(shuffle_partitions),
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.catalogImplementation": "in-memory",  # no Hive metastore, no derby files in the cwd
    }
    if not submitted:
        master = master or DEFAULT_MASTER
        builder = builder.master(master)
        if master.startswith("local"):
            # Local workers run on this machine with this interpreter; on a cluster the executors' Python and
            # the driver's address are the cluster's business (an image path, a routable host), not ours.
            os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
            os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
            if "SPARK_LOCAL_IP" not in os.environ:
                os.environ["SPARK_LOCAL_IP"] = LOOPBACK
                settings["spark.driver.host"] = LOOPBACK
                settings["spark.driver.bindAddress"] = LOOPBACK
    settings.update(conf or {})
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark: SparkSession = builder.getOrCreate()
    spark.sparkContext.setLogLevel(LOG_LEVEL)
    return spark


# -- Arrow -> Spark types ------------------------------------------------------------------------------------

def spark_type(t: pa.DataType) -> T.DataType:
    """The Spark type Spark's Parquet reader gives a column the lake writes with Arrow type `t`."""
    if pa.types.is_timestamp(t):
        return T.TimestampType()
    if pa.types.is_map(t):
        return T.MapType(spark_type(t.key_type), spark_type(t.item_type), True)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return T.ArrayType(spark_type(t.value_type), True)
    if pa.types.is_struct(t):
        return T.StructType([T.StructField(f.name, spark_type(f.type), f.nullable) for f in t])
    simple: list[tuple[Any, T.DataType]] = [
        (pa.types.is_int8, T.ByteType()), (pa.types.is_int16, T.ShortType()), (pa.types.is_int32, T.IntegerType()),
        (pa.types.is_int64, T.LongType()), (pa.types.is_float32, T.FloatType()), (pa.types.is_float64, T.DoubleType()),
        (pa.types.is_boolean, T.BooleanType()), (pa.types.is_string, T.StringType()),
        (pa.types.is_large_string, T.StringType()), (pa.types.is_binary, T.BinaryType()),
        (pa.types.is_large_binary, T.BinaryType()), (pa.types.is_date32, T.DateType()),
    ]
    for test, spark in simple:
        if test(t):
            return spark
    raise TypeError(f"no Spark type for the Arrow type {t}")


def spark_schema(schema: pa.Schema, partitioned: bool = True) -> T.StructType:
    """The Spark schema of a lake table; `partitioned` adds the `dt` (date) and `hour` (int) path columns."""
    fields = [T.StructField(f.name, spark_type(f.type), True) for f in schema]
    return T.StructType(fields + (PARTITION_FIELDS if partitioned else []))


MESSAGES_SPARK_SCHEMA = spark_schema(MESSAGES_SCHEMA)
EVENTS_SPARK_SCHEMA = spark_schema(EVENTS_SCHEMA)
SPARKPLUG_SPARK_SCHEMA = spark_schema(SPARKPLUG_SCHEMA)


def table_path(lake: str, table: str) -> str:
    return lake.rstrip("/") + "/" + table


def read_table(spark: SparkSession, lake: str, table: str, schema: T.StructType, time_column: str | None = None,
               since_ms: int | None = None, until_ms: int | None = None) -> DataFrame:
    """A lake table as a DataFrame; an absent or empty table is an empty DataFrame of the same schema.

    On a local or mounted lake Spark reads the committed files (`pipeline.lake.reading`: compacted outputs, not
    the files they replace); with a bound (`since_ms`/`until_ms`, UTC ms, [since, until) of `time_column`) only
    those of the range's `dt=/hour=` directories (`pipeline.lake.partitions`), and the rows are cut to the range
    exactly. In an object store (`scheme://`, never compacted) Spark lists the directory itself (its filter on
    `dt`/`hour` prunes what it reads). Spark skips names with a leading `.` or `_`: in-progress files and the
    `_tidewire` state are never read."""
    base = table_path(lake, table)
    empty = spark.createDataFrame([], schema)
    bounded = time_column is not None and (since_ms is not None or until_ms is not None)
    try:
        if "://" in lake:
            df = spark.read.schema(schema).option("basePath", base).parquet(base)
        else:
            if bounded:
                files = [f for hour in partition_paths(lake, table, since_ms, until_ms)
                         for f in committed_in_hour(hour)]
            else:
                files = committed_files(lake, table)
            if not files:
                return empty
            df = spark.read.schema(schema).option("basePath", base).parquet(*(str(p) for p in files))
    except AnalysisException as e:
        if e.getCondition() != "PATH_NOT_FOUND":
            raise
        return empty
    if bounded and time_column is not None:
        t = F.unix_millis(F.col(time_column))
        if since_ms is not None:
            df = df.where((F.col("dt") >= F.to_date(F.timestamp_millis(F.lit(since_ms)))) & (t >= since_ms))
        if until_ms is not None:
            df = df.where((F.col("dt") <= F.to_date(F.timestamp_millis(F.lit(until_ms)))) & (t < until_ms))
    return df


def read_messages(spark: SparkSession, lake: str, since_ms: int | None = None,
                  until_ms: int | None = None) -> DataFrame:
    """The messages received in [since_ms, until_ms) (None: unbounded)."""
    return read_table(spark, lake, MESSAGES, MESSAGES_SPARK_SCHEMA, "received_at", since_ms, until_ms)


def read_events(spark: SparkSession, lake: str, since_ms: int | None = None, until_ms: int | None = None) -> DataFrame:
    """The events of [since_ms, until_ms) (None: unbounded)."""
    return read_table(spark, lake, EVENTS, EVENTS_SPARK_SCHEMA, "time", since_ms, until_ms)


def read_sparkplug(spark: SparkSession, lake: str, since_ms: int | None = None,
                   until_ms: int | None = None) -> DataFrame:
    """The Sparkplug B metric rows of the messages received in [since_ms, until_ms) (None: unbounded)."""
    return read_table(spark, lake, SPARKPLUG, SPARKPLUG_SPARK_SCHEMA, "received_at", since_ms, until_ms)
