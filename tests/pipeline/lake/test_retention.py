"""Lake retention: whole days older than the age go (atomically for readers), the bridge exports nothing older,
and its hold on the log moves past what retention would have removed."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tests.pipeline.lake.support import T0, messages, read_lake
from tidewire.pipeline.lake import retention
from tidewire.pipeline.lake.bridge import LakeBridge
from tidewire.store.embedded.engine import EmbeddedStore

DAY = 86_400_000


def day_file(lake: Path, table: str, day: str, hour: str | None = "05") -> Path:
    d = lake / table / f"dt={day}" / (f"hour={hour}" if hour else "batch=1")
    d.mkdir(parents=True, exist_ok=True)
    f = d / "x.parquet"
    pq.write_table(pa.table({"v": [1]}), f)
    return f


def test_whole_days_past_the_age_go_from_every_table(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    for day in ("2024-04-28", "2024-04-29", "2024-04-30"):
        day_file(lake, "messages", day)
        day_file(lake, "events", day)
        day_file(lake, "aggregates/device_minute", day, None)
    (lake / "messages" / ".dt=2024-04-01.expired" / "hour=01").mkdir(parents=True)  # a removal a crash cut short
    (lake / "_tidewire").mkdir()
    now = 1_714_557_600_000  # 2024-05-01T10:00Z; 1 day: 2024-04-30 ends after the cutoff (04-30T10:00)
    assert retention.remove_expired(lake, 0, now).removed == []  # 0: keep forever
    res = retention.remove_expired(lake, 1, now)
    assert sorted(res.removed) == sorted(f"{t}/dt={d}" for t in ("messages", "events", "aggregates/device_minute")
                                         for d in ("2024-04-28", "2024-04-29"))
    for table in ("messages", "events", "aggregates/device_minute"):
        assert sorted(p.name for p in (lake / table).iterdir()) == ["dt=2024-04-30"]
    assert (lake / "_tidewire").is_dir()
    assert retention.main(["--lake", str(lake), "--days", "1"]) == 0


async def test_the_bridge_skips_expired_records_and_its_hold_moves_past_them(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    store = EmbeddedStore(tmp_path / "data", fsync="never", segment_bytes=16 << 10)
    await store.open()
    try:
        await store.append(messages(1000))  # one every 3.6 s from T0 (2023-11-14 23:59)
        old = day_file(lake, "messages", "2023-11-13")
        now = T0 + 1_800_000 + DAY  # cutoff T0 + 30 min: records 1..500 are past a 1-day retention
        b = LakeBridge(store, lake, owner="t", flush_rows=300, read_batch=250, flush_seconds=0.2, idle_s=0.02,
                       lease_ttl_ms=600, retention_days=1, wall_ms=lambda: now)
        await asyncio.wait_for(b.run(once=True), 20)
        positions = sorted(read_lake(lake).column("position").to_pylist())
        assert positions == list(range(501, 1001))  # none older than the cutoff, none lost, none twice
        stats = b.stats()
        assert (stats["expired"], stats["lost"], stats["partitions"][0]["position"]) == (500, 0, 1000)
        assert await store.log_holds(0) == {"lake": 1000}  # the store keeps nothing for days the lake dropped
        assert not old.exists() and not (lake / "messages" / "dt=2023-11-14").exists()
        assert (lake / "messages" / "dt=2023-11-15").is_dir()
    finally:
        await store.close()
