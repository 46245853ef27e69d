"""Smoke run of the month-scale lake benchmark at a tiny size: every timed run sees exactly the rows it should
(the --since 1d runs the last day's, on 1 day and on 2 days of history; the aggregates all of them, folded or
not), the fold leaves one set per day, and the compaction hook runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadtest import lake_scale

pytestmark = pytest.mark.slow


def test_lake_scale_smoke(tmp_path: Path) -> None:
    marker = tmp_path / "compacted"
    cfg = lake_scale.Config(days=2, partitions=2, files_per_hour=2, rows_per_file=5, devices=20, batches_per_day=3,
                            master="local[1]", compact=f"touch {marker}")
    r = lake_scale.bench(cfg, tmp_path / "lake")
    per_day = 24 * 2 * 2 * 5
    assert r.files["1 day messages"] == 96 and r.files["2 days messages"] == 192
    assert r.rows["messages in the window @ 1 day"] == r.rows["messages in the window @ 2 days"] == per_day
    assert r.rows["aggregates stream rows"] == 2 * per_day
    for stage in ("unfolded", "folded"):
        assert r.rows[f"aggregates read 1 day {stage}"] == per_day
        assert r.rows[f"aggregates read 2 days {stage}"] == 2 * per_day
    assert r.files["aggregates folded"] == 2 < r.files["aggregates unfolded"]
    assert marker.exists() and r.files["2 days messages compacted"] == 192
    assert "reports --since 1d @ 2 days" in lake_scale.format_result(r, cfg)
