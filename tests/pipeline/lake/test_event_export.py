"""events.py: the gateway's event buffer exported as events files (at most once)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.pipeline.lake.support import published_files, read_lake, tmp_files
from tests.waiting import until
from tidewire.gateway.core.event_buffer import EventBuffer
from tidewire.pipeline.lake.event_export import EventExporter, node_file_prefix

H = 3_600_000
T0 = 1_700_000_000_000 // H * H


async def test_exporter_writes_by_hour_and_flushes_on_stop(tmp_path: Path) -> None:
    buf = EventBuffer(capacity=100)
    exporter = EventExporter(buf, tmp_path, "node/1", flush_rows=1000, flush_seconds=0.2, poll_s=0.05)
    task = asyncio.create_task(exporter.run())
    buf.add("connected", T0 - 5, "d1", detail="alice")
    buf.add("delivered", T0 + 10, "d2", "amqp", "a/b", 7, 1, True)
    await until(lambda: exporter.files, what="a flush on the timer (0.2 s), well before stop")
    assert exporter.rows == 2 and exporter.files == 2  # two hours, two files
    buf.add("acked", T0 + 20, "d2", "amqp", "a/b", 7, 1)
    await exporter.stop()
    await task
    table = read_lake(tmp_path, "events").sort_by("time")
    assert table.column("event").to_pylist() == ["connected", "delivered", "acked"]
    assert table.column("node").to_pylist() == ["node/1"] * 3
    assert table.column("hour").to_pylist() == [21, 22, 22]
    names = [p.name for p in published_files(tmp_path, "events")]
    assert names[0] == f"node_1-{T0 - 5}-1.parquet" and tmp_files(tmp_path) == []
    assert exporter.stats()["rows"] == 3


async def test_full_buffer_drops_are_reported_and_names_never_collide(tmp_path: Path) -> None:
    buf = EventBuffer(capacity=2)
    for i in range(5):
        buf.add("connected", T0 + i, f"d{i}")
    exporter = EventExporter(buf, tmp_path, "n", flush_seconds=60)
    assert await exporter.flush() == 2
    assert exporter.stats()["dropped"] == 3
    buf.add("connected", T0, "again")  # a restarted exporter, same first time: a new name, not a replacement
    restarted = EventExporter(buf, tmp_path, "n", flush_seconds=60)
    assert await restarted.flush() == 1
    assert read_lake(tmp_path, "events").num_rows == 3
    assert [p.name for p in published_files(tmp_path, "events")] == [f"n-{T0}-1.parquet", f"n-{T0}-2.parquet"]


async def test_a_failed_write_is_counted_as_lost(tmp_path: Path) -> None:
    blocked = tmp_path / "lake"
    blocked.write_text("a file where the lake's directory should be")
    buf = EventBuffer(capacity=10)
    for i in range(4):
        buf.add("connected", T0 + i, f"d{i}")
    exporter = EventExporter(buf, blocked, "n", flush_seconds=60)
    assert await exporter.flush() == 0
    assert buf.losses() == {"buffer_full": 0, "write_failed": 4} and exporter.stats()["failed"] == 4
    buf.add("connected", T0, "d", qos="not a number")  # type: ignore[arg-type]  # its conversion fails
    assert await exporter.flush() == 0 and buf.losses()["write_failed"] == 5


async def test_start_removes_only_its_own_tmp_files(tmp_path: Path) -> None:
    d = tmp_path / "events" / "dt=2023-11-14" / "hour=22"
    d.mkdir(parents=True)
    mine, other = d / f".n-{T0}-3.parquet.tmp", d / f".n-1-{T0}-3.parquet.tmp"  # node "n" vs node "n-1"
    mine.write_bytes(b"partial")
    other.write_bytes(b"partial")
    buf = EventBuffer(capacity=10)
    buf.add("connected", T0, "d")
    await EventExporter(buf, tmp_path, "n").flush()
    assert not mine.exists() and other.exists()


def test_node_file_prefix() -> None:
    assert node_file_prefix("a/b c") == "a_b_c"
    assert node_file_prefix(".hidden") == "n.hidden" and node_file_prefix("_x") == "n_x"
    assert node_file_prefix("") == "node"
