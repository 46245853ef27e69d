"""Index files of sealed segments: the format against a model, reads across mapped and in-memory indexes,
restarts that scan only what no index covers, damaged or stale files rebuilt, retention, and memory."""

from __future__ import annotations

import logging
import random
import shutil
import tempfile
from array import array
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tidewire.store.embedded.segment_index as segment_index
from tests.waiting import until
from tidewire.store.base import Message
from tidewire.store.embedded.engine import EmbeddedStore
from tidewire.store.embedded.segment_index import U32_MAX, BadIndex, IndexJob, SegmentIndex, index_path, write_index
from tidewire.store.embedded.segments import MAX_SEGMENT_BYTES, CommitLog
from tidewire.store.embedded.tail import EmbeddedLogTail
from tidewire.store.records import iter_frames, peek_message

Model = dict[str, list[int]]


def msg(i: int, *queues: str) -> Message:
    return Message(f"t/{i}", b"%08d" % i * 4, qos=1, queues=queues)


def log_files(data: Path) -> list[Path]:
    return sorted((data / "log").glob("*.log"))


def index_files(data: Path) -> list[Path]:
    return sorted((data / "log").glob("*.idx"))


def scan_model(data: Path) -> Model:
    """Queue -> seqs, read straight from the segment files (what a full scan indexes)."""
    model: Model = {}
    for path in log_files(data):
        buf = path.read_bytes()
        for _, body_start, _ in iter_frames(buf):
            seq, _, queues = peek_message(buf, body_start)
            for q in queues:
                model.setdefault(q, []).append(seq)
    return model


def expected(model: Model, queue: str, after: int, limit: int) -> list[int]:
    return [s for s in model.get(queue, []) if s > after][:limit]


async def read_seqs(s: EmbeddedStore, queue: str, after: int = 0, limit: int = 100_000) -> list[int]:
    return [m.seq for m in (await s.read(queue, after, limit)).messages]


async def indexed(s: EmbeddedStore) -> None:
    """Wait until every sealed segment's index file is written (the writer runs in a thread)."""
    await until(lambda: s.stats()["index_pending"] == 0, what="every sealed segment's index file written")


async def fill(s: EmbeddedStore, rng: random.Random, batches: int, pool: int) -> None:
    for b in range(batches):
        await s.append([msg(b * 10 + i, *rng.sample([f"q{k}" for k in range(pool)], rng.randint(0, 3)))
                        for i in range(rng.randint(1, 10))])


# --- the file format -------------------------------------------------------------------------------------


def _job(tmp: Path, first: int, positions: list[int], queues: Model) -> IndexJob:
    log = tmp / f"{first:020d}.log"
    size = (positions[-1] + 100) if positions else 0
    with open(log, "wb") as f:
        f.truncate(size)
    arrays = {q: array("I", [x - first for x in seqs]) for q, seqs in queues.items()}
    return IndexJob(None, log, first, len(positions), size, 1_700_000_000_123, array("q", positions), arrays)


@st.composite
def segment_tables(draw: st.DrawFn) -> tuple[int, list[int], Model]:
    first = draw(st.integers(1, 2**40))
    n = draw(st.integers(0, 60))
    gaps = draw(st.lists(st.integers(20, 5000), min_size=n, max_size=n))
    wide = draw(st.booleans())
    positions, pos = [], (U32_MAX - 1000 if wide and n else 0)
    for g in gaps:
        positions.append(pos)
        pos += g
    names = draw(st.lists(st.text(min_size=1, max_size=12).filter(lambda t: "\x00" not in t), max_size=12,
                          unique=True))
    queues: Model = {}
    for i in range(n):
        for q in draw(st.lists(st.sampled_from(names), max_size=3, unique=True)) if names else []:
            queues.setdefault(q, []).append(first + i)
    return first, positions, queues


