"""Partition pruning: only the dt=/hour= directories of a window, found without listing the lake's history."""

from __future__ import annotations

import datetime as dt
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tidewire.pipeline.lake.partitions import day_paths, partition_paths

DAY0 = dt.date(2024, 1, 1)
H = 3_600_000
LISTED: list[str] | None = None  # set while a test records os.listdir calls


def _audit(event: str, args: tuple[object, ...]) -> None:
    if LISTED is not None and event == "os.listdir":
        LISTED.append(str(args[0]))


sys.addaudithook(_audit)  # audit hooks cannot be removed: it records only while LISTED is a list


@pytest.fixture
def listed() -> Iterator[list[str]]:
    global LISTED
    LISTED = []
    try:
        yield LISTED
    finally:
        LISTED = None


def ms(day: int, hour: int = 0) -> int:
    d = DAY0 + dt.timedelta(days=day)
    return int(dt.datetime(d.year, d.month, d.day, tzinfo=dt.UTC).timestamp() * 1000) + hour * H


def make_lake(lake: Path, days: int) -> None:
    for i in range(days):
        d = DAY0 + dt.timedelta(days=i)
        for h in range(24):
            part = lake / "messages" / f"dt={d.isoformat()}" / f"hour={h:02d}"
            part.mkdir(parents=True)
            (part / "00-1-1.parquet").write_bytes(b"")
        (lake / "messages" / f"dt={d.isoformat()}" / ".hidden").mkdir()
    (lake / "messages" / "_tidewire").mkdir()


def names(paths: list[Path]) -> list[str]:
    return [f"{p.parent.name}/{p.name}" for p in paths]


def test_the_window_and_nothing_else_is_listed(tmp_path: Path, listed: list[str]) -> None:
    lake = tmp_path / "lake"
    make_lake(lake, 40)
    listed.clear()
    got = partition_paths(lake, "messages", ms(30, 22) + 1, ms(31, 2))
    assert names(got) == ["dt=2024-01-31/hour=22", "dt=2024-01-31/hour=23", "dt=2024-02-01/hour=00",
                          "dt=2024-02-01/hour=01"]
    # the two days of the window, never the table's top level or another day
    assert sorted(Path(p).name for p in listed) == ["dt=2024-01-31", "dt=2024-02-01"]
    # the same window on a lake ten times as old lists exactly as much
    old = tmp_path / "old"
    make_lake(old, 400)
    listed.clear()
    assert len(partition_paths(old, "messages", ms(390, 22) + 1, ms(391, 2))) == 4
    assert len(listed) == 2


def test_open_bounds_missing_days_and_day_tables(tmp_path: Path, listed: list[str]) -> None:
    lake = tmp_path / "lake"
    make_lake(lake, 3)
    assert len(partition_paths(lake, "messages", None, None)) == 72
    assert names(partition_paths(lake, "messages", None, ms(0, 2))) == ["dt=2024-01-01/hour=00",
                                                                       "dt=2024-01-01/hour=01"]
    assert names(partition_paths(lake, "messages", ms(2, 23), None)) == ["dt=2024-01-03/hour=23"]
    assert partition_paths(lake, "messages", ms(10), ms(12)) == []  # days not in the lake
    assert partition_paths(lake, "events", ms(0), ms(1)) == []  # no such table
    assert partition_paths(lake, "messages", ms(1), ms(1)) == []  # an empty window
    assert [p.name for p in day_paths(lake, "messages", ms(1, 5), ms(2, 1))] == ["dt=2024-01-02", "dt=2024-01-03"]
    assert [p.name for p in day_paths(lake, "messages", None, ms(1))] == ["dt=2024-01-01"]
