"""The bridge over real stores: every position exactly once, by hour, resumed from the checkpoint; bounded lag;
one writer per partition (lease and flock); holds keep retention off what is not exported."""

from __future__ import annotations

import asyncio
import json
import random
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.pipeline.lake.support import T0, assert_once, messages, read_lake, tmp_files
from tests.waiting import until
from tidewire.pipeline.lake.bridge import LakeBridge
from tidewire.store.base import LogSlice, Message
from tidewire.store.embedded.engine import EmbeddedStore

ROOT = Path(__file__).resolve().parents[3]


async def append(store: EmbeddedStore, msgs: list[Message], batch: int = 25) -> None:
    for i in range(0, len(msgs), batch):  # a segment rolls over between batches: many small segments
        await store.append(msgs[i:i + batch])


def bridge(store: EmbeddedStore, lake: Path, **kw: object) -> LakeBridge:
    opts: dict[str, object] = {"owner": "test", "flush_rows": 700, "read_batch": 250, "flush_seconds": 0.3,
                               "idle_s": 0.02, "lease_ttl_ms": 600}
    opts.update(kw)
    return LakeBridge(store, lake, **opts)  # type: ignore[arg-type]


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[EmbeddedStore]:
    s = EmbeddedStore(tmp_path / "data", fsync="never", segment_bytes=16 << 10)
    await s.open()
    yield s
    await s.close()