@pytest.mark.slow  # 60 hypothesis tables, each written and read back through files
@settings(max_examples=60, deadline=None)
@given(segment_tables(), st.data())
def test_index_round_trip(table: tuple[int, list[int], Model], data: st.DataObject) -> None:
    first, positions, queues = table
    with tempfile.TemporaryDirectory() as d:
        job = _job(Path(d), first, positions, queues)
        records = data.draw(st.integers(0, len(positions)))
        if records < len(positions):
            # a checkpoint: the arrays hold more records than the job covers (appended since it was made)
            job = replace(job, records=records, segment_size=positions[records], checkpoint=True)
            positions = positions[:records]
            queues = {q: [x for x in seqs if x < first + records] for q, seqs in queues.items()}
            queues = {q: seqs for q, seqs in queues.items() if seqs}
        assert write_index(job)
        idx = SegmentIndex(index_path(job.log_path), first, job.segment_size)
        try:
            assert idx.verify()
            assert (idx.records, idx.last_ts, idx.queue_count) == (len(positions), job.last_ts, len(queues))
            assert list(idx.positions) == positions
            assert idx.queues() == queues
            loaded_positions, loaded = idx.load()
            assert list(loaded_positions) == positions
            assert {q: [first + d for d in a] for q, a in loaded.items()} == queues
            for _ in range(10):
                q = data.draw(st.sampled_from([*queues, "absent"]))
                after = data.draw(st.integers(0, first + len(positions) + 2))
                limit = data.draw(st.integers(1, 70))
                out: list[int] = []
                idx.take(segment_index.queue_key(q), after, limit, out)
                assert out == expected(queues, q, after, limit)
        finally:
            idx.close()


def test_hash_collisions_are_told_apart_by_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # every name hashes to one of two values: lookups must still find each queue's own run
    monkeypatch.setattr(segment_index, "name_digest", lambda raw: bytes(7) + bytes((len(raw) % 2,)))
    queues: Model = {f"q{'x' * (k % 5)}{k}": [100 + i for i in range(k, 50, k + 1)] for k in range(20)}
    job = _job(tmp_path, 100, [i * 64 for i in range(50)], queues)
    assert write_index(job)
    idx = SegmentIndex(index_path(job.log_path), 100, job.segment_size)
    for q, seqs in queues.items():
        out: list[int] = []
        idx.take(segment_index.queue_key(q), 0, 100, out)
        assert out == seqs
    out = []
    idx.take(segment_index.queue_key("qnot"), 0, 100, out)
    assert out == []
    idx.close()


def test_bad_files_are_refused(tmp_path: Path) -> None:
    job = _job(tmp_path, 7, [0, 100, 250], {"a": [7, 9], "b": [8]})
    assert write_index(job)
    path = index_path(job.log_path)
    good = path.read_bytes()
    with pytest.raises(BadIndex, match="first seq"):
        SegmentIndex(path, 8, job.segment_size)
    with pytest.raises(BadIndex, match="bytes of a"):
        SegmentIndex(path, 7, job.segment_size + 1)  # the log grew or shrank: stale
    SegmentIndex(path, 7, job.segment_size + 1, prefix=True).close()  # a checkpoint of a growing segment
    path.write_bytes(good[:-3])
    with pytest.raises(BadIndex, match="header says"):
        SegmentIndex(path, 7, job.segment_size)
    path.write_bytes(good[:40])
    with pytest.raises(BadIndex, match="shorter"):
        SegmentIndex(path, 7, job.segment_size)
    damaged = bytearray(good)
    damaged[30] ^= 1
    path.write_bytes(bytes(damaged))
    with pytest.raises(BadIndex, match="header checksum"):
        SegmentIndex(path, 7, job.segment_size)
    damaged = bytearray(good)
    damaged[-1] ^= 1  # a name byte: only the body checksum sees it
    path.write_bytes(bytes(damaged))
    idx = SegmentIndex(path, 7, job.segment_size)
    assert not idx.verify()
    idx.close()
    # a log gone before its index was written: nothing is written
    job.log_path.unlink()
    path.unlink()
    assert not write_index(job) and not path.exists()


def test_segments_stay_under_4_gib(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="segment_bytes"):
        CommitLog(tmp_path, MAX_SEGMENT_BYTES + 1)
    assert MAX_SEGMENT_BYTES == U32_MAX


