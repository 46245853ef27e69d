"""The compaction Spark job (local Spark): the closed hours of a synthetic lake compacted by executor tasks, and
every row once as the jobs read the lake (`pipeline.spark.read_messages`) and as pyarrow reads it, and the
aggregates stream does not count the compacted files' rows again."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.pipeline.lake.test_compaction import HOURS, NOW_S, PARTITIONS, build_lake, files_per_hour_partition
from tidewire.pipeline.jobs import aggregates, compact
from tidewire.pipeline.lake import reading
from tidewire.pipeline.lake.compact_command import CompactOptions
from tidewire.pipeline.spark import read_events, read_messages


@pytest.mark.slow
def test_the_spark_job_compacts_each_closed_hour_exactly_once(tmp_path: Path, spark: Any) -> None:
    lake = tmp_path / "lake"
    n = build_lake(lake)
    assert read_messages(spark, str(lake)).count() == n
    assert aggregates.run(spark, str(lake)).rows == n
    stats = compact.run(spark, str(lake), CompactOptions(after_s=0), clock=lambda: NOW_S)
    assert stats.hours == 2 * HOURS and stats.outputs == PARTITIONS * HOURS + HOURS
    assert set(files_per_hour_partition(lake).values()) == {1}
    got = Counter(r.position for r in read_messages(spark, str(lake)).select("position").collect())
    assert len(got) == n and set(got.values()) == {1}
    assert len(reading.dataset(lake, "messages").to_table()) == n
    assert read_events(spark, str(lake)).count() == HOURS * 4 * 3
    assert aggregates.run(spark, str(lake)).rows == 0  # the stream skips compacted files: their rows are counted
    with compact.compaction_lock(lake):
        assert compact.run(spark, str(lake), CompactOptions(after_s=0), clock=lambda: NOW_S).skipped
