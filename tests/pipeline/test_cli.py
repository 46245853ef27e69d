"""`python -m pipeline.cli run ...` as its own process: argument errors before Spark starts, and one real run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.pipeline.conftest import message, write_messages


def _cli(*args: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pipeline.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def test_bad_arguments_fail_before_spark(tmp_path: Path) -> None:
    bad_rule = _cli("run", "alerts", "--lake", str(tmp_path), "--rule", "temp > 80", cwd=tmp_path)
    assert bad_rule.returncode == 2 and "expected '<field> <op> <number> for <duration>'" in bad_rule.stderr
    no_job = _cli("run", "nonsense", cwd=tmp_path)
    assert no_job.returncode == 2 and "invalid choice" in no_job.stderr


def test_run_aggregates(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    write_messages(lake, [message(i, i, f"d{i % 2}", "t/x", {"v": float(i)}) for i in range(1, 31)])
    # a relative --lake: made absolute against the working directory
    done = _cli("run", "aggregates", "--lake", "lake", "--shuffle-partitions", "2", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "aggregates: 30 rows in 1 batches" in done.stdout and " rows/s -> " in done.stdout
    assert list((lake / "aggregates" / "device_minute").glob("dt=2024-05-01/batch=0/*.parquet"))
    assert list((lake / "aggregates" / "topic_minute").glob("dt=2024-05-01/batch=0/*.parquet"))