# --- the store over index files -----------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_reads_across_sealed_and_active_segments_match_a_full_scan(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    s = EmbeddedStore(tmp_path, fsync="never", segment_bytes=2048, recent_messages=rng.choice([0, 7]))
    await s.open()
    await fill(s, rng, 60, 8)
    for phase in range(3):  # in memory while writes are pending, then mapped, then after a reopen
        if phase == 1:
            await indexed(s)
            assert s.stats()["segments_indexed"] == s.stats()["segments"] - 1
        if phase == 2:
            await s.close()
            s = EmbeddedStore(tmp_path, fsync="never", segment_bytes=2048, recent_messages=0)
            await s.open()
        model = scan_model(tmp_path)
        last = s.last_seq()
        for q in [*model, "absent"]:
            assert await read_seqs(s, q) == model.get(q, [])
            for _ in range(15):
                after, limit = rng.randint(0, last + 1), rng.randint(1, 40)
                assert await read_seqs(s, q, after, limit) == expected(model, q, after, limit), (phase, q)
        fetched = sorted(rng.sample(range(1, last + 1), 20))
        assert [m.seq for m in await s.fetch(fetched)] == fetched
        assert [m.seq for m in (await s.read_log(0, 0, last)).messages] == list(range(1, last + 1))
    await s.close()


async def test_reopen_maps_indexes_and_scans_only_what_they_do_not_cover(tmp_path: Path) -> None:
    data = tmp_path / "data"
    s = EmbeddedStore(data, fsync="batch", segment_bytes=4096)
    await s.open()
    await fill(s, random.Random(5), 80, 6)
    await s.sync()
    await indexed(s)
    segments = s.stats()["segments"]
    assert segments > 5 and len(index_files(data)) == segments - 1
    # a crash now (copy of the directory as it is): only the active segment is read
    shutil.copytree(data, tmp_path / "crash")
    s2 = EmbeddedStore(tmp_path / "crash", segment_bytes=4096)
    await s2.open()
    st2 = s2.stats()
    assert (st2["segments_scanned"], st2["scan_bytes"]) == (1, log_files(data)[-1].stat().st_size)
    assert (st2["segments_indexed"], st2["messages"], st2["bytes"]) == (segments - 1, s.stats()["messages"],
                                                                         s.stats()["bytes"])
    model = scan_model(data)
    for q in model:
        assert await read_seqs(s2, q) == model[q]
    await s2.close()
    # a clean close also checkpoints the active segment: nothing is scanned
    await s.close()
    s3 = EmbeddedStore(data, segment_bytes=4096)
    await s3.open()
    assert (s3.stats()["segments_scanned"], s3.stats()["scan_bytes"]) == (0, 0)
    await s3.append([msg(1000, "q1"), msg(1001, "new")])  # the checkpointed segment keeps growing
    model = scan_model(data)
    for q in model:
        assert await read_seqs(s3, q) == model[q]
    await s3.close()


