"""`python -m tidewire.pipeline.cli run ...` and `tidewire pipeline|lake run ...` as their own processes: argument
errors before Spark starts, and the forwarding of the `tidewire` commands."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pyarrow.dataset as ds

from tidewire.store.base import Message
from tidewire.store.embedded.engine import EmbeddedStore


def _cli(*args: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tidewire.pipeline.cli", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)


def test_bad_arguments_fail_before_spark(tmp_path: Path) -> None:
    bad_rule = _cli("run", "alerts", "--lake", str(tmp_path), "--rule", "temp > 80", cwd=tmp_path)
    assert bad_rule.returncode == 2 and "expected '<field> <op> <number> for <duration>'" in bad_rule.stderr
    no_job = _cli("run", "nonsense", cwd=tmp_path)
    assert no_job.returncode == 2 and "invalid choice" in no_job.stderr


def test_tidewire_forwards_to_the_pipeline_and_lake_commands(tmp_path: Path) -> None:
    """`tidewire pipeline run ...` and `tidewire lake run ...` reach the same parsers (a real job run is in
    test_end_to_end, on the shared SparkSession: a second JVM here would cost the suite ~12 s)."""
    tidewire = [sys.executable, "-m", "tidewire"]
    no_job = subprocess.run([*tidewire, "pipeline", "run", "nonsense"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=60)
    assert no_job.returncode == 2 and "invalid choice" in no_job.stderr
    asyncio.run(_append(tmp_path / "data", 3))
    lake = tmp_path / "lake"
    once = subprocess.run([*tidewire, "lake", "run", "--data-dir", str(tmp_path / "data"), "--lake", str(lake),
                           "--once"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert once.returncode == 0, once.stderr[-2000:]
    assert ds.dataset(lake / "messages", format="parquet", partitioning="hive").count_rows() == 3


async def _append(data_dir: Path, n: int) -> None:
    store = EmbeddedStore(data_dir)
    await store.open()
    await store.append([Message(f"t/{i}", b"{}") for i in range(n)])
    await store.close()
