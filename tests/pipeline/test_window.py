"""The incremental jobs' window: --since/--until parsing and the checkpoint a run continues from."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidewire.pipeline import window
from tidewire.pipeline.window import RuleError, TimeWindow

NOW = 1_714_557_600_000  # 2024-05-01T10:00:00Z
DAY = 86_400_000


def test_parse_time() -> None:
    assert window.parse_time("1d", NOW) == NOW - DAY
    assert window.parse_time("90m", NOW) == NOW - 90 * 60_000
    assert window.parse_time("2024-05-01T10:00:00Z", 0) == NOW
    assert window.parse_time("2024-05-01T12:00:00+02:00", 0) == NOW
    assert window.parse_time("2024-05-01T10:00:00", 0) == NOW  # no zone: UTC
    assert window.parse_time("2024-05-01", 0) == NOW - 10 * 3_600_000
    for bad in ("yesterday", "1 fortnight", "", "5"):
        with pytest.raises(RuleError):
            window.parse_time(bad, NOW)


def test_resolve_continues_from_the_last_run(tmp_path: Path) -> None:
    lake = str(tmp_path / "lake")
    assert window.resolve(lake, "reports", None, None, NOW) == TimeWindow(None, NOW)  # first run: everything
    assert window.resolve(lake, "reports", "1d", None, NOW) == TimeWindow(NOW - DAY, NOW)
    window.save_until(window.checkpoint_path(lake, "reports"), NOW)
    later = NOW + 3_600_000
    assert window.resolve(lake, "reports", None, None, later) == TimeWindow(NOW, later)
    assert window.resolve(lake, "alerts-x", None, None, later) == TimeWindow(None, later)  # per job
    with pytest.raises(RuleError, match="empty window"):
        window.resolve(lake, "reports", None, "2h", later)
    window.checkpoint_path(lake, "reports").write_text("{not json")
    with pytest.raises(RuleError, match="unreadable"):  # never silently from the beginning
        window.resolve(lake, "reports", None, None, later)
    with pytest.raises(RuleError, match="--since"):
        window.resolve("s3a://bucket/lake", "reports", None, None, later)
