"""Folding the aggregates' partials: closed days become one set each, with the same exact numbers, also when a
fold is cut short at any step (each step's state is read back exact, then the next pass completes it)."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pyarrow.dataset as ds
import pytest

from tests.pipeline.conftest import write_messages
from tests.pipeline.test_jobs import _actual, _assert_same, _expected, _telemetry
from tidewire.pipeline import fold
from tidewire.pipeline.jobs import aggregates
from tidewire.pipeline.jobs.aggregates import Folding
from tidewire.pipeline.lake.partitions import day_name

pytestmark = pytest.mark.slow

LATER = 1_800_000_000_000  # 2027: every day of the synthetic lake is closed
OFF = Folding(days=0)
ON = Folding(days=1000, wall_ms=lambda: LATER)


def sets(lake: Path) -> dict[str, int]:
    table = lake / "aggregates" / "device_minute"
    return {d.name: len([b for b in d.iterdir() if b.name.startswith("batch=")])
            for d in sorted(table.iterdir()) if d.name.startswith("dt=")}


def exact(spark: Any, lake: Path, rows: list[dict[str, Any]]) -> None:
    """Spark's final numbers are exact, and pyarrow, listing the directories itself, counts every message once."""
    by: aggregates.By
    for by in ("device", "topic"):
        _assert_same(_actual(spark, lake, by), _expected(rows, aggregates.KEYS[by]))
        table = ds.dataset(lake / "aggregates" / aggregates.TABLES[by], format="parquet",
                           partitioning="hive").to_table(filter=pc.field("field").is_null())
        assert pc.sum(table.column("count")).as_py() == len(rows)


def test_closed_days_fold_exactly_and_interrupted_folds_recover(spark: Any, tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    rows = _telemetry(1, 300, seed=3)
    for i, chunk in enumerate((rows[:100], rows[100:200])):
        write_messages(lake, chunk, name=f"0-{i}")
    first = aggregates.run(spark, str(lake), max_files=1, folding=OFF)
    assert first.batches == 6
    assert sets(lake) == {"dt=2024-05-01": 4, "dt=2024-05-02": 2}
    exact(spark, lake, rows[:200])

    done = aggregates.run(spark, str(lake), folding=ON)  # no new files: only the fold at the end
    assert done.rows == 0 and len(done.folded) == 4  # two days of two tables
    assert sets(lake) == {"dt=2024-05-01": 1, "dt=2024-05-02": 1}
    for d in (lake / "aggregates" / "device_minute").iterdir():
        if d.name.startswith("dt="):
            assert len([f for f in d.rglob("*.parquet")]) == 1  # a day is one file
    exact(spark, lake, rows[:200])

    # late data for both days: each gets a second set
    write_messages(lake, rows[200:], name="0-2")
    aggregates.run(spark, str(lake), folding=OFF)
    assert sets(lake) == {"dt=2024-05-01": 2, "dt=2024-05-02": 2}
    exact(spark, lake, rows)
    table = lake / "aggregates" / "device_minute"
    schema = aggregates.partial_schema("device")
    d1 = dt.date(2024, 5, 1)
    batches = fold._batch_ids(table / day_name(d1))

    # cut after staging: the staged set is hidden, the day unchanged
    staging = fold.stage(spark, table, d1, batches, schema)
    exact(spark, lake, rows)
    # cut after the swap, before the old set was renamed: `.dt=D.fold` holds the old batches
    assert fold.exchange(staging, table / day_name(d1))
    assert sets(lake)["dt=2024-05-01"] == 1
    fold.recover(table, LATER / 1000)  # the hidden copy is redundant either way: deleted
    assert not staging.exists()
    exact(spark, lake, rows)

    # the two-rename fallback cut between its renames: the day is missing until the next pass rolls it forward
    d2 = dt.date(2024, 5, 2)
    staging = fold.stage(spark, table, d2, fold._batch_ids(table / day_name(d2)), schema)
    os.rename(table / day_name(d2), table / f".{day_name(d2)}{fold.OLD_MARK}{LATER + 5}")
    fold.recover(table, LATER / 1000)
    assert sets(lake)["dt=2024-05-02"] == 1
    exact(spark, lake, rows)

    # the old sets stay hidden for readers that listed them, then go
    old = [p.name for p in table.iterdir() if fold.OLD_MARK in p.name]
    assert old
    fold.recover(table, LATER / 1000 + fold.KEEP_OLD_S + 1)
    assert [p.name for p in table.iterdir() if p.name.startswith(".")] == []
    aggregates.run(spark, str(lake), folding=ON)
    assert sets(lake) == {"dt=2024-05-01": 1, "dt=2024-05-02": 1}
    exact(spark, lake, rows)
