"""writer.py: atomic files, the flush protocol's crash points (each step called on its own) and roll-forward."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.pipeline.lake.support import published_files, read_lake, record, tmp_files
from tidewire.pipeline.lake.rows import messages_table
from tidewire.pipeline.lake.writer import MessagesWriter, PartitionLock, hour_dir, message_file_name

H = 3_600_000
T0 = 1_700_000_000_000 // H * H  # 2023-11-14 22:00 UTC


def _table(first: int, last: int, partition: int = 0, hours: int = 2) -> pa.Table:
    # positions first..last spread over `hours` hours
    n = last - first + 1
    return messages_table([record(first + i, partition=partition, received_ms=T0 + (i * hours // n) * H + i,
                                  payload=b'{"v": %d}' % (first + i)) for i in range(n)])


def _positions(lake: Path) -> list[int]:
    return sorted(read_lake(lake).column("position").to_pylist())


def test_flush_splits_by_hour_atomically(tmp_path: Path) -> None:
    w = MessagesWriter(tmp_path, 3)
    assert w.recover().position == 0
    cp = w.flush(_table(1, 100, partition=3), 100)
    assert (cp.position, cp.rows, cp.files, cp.flushes) == (100, 100, 2, 1)
    files = published_files(tmp_path)
    assert [f.parent.relative_to(tmp_path / "messages").as_posix() for f in files] == [
        "dt=2023-11-14/hour=22", "dt=2023-11-14/hour=23"]
    assert files[0].name == message_file_name(3, 1, 50) + ".parquet"
    assert files[1].name == message_file_name(3, 51, 100) + ".parquet"
    assert pq.read_metadata(files[0]).metadata[b"tidewire.lake.version"] == b"1"
    assert pq.read_metadata(files[0]).row_group(0).column(0).compression == "ZSTD"
    table = read_lake(tmp_path)
    assert sorted(table.column("position").to_pylist()) == list(range(1, 101))
    assert set(table.column("hour").to_pylist()) == {22, 23}
    assert set(table.column("dt").to_pylist()) == {"2023-11-14"}
    assert tmp_files(tmp_path) == [] and not w.manifest_path.exists()
    saved = json.loads(w.checkpoint_path.read_text())
    assert saved["position"] == 100 and saved["files"] == 2
    assert MessagesWriter(tmp_path, 3).recover() == cp


def test_hour_dir() -> None:
    assert hour_dir(0) == "dt=1970-01-01/hour=00"
    assert hour_dir(T0 // H + 3) == "dt=2023-11-15/hour=01"


def test_crash_before_manifest_loses_only_unpublished_work(tmp_path: Path) -> None:
    w = MessagesWriter(tmp_path, 0)
    w.recover()
    w.flush(_table(1, 10), 10)
    w.stage(_table(11, 20), 20)  # crash here: tmp files written, no manifest
    assert len(tmp_files(tmp_path)) == 2
    assert _positions(tmp_path) == list(range(1, 11))  # readers never see them
    w2 = MessagesWriter(tmp_path, 0)
    assert w2.recover().position == 10
    assert tmp_files(tmp_path) == []
    w2.flush(_table(11, 20), 20)  # re-read from the checkpoint and exported again
    assert _positions(tmp_path) == list(range(1, 21))


@pytest.mark.parametrize("renamed", [0, 1, 2])
def test_crash_after_manifest_rolls_forward(tmp_path: Path, renamed: int) -> None:
    w = MessagesWriter(tmp_path, 0)
    w.recover()
    w.flush(_table(1, 10), 10)
    pending = w.stage(_table(11, 20), 20, lost=3)
    w.write_manifest(pending)
    for tmp, final in pending.renames[:renamed]:  # crash in the middle of the renames
        (tmp_path / tmp).rename(tmp_path / final)
    w2 = MessagesWriter(tmp_path, 0)
    cp = w2.recover()
    assert (cp.position, cp.lost, cp.rows) == (20, 3, 20)
    assert not w2.manifest_path.exists() and tmp_files(tmp_path) == []
    assert _positions(tmp_path) == list(range(1, 21))


def test_crash_after_publish_or_checkpoint_is_idempotent(tmp_path: Path) -> None:
    w = MessagesWriter(tmp_path, 0)
    w.recover()
    pending = w.stage(_table(1, 10), 10)
    w.write_manifest(pending)
    w.publish(pending)  # crash before the checkpoint
    assert MessagesWriter(tmp_path, 0).recover().position == 10
    pending = w.stage(_table(11, 20), 20)
    w.write_manifest(pending)
    w.publish(pending)
    w.commit(pending)
    w.write_manifest(pending)  # as if the crash came between the checkpoint and the manifest's removal
    assert MessagesWriter(tmp_path, 0).recover().position == 20
    assert _positions(tmp_path) == list(range(1, 21))


def test_recover_leaves_other_partitions_alone(tmp_path: Path) -> None:
    w0, w1, w10 = MessagesWriter(tmp_path, 0), MessagesWriter(tmp_path, 1), MessagesWriter(tmp_path, 10)
    for w in (w0, w1, w10):
        w.recover()
    w1.stage(_table(1, 10, partition=1, hours=1), 10)  # partition 1 is mid-flush in another bridge
    w10.stage(_table(1, 10, partition=10, hours=1), 10)
    w0.stage(_table(1, 10, partition=0, hours=1), 10)
    MessagesWriter(tmp_path, 0).recover()
    names = [p.name for p in tmp_files(tmp_path)]
    assert names == ["." + message_file_name(1, 1, 10) + ".parquet.tmp",
                     "." + message_file_name(10, 1, 10) + ".parquet.tmp"]


def test_position_only_flush_writes_no_file(tmp_path: Path) -> None:
    w = MessagesWriter(tmp_path, 0)
    w.recover()
    cp = w.flush(_table(1, 0), 50, lost=50)  # retention took 1..50 before they were read
    assert (cp.position, cp.lost, cp.files) == (50, 50, 0)
    assert published_files(tmp_path) == []


def test_partition_lock_is_exclusive(tmp_path: Path) -> None:
    a, b = PartitionLock(tmp_path, 0), PartitionLock(tmp_path, 0)
    assert a.acquire() and a.acquire()
    assert not b.acquire()
    other = PartitionLock(tmp_path, 1)
    assert other.acquire()
    other.release()
    a.release()
    assert b.acquire()
    b.release()