async def test_exports_every_position_once_by_hour_and_resumes(store: EmbeddedStore, tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    await store.append(messages(3000))
    b = bridge(store, lake)
    await asyncio.wait_for(b.run(once=True), 20)
    assert_once(lake, 3000)
    table = read_lake(lake)
    got = {(d, h) for d, h in zip(table.column("dt").to_pylist(), table.column("hour").to_pylist(), strict=True)}
    assert got == {("2023-11-14", 23), ("2023-11-15", 0), ("2023-11-15", 1), ("2023-11-15", 2)}
    rows = {r["position"]: r for r in table.to_pylist()}
    for pos in (1, 2, 6, 3000):
        row, i = rows[pos], pos - 1
        assert row["received_at"].timestamp() * 1000 == T0 + i * 3600
        assert row["topic"] == f"sensors/d{i % 7}/t" and row["client_id"] == f"d{i % 7}"
        assert row["protocol"] == ("amqp" if i % 5 == 0 else "mqtt")
        assert dict(row["json_numbers"]) == {"temperature": float(i % 100), "n.i": float(i)}
        assert (row["content_type"] == "application/json") == (i % 3 == 0)
    stats = b.stats()
    assert stats["rows"] == 3000 and stats["partitions"][0]["position"] == 3000 and stats["lag_ms"] == 0
    assert await store.log_holds(0) == {"lake": 3000}
    await store.append(messages(500, start=3000))
    await asyncio.wait_for(bridge(store, lake).run(once=True), 20)  # a new bridge: from the checkpoint
    assert_once(lake, 3500)
    assert tmp_files(lake) == []


async def test_tails_with_bounded_lag_and_stop_commits(store: EmbeddedStore, tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    b = bridge(store, lake, flush_rows=100_000, flush_seconds=0.3)
    task = asyncio.create_task(b.run())
    await store.append(messages(5))
    # the file is renamed into place before the checkpoint is committed: wait for both
    await until(lambda: ((lake / "messages").exists() and read_lake(lake).num_rows >= 5
                         and b.stats()["partitions"][0]["position"] >= 5),
                timeout=6, what="a quiet log exported within flush_seconds (+ slack for a busy CI)", interval=0.05)
    assert b.stats()["partitions"][0]["position"] == 5
    b.flush_seconds = 60.0  # from here on only stop() flushes
    await store.append(messages(7, start=5))
    # read, not flushed yet (flush_rows is large, flush_seconds not over)
    await until(lambda: b.stats()["partitions"][0]["buffered"] == 7, what="the 7 new records read and buffered")
    await b.stop()
    await task
    assert_once(lake, 12)
    assert await store.log_holds(0) == {"lake": 12}


async def test_two_bridges_on_one_lake_never_both_write(store: EmbeddedStore, tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    # The same owner name: the lease lets both in, the partition's flock keeps one out.
    a, b = bridge(store, lake, flush_rows=50), bridge(store, lake, flush_rows=50)
    tasks = [asyncio.create_task(a.run()), asyncio.create_task(b.run())]
    for i in range(20):
        await store.append(messages(50, start=i * 50))
        await asyncio.sleep(0.01)  # pacing: the appends, and both bridges' attempts, spread over 20 flushes

    def position(x: LakeBridge) -> int:
        part = x.stats()["partitions"].get(0)
        return int(part["position"]) if part is not None else 0

    await until(lambda: max(position(a), position(b)) >= 1000, what="all 1000 records exported by one bridge")
    owned = [a.stats()["owned"], b.stats()["owned"]]
    await a.stop()
    await b.stop()
    await asyncio.gather(*tasks)
    assert sorted(owned) == [[], [0]]
    assert_once(lake, 1000)


async def test_a_bridge_that_loses_its_lease_stops_without_committing(store: EmbeddedStore, tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    b = bridge(store, lake, flush_rows=100_000, flush_seconds=60)
    task = asyncio.create_task(b.run())
    await store.append(messages(10))
    await until(lambda: b.stats()["partitions"][0]["buffered"] >= 10, what="10 records buffered")
    await store.release("lake/p0", "test")
    assert await store.lease("lake/p0", "other", 60_000)  # another bridge took the partition over
    await until(lambda: not b.stats()["owned"], what="the bridge giving the partition up")
    await b.stop()
    await task
    assert not (lake / "messages").exists()  # the buffered records were not published
    assert b.stats()["partitions"][0]["position"] == 0


async def test_hold_keeps_retention_off_unexported_records(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    store = EmbeddedStore(tmp_path / "data", fsync="never", segment_bytes=8 << 10, retention_bytes=1)
    await store.open()
    try:
        await append(store, messages(500))
        await bridge(store, lake).run(once=True)  # exported up to 500: the hold moves there
        await append(store, messages(500, start=500))
        assert await store.enforce_retention() > 0  # segments wholly at or below 500 go
        assert (await store.read_log(0, 0, 1)).trimmed <= 500
        b = bridge(store, lake)
        await b.run(once=True)
        assert_once(lake, 1000)
        assert b.stats()["lost"] == 0
        # Without the hold retention takes records the lake never saw: counted as lost, never duplicated.
        await append(store, messages(500, start=1000))
        await store.hold_log(0, "lake", -1)
        await store.enforce_retention()
        trimmed = (await store.read_log(0, 0, 1)).trimmed
        assert trimmed > 1000
        b = bridge(store, lake)
        await b.run(once=True)
        assert b.stats()["lost"] == trimmed - 1000
        positions = read_lake(lake).column("position").to_pylist()
        assert sorted(positions) == list(range(1, 1001)) + list(range(trimmed + 1, 1501))
    finally:
        await store.close()


@pytest.mark.slow  # several seconds (a real node, a build or a long model run): make test-slow
async def test_kill_9_mid_export_then_once(tmp_path: Path) -> None:
    """`python -m tidewire.pipeline.lake` killed by SIGKILL again and again while a writer appends, then `--once`: every
    position exactly once in the lake."""
    data, lake = tmp_path / "data", tmp_path / "lake"
    store = EmbeddedStore(data, fsync="never", segment_bytes=64 << 10)
    await store.open()
    args = [sys.executable, "-m", "tidewire.pipeline.lake", "--data-dir", str(data), "--lake", str(lake),
            "--owner", "k", "--flush-rows", "40", "--flush-seconds", "0.05", "--read-batch", "30", "--idle-s", "0.01",
            "--lease-ttl-ms", "3000", "--log-level", "WARNING", "--no-compact"]  # (compaction: test_compaction_kill)
    checkpoint = lake / "_tidewire" / "checkpoint-p00.json"
    written = 0
    writing = True

    async def writer() -> None:
        nonlocal written
        while writing:
            await store.append(messages(20, start=written))
            written += 20
            await asyncio.sleep(0.005)  # pacing: a writer appending all through the kills

    def exported() -> int:
        try:
            return int(json.loads(checkpoint.read_text())["position"])
        except FileNotFoundError:
            return 0

    rnd = random.Random(9)
    wtask = asyncio.create_task(writer())
    try:
        for _ in range(6):
            proc = await asyncio.create_subprocess_exec(*args, cwd=ROOT, stdout=asyncio.subprocess.DEVNULL)
            try:
                before = exported()

                def exporting_again(before: int = before, proc: asyncio.subprocess.Process = proc) -> bool:
                    assert proc.returncode is None, f"the bridge exited with {proc.returncode}"
                    return exported() > before

                await until(exporting_again, timeout=15, what="the restarted bridge exporting again")
                await asyncio.sleep(rnd.uniform(0.02, 0.3))  # the behaviour under test: a kill at a random point
            finally:
                proc.kill()
                await proc.wait()
            positions = read_lake(lake).column("position").to_pylist()  # no partial file is visible
            assert len(set(positions)) == len(positions)
    finally:
        writing = False
        await wtask
    assert exported() < written  # the kills left something to do
    proc = await asyncio.create_subprocess_exec(*args, "--once", cwd=ROOT, stdout=asyncio.subprocess.PIPE)
    out, _ = await asyncio.wait_for(proc.communicate(), 30)
    await store.close()
    assert proc.returncode == 0
    assert json.loads(out)["messages"]["partitions"]["0"]["position"] == written
    assert_once(lake, written)
    assert tmp_files(lake) == [] and not (lake / "_tidewire" / "pending-p00.json").exists()


class _CountingSource:
    """The store, counting read_log calls made while the event loop ran nothing else in between."""

    def __init__(self, store: EmbeddedStore) -> None:
        self.store = store
        self.streak = 0
        self.longest = 0
        self.reads = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.store, name)

    async def read_log(self, partition: int, after_seq: int, limit: int) -> LogSlice:
        self.reads += 1
        self.streak += 1
        self.longest = max(self.longest, self.streak)
        return await self.store.read_log(partition, after_seq, limit)


@pytest.mark.slow  # seconds long: `make test-slow` keeps `make test` under its 10 minutes
async def test_the_loop_runs_between_reads(store: EmbeddedStore, tmp_path: Path) -> None:
    """The embedded store answers without suspending: the bridge must still let the loop (the gateway) run
    after each read batch, not only at flushes."""
    await append(store, messages(6000), batch=1000)
    source = _CountingSource(store)
    running = True

    async def other_work() -> None:
        while running:
            source.streak = 0
            await asyncio.sleep(0)  # one turn of the loop: the work the bridge must let run

    task = asyncio.create_task(other_work())
    await bridge(source, tmp_path / "lake", flush_rows=6000, read_batch=100).run(once=True)  # type: ignore[arg-type]
    running = False
    await task
    assert source.reads >= 60 and source.longest <= 2
    assert_once(tmp_path / "lake", 6000)
