"""The compactor killed with kill -9 at random points while a real bridge appends to the hours it compacts: after
every kill, and at the end, every exported position is in the lake exactly once, read by pyarrow and by Spark.
And the bridge's own background compaction, end to end."""

from __future__ import annotations

import asyncio
import json
import random
import signal
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from tests.pipeline.lake.support import messages
from tests.waiting import until
from tidewire.pipeline.lake import reading
from tidewire.pipeline.lake.command import Lake
from tidewire.pipeline.lake.compact_command import CompactOptions
from tidewire.store.embedded.engine import EmbeddedStore

ROOT = Path(__file__).resolve().parents[3]
SEED = 24
ROUNDS = 10


def lost_and_twice(got: Counter[int], upto: int) -> tuple[int, int]:
    """Positions 1..upto missing from `got`, and rows beyond the first of any position."""
    return sum(1 for p in range(1, upto + 1) if p not in got), sum(got.values()) - len(got)


def pyarrow_positions(lake: Path) -> Counter[int]:
    return Counter(reading.dataset(lake, "messages").to_table(columns=["position"]).column("position").to_pylist())


def checkpoint(lake: Path) -> int:
    try:
        return int(json.loads((lake / "_tidewire" / "checkpoint-p00.json").read_text())["position"])
    except FileNotFoundError:
        return 0


@pytest.mark.slow
async def test_compactor_killed_at_random_points_while_the_bridge_appends(tmp_path: Path, spark: Any) -> None:
    data, lake = tmp_path / "data", tmp_path / "lake"
    store = EmbeddedStore(data, fsync="never", segment_bytes=64 << 10)
    await store.open()
    bridge_args = [sys.executable, "-m", "tidewire.pipeline.lake", "--data-dir", str(data), "--lake", str(lake),
                   "--owner", "k", "--flush-rows", "40", "--flush-seconds", "0.05", "--read-batch", "40",
                   "--idle-s", "0.01", "--no-compact", "--log-level", "WARNING"]
    compact_args = [sys.executable, "-m", "tidewire.pipeline.lake.compact_command", "--lake", str(lake),
                    "--older-than", "0", "--grace", "0", "--target-bytes", "30000", "--log-level", "WARNING"]
    written = 0
    writing = True

    async def writer() -> None:  # 1,000 messages per hour of received time (support.messages): closed hours
        nonlocal written
        while writing:
            await store.append(messages(20, start=written))
            written += 20
            await asyncio.sleep(0.005)

    rnd = random.Random(SEED)
    wtask = asyncio.create_task(writer())
    bridge = await asyncio.create_subprocess_exec(*bridge_args, cwd=ROOT, stdout=asyncio.subprocess.DEVNULL)
    killed = finished = mid_work = 0
    try:
        await until(lambda: checkpoint(lake) > 2000, timeout=30, what="the bridge exporting two hours")
        for _ in range(ROUNDS):
            proc = await asyncio.create_subprocess_exec(*compact_args, cwd=ROOT, stdout=asyncio.subprocess.DEVNULL)
            await asyncio.sleep(rnd.uniform(0.05, 1.5))  # the behaviour under test: a kill at a random point
            if proc.returncode is None:
                proc.send_signal(signal.SIGKILL)
            code = await proc.wait()
            killed += code == -signal.SIGKILL
            finished += code == 0
            mid_work += bool(list((lake / "messages").rglob(".c-*.tmp")))  # a compaction left half done
            upto = checkpoint(lake)  # committed before the listing: every position up to it must be there
            assert lost_and_twice(pyarrow_positions(lake), upto) == (0, 0)
        assert bridge.returncode is None, "the bridge exited"
    finally:
        writing = False
        await wtask
        if bridge.returncode is None:
            bridge.terminate()  # flushes and commits
        await bridge.wait()
    once = await asyncio.create_subprocess_exec(*bridge_args, "--once", cwd=ROOT, stdout=asyncio.subprocess.DEVNULL)
    assert await once.wait() == 0
    await store.close()
    assert checkpoint(lake) == written
    before = len(list((lake / "messages").rglob("*.parquet")))
    for _ in range(5):  # until a pass finds nothing to do: each deletes what the last replaced (grace 0)
        proc = await asyncio.create_subprocess_exec(*compact_args, cwd=ROOT, stdout=asyncio.subprocess.PIPE)
        out, _ = await proc.communicate()
        assert proc.returncode == 0
        last = json.loads(out)
        if last["outputs"] == last["deleted"] == 0:
            break
    after = len(list((lake / "messages").rglob("*.parquet")))
    print(f"\n{killed} compactors killed ({mid_work} with an output half done), {finished} finished; {written} "
          f"positions; "
          f"{before} files before the last passes, {after} after; last pass {out.decode().strip()}")
    assert killed >= 2  # timing decides how many; the seed, where
    assert lost_and_twice(pyarrow_positions(lake), written) == (0, 0)
    rows = spark.read.parquet(*[str(p) for p in reading.committed_files(lake, "messages")]).select("position")
    spark_got = Counter(r.position for r in rows.collect())
    assert lost_and_twice(spark_got, written) == (0, 0)
    plain = Counter(pq.ParquetDataset(lake / "messages").read(columns=["position"]).column("position").to_pylist())
    assert lost_and_twice(plain, written) == (0, 0)  # the replaced files are gone
    assert not list(lake.rglob("*.tmp"))


async def test_the_bridge_compacts_closed_hours_in_the_background(tmp_path: Path) -> None:
    store = EmbeddedStore(tmp_path / "data", fsync="never", segment_bytes=64 << 10)
    await store.open()
    lake_dir = tmp_path / "lake"
    try:
        await store.append(messages(3000))  # three closed hours
        lake = Lake(store, lake_dir, "n", flush_rows=50, read_batch=50, flush_seconds=0.05, idle_s=0.01,
                    compact=CompactOptions(after_s=0, grace_s=0))
        assert lake.compactor is not None
        lake.compactor.check_s = 0.1
        task = asyncio.create_task(lake.run())
        try:
            def compacted() -> bool:
                files = reading.committed_files(lake_dir, "messages")
                return 0 < len(files) <= 4 and lost_and_twice(pyarrow_positions(lake_dir), 3000) == (0, 0)

            await until(compacted, timeout=30, what="the closed hours compacted")
        finally:
            await lake.stop()
            await task
    finally:
        await store.close()
    stats = lake.stats()["compaction"]
    assert stats["outputs"] >= 3 and stats["failures"] == 0