@pytest.mark.parametrize("damage", ["truncate", "header", "body", "swap", "stale"])
async def test_damaged_or_stale_index_is_detected_and_rebuilt(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    s = EmbeddedStore(tmp_path, fsync="never", segment_bytes=2048, recent_messages=0)
    await s.open()
    await fill(s, random.Random(9), 40, 5)
    await s.close()
    model = scan_model(tmp_path)
    idx_files = index_files(tmp_path)
    victim = idx_files[1]
    raw = bytearray(victim.read_bytes())
    if damage == "truncate":
        victim.write_bytes(raw[: len(raw) // 2])
    elif damage in ("header", "body"):
        raw[20 if damage == "header" else -2] ^= 0x40
        victim.write_bytes(bytes(raw))
        if damage == "body":  # what `store check` does: every checksum now, not on first use
            log = CommitLog(tmp_path / "log", 2048)
            log.recover()
            assert log.verify_indexes() == 1 and log.verify_indexes() == 0
            log.close()
            victim.write_bytes(bytes(raw))
    elif damage == "swap":
        victim.write_bytes(idx_files[2].read_bytes())  # another segment's index
    else:
        # the segment is longer than its index says (a tail written after it): the file is stale
        log_path = victim.with_suffix(".log")
        log_path.write_bytes(log_path.read_bytes() + b"\x00" * 3)
    with caplog.at_level(logging.WARNING, logger="tidewire.store"):
        s = EmbeddedStore(tmp_path, fsync="never", segment_bytes=2048, recent_messages=0)
        await s.open()
        for q in model:  # a damaged body is found on first use, the rest at open
            assert await read_seqs(s, q) == model[q]
    assert victim.name in caplog.text
    assert s.stats()["segments_scanned"] == 1
    await indexed(s)
    rebuilt = SegmentIndex(victim, int(victim.stem), victim.with_suffix(".log").stat().st_size)
    assert rebuilt.verify()
    assert rebuilt.queues() == {q: [x for x in seqs if rebuilt.first_seq <= x < rebuilt.first_seq + rebuilt.records]
                                for q, seqs in model.items()
                                if any(rebuilt.first_seq <= x < rebuilt.first_seq + rebuilt.records for x in seqs)}
    rebuilt.close()
    await s.close()


async def test_retention_deletes_index_files_with_their_segments(tmp_path: Path) -> None:
    s = EmbeddedStore(tmp_path, fsync="never", segment_bytes=2048, retention_bytes=6000, recent_messages=0)
    await s.open()
    deleted = 0
    for b in range(30):
        await s.append([msg(b * 5 + i, "q", f"only{b}") for i in range(5)])
        if b % 3 == 0:
            deleted += await s.enforce_retention()  # sometimes while an index write is in flight
    await indexed(s)
    deleted += await s.enforce_retention()
    await indexed(s)
    assert deleted >= 4
    logs = {p.stem for p in log_files(tmp_path)}
    idxs = {p.stem for p in index_files(tmp_path)}
    assert idxs <= logs and len(idxs) == len(logs) - 1  # every sealed survivor, and no orphan
    got = await read_seqs(s, "q")
    assert got[-1] == 150 and got == list(range(got[0], 151))
    assert await read_seqs(s, "only0") == []
    await s.close()


async def test_in_memory_index_covers_only_the_active_segment(tmp_path: Path) -> None:
    s = EmbeddedStore(tmp_path, fsync="never", segment_bytes=1 << 20, segment_max_queues=50, recent_messages=0)
    await s.open()
    for b in range(40):  # a flood of distinct topics: sealed every 50 queues, whatever the segment size
        await s.append([msg(b * 10 + i, f"topic/{b * 10 + i}") for i in range(10)])
    await indexed(s)
    st_ = s.stats()
    assert st_["segments"] == 8 and st_["segments_indexed"] == 7
    assert st_["index_queues_in_memory"] == 50 and st_["queues"] == 400
    assert await read_seqs(s, "topic/3") == [4] and await read_seqs(s, "topic/399") == [400]
    await s.close()


async def test_checkpoints_bound_what_a_restart_after_a_crash_scans(tmp_path: Path) -> None:
    data = tmp_path / "data"
    s = EmbeddedStore(data, fsync="batch", segment_bytes=1 << 20, index_checkpoint_bytes=2000)
    await s.open()
    rng = random.Random(4)
    for crash in range(3):
        await fill(s, rng, 25, 5)
        await s.sync()
        await indexed(s)  # the last checkpoint is written too
        copy = tmp_path / f"crash{crash}"
        shutil.copytree(data, copy)
        assert s.stats()["segments"] == 1 and len(index_files(copy)) == 1  # one segment, checkpointed
        s2 = EmbeddedStore(copy, segment_bytes=1 << 20)
        await s2.open()
        # only what was written since the last checkpoint (at most a batch more than its interval)
        assert s2.stats()["scan_bytes"] < 2000 + 10 * 200 < s.stats()["bytes"] / 2
        model = scan_model(copy)
        for q in model:
            assert await read_seqs(s2, q) == model[q]
        await s2.append([msg(1, "q1")])  # the checkpointed segment keeps growing after a crash too
        assert (await s2.read("q1", s2.last_seq() - 1, 10)).messages[0].seq == s2.last_seq()
        await s2.close()
    await s.close()


async def test_the_log_tail_ignores_index_files(tmp_path: Path) -> None:
    s = EmbeddedStore(tmp_path, fsync="batch", segment_bytes=2048)
    await s.open()
    await fill(s, random.Random(3), 30, 4)
    await s.sync()
    await indexed(s)
    assert index_files(tmp_path)
    tail = EmbeddedLogTail(tmp_path)
    await tail.open()
    page = await tail.read_log(0, 0, 10_000)
    assert [m.seq for m in page.messages] == list(range(1, s.last_seq() + 1))
    await tail.close()
    await s.close()
