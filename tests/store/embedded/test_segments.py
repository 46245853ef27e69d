"""The EmbeddedStore commit log: append/read, rollover, recovery, torn tails, group commit, retention."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path

import pytest

import tidewire.store.embedded.engine as embedded_mod
from tidewire.store.base import Message, SessionRecord, Store
from tidewire.store.embedded.engine import EmbeddedStore


def msg(i: int, *queues: str, size: int = 100) -> Message:
    return Message(
        topic=f"t/{i}", payload=(b"%08d" % i) * (size // 8) + b"x" * (size % 8), qos=1,
        properties=b"\x01\x02", publisher=f"pub{i % 3}", queues=queues,
    )


def segment_files(data: Path) -> list[Path]:
    return sorted((data / "log").glob("*.log"))


async def reopen(path: Path, **kw: object) -> EmbeddedStore:
    s = EmbeddedStore(path, **kw)  # type: ignore[arg-type]
    await s.open()
    return s


def test_embedded_store_satisfies_protocol(tmp_path: Path) -> None:
    s: Store = EmbeddedStore(tmp_path)  # mypy checks the signatures against the protocol
    assert s.last_seq() == 0


async def test_append_assigns_seqs_and_reads_per_queue(store: EmbeddedStore) -> None:
    batch = [msg(i, "all", "even" if i % 2 == 0 else "odd") for i in range(1, 201)]
    await store.append(batch[:50])
    await store.append(batch[50:])
    assert [m.seq for m in batch] == list(range(1, 201))
    assert store.last_seq() == 200
    assert [m.seq for m in (await store.read("all", 0, 1000)).messages] == list(range(1, 201))
    assert [m.seq for m in (await store.read("even", 10, 5)).messages] == [12, 14, 16, 18, 20]
    assert [m.seq for m in (await store.read("odd", 195, 100)).messages] == [197, 199]
    assert (await store.read("odd", 199, 10)).messages == []
    assert (await store.read("nope", 0, 10)).messages == []
    assert (await store.read("all", 0, 0)).messages == []
    # the hot tail comes back as the very objects appended
    got = (await store.read("all", 150, 10)).messages
    assert all(a is b for a, b in zip(got, batch[150:160], strict=True))


async def test_rollover_and_disk_reads_match(tmp_path: Path) -> None:
    # ring of 10: almost everything is read from disk through pread
    s = await reopen(tmp_path, fsync="never", segment_bytes=2048, recent_messages=10)
    originals = []
    for b in range(20):
        batch = [msg(b * 10 + i, "q", f"q{i % 2}") for i in range(10)]
        await s.append(batch)
        originals += [(m.seq, m.topic, m.payload, m.publisher, m.properties) for m in batch]
    assert s.stats()["segments"] > 5
    got = (await s.read("q", 0, 1000)).messages
    assert [(m.seq, m.topic, m.payload, m.publisher, m.properties) for m in got] == originals
    assert [m.seq for m in (await s.read("q1", 57, 4)).messages] == [58, 60, 62, 64]
    assert all(m.queues == ("q", f"q{(m.seq - 1) % 2}") for m in got)
    await s.close()


async def test_recovery_after_reopen_rebuilds_indexes(tmp_path: Path) -> None:
    s = await reopen(tmp_path, segment_bytes=4096)
    for b in range(10):
        await s.append([msg(b * 10 + i, "all", f"k{i % 3}") for i in range(10)])
    await s.close()
    s2 = await reopen(tmp_path, segment_bytes=4096)
    assert s2.last_seq() == 100
    assert [m.seq for m in (await s2.read("all", 0, 1000)).messages] == list(range(1, 101))
    k1 = [i for i in range(1, 101) if (i - 1) % 10 % 3 == 1]
    assert [m.seq for m in (await s2.read("k1", 0, 1000)).messages] == k1
    m = (await s2.read("all", 41, 1)).messages[0]
    assert (m.topic, m.payload[:8], m.qos, m.publisher) == ("t/41", b"%08d" % 41, 1, "pub2")
    await s2.append([msg(0, "all")])
    assert s2.last_seq() == 101
    await s2.close()
    s3 = await reopen(tmp_path, segment_bytes=4096)
    assert [m.seq for m in (await s3.read("all", 99, 10)).messages] == [100, 101]
    await s3.close()


async def _write_then_damage(tmp_path: Path, damage: str) -> Path:
    s = await reopen(tmp_path, segment_bytes=1 << 20)
    for b in range(5):
        await s.append([msg(b * 10 + i, "q") for i in range(10)])
    await s.close()
    seg = segment_files(tmp_path)[-1]
    data = seg.read_bytes()
    if damage == "truncate":
        seg.write_bytes(data[:-37])  # mid-record
    elif damage == "garbage":
        seg.write_bytes(data + os.urandom(5) + b"\xff\x00\x00\x00" + os.urandom(50))
    elif damage == "crc":
        # find the last record by walking the frames, then flip a crc byte
        pos, last = 0, 0
        while pos < len(data):
            last = pos
            pos += 8 + int.from_bytes(data[pos : pos + 4], "little")
        flipped = bytearray(data)
        flipped[last + 4] ^= 0xFF
        seg.write_bytes(bytes(flipped))
    return seg


@pytest.mark.parametrize("damage,kept", [("truncate", 49), ("garbage", 50), ("crc", 49)])
async def test_torn_tail_is_cut(
    tmp_path: Path, damage: str, kept: int, caplog: pytest.LogCaptureFixture
) -> None:
    seg = await _write_then_damage(tmp_path, damage)
    with caplog.at_level(logging.WARNING, logger="tidewire.store"):
        s = await reopen(tmp_path)
    assert "cutting" in caplog.text
    got = (await s.read("q", 0, 1000)).messages
    assert [m.seq for m in got] == list(range(1, kept + 1))
    assert got[-1].payload[:8] == b"%08d" % (kept - 1)
    assert s.last_seq() == kept
    # the file was cut: appends after it are readable after another reopen
    await s.append([msg(999, "q")])
    await s.close()
    size_after = seg.stat().st_size
    s2 = await reopen(tmp_path)
    assert [m.seq for m in (await s2.read("q", kept - 1, 10)).messages] == [kept, kept + 1]
    assert s2.stats()["bytes"] == size_after
    await s2.close()


async def test_seq_never_reused_when_offsets_are_past_the_log(tmp_path: Path) -> None:
    s = await reopen(tmp_path)
    await s.append([msg(i, "q") for i in range(5)])
    await s.put_session(SessionRecord("c"))
    # a subscriber saw seqs the log lost (written, unsynced, crash)
    await s.set_offsets({"c": (7, 9, 0)})
    await s.close()
    s2 = await reopen(tmp_path)
    assert s2.last_seq() == 9
    m = msg(0, "q")
    await s2.append([m])
    assert m.seq == 10
    await s2.close()
    s3 = await reopen(tmp_path)
    assert [x.seq for x in (await s3.read("q", 0, 100)).messages] == [1, 2, 3, 4, 5, 10]
    assert s3.last_seq() == 10
    await s3.close()


async def test_group_commit_coalesces_fsyncs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = embedded_mod._datasync

    def counting(fd: int) -> None:
        calls.append(fd)
        time.sleep(0.002)  # a real disk takes a while; make the window visible on tmpfs too
        real(fd)

    monkeypatch.setattr(embedded_mod, "_datasync", counting)
    s = await reopen(tmp_path)

    async def one(i: int) -> int:
        m = msg(i, "q")
        await s.append([m])
        await s.sync()
        assert s._synced_gen >= 1
        return m.seq

    seqs = await asyncio.gather(*(one(i) for i in range(100)))
    assert sorted(seqs) == list(range(1, 101))
    assert 1 <= s.fsyncs <= 5, s.fsyncs
    assert len(calls) <= 10
    # nothing new written: sync returns without another fsync
    before = s.fsyncs
    await s.sync()
    assert s.fsyncs == before
    await s.close()


async def test_sync_policies(tmp_path: Path) -> None:
    never = await reopen(tmp_path / "n", fsync="never")
    await never.append([msg(1, "q")])
    await never.sync()
    assert never.fsyncs == 0
    await never.close()
    interval = await reopen(tmp_path / "i", fsync="interval", fsync_interval_ms=10)
    await interval.append([msg(1, "q")])
    t0 = time.monotonic()
    await asyncio.gather(*(interval.sync() for _ in range(20)))
    assert interval.fsyncs == 1
    assert time.monotonic() - t0 < 1
    await interval.close()


async def test_retention_by_bytes_deletes_whole_segments(tmp_path: Path) -> None:
    s = await reopen(tmp_path, fsync="never", segment_bytes=2048, retention_bytes=6000, recent_messages=0)
    for b in range(30):
        await s.append([msg(b * 5 + i, "q", f"only{b}") for i in range(5)])
    before = s.stats()
    deleted = await s.enforce_retention()
    after = s.stats()
    assert deleted > 0
    assert after["segments"] == before["segments"] - deleted
    assert after["bytes"] <= 6000 or after["segments"] == 1
    assert len(segment_files(tmp_path)) == after["segments"]
    got = (await s.read("q", 0, 1000)).messages
    assert got and got[-1].seq == 150
    assert [m.seq for m in got] == list(range(got[0].seq, 151))  # the survivors are a contiguous tail
    assert after["queues"] < before["queues"]  # queues whose messages all went were dropped
    assert (await s.read("only0", 0, 10)).messages == []
    await s.append([msg(0, "q")])
    await s.close()
    s2 = await reopen(tmp_path, segment_bytes=2048)
    assert [m.seq for m in (await s2.read("q", 0, 1000)).messages][-2:] == [150, 151]
    await s2.close()


async def test_retention_by_age_keeps_recent_and_active(tmp_path: Path) -> None:
    s = await reopen(tmp_path, fsync="never", segment_bytes=1024, retention_seconds=60)
    old = int(time.time() * 1000) - 3_600_000
    for b in range(6):
        batch = [msg(b * 5 + i, "q") for i in range(5)]
        for m in batch:
            m.timestamp_ms = old
        await s.append(batch)
    await s.append([msg(100 + i, "q") for i in range(5)])  # recent, last segment
    segments = s.stats()["segments"]
    assert segments >= 3
    assert await s.enforce_retention() == segments - 1
    assert [m.seq for m in (await s.read("q", 0, 100)).messages] == [31, 32, 33, 34, 35]
    assert await s.enforce_retention() == 0  # the active segment is never deleted
    assert s.stats()["segments"] == 1
    await s.close()
