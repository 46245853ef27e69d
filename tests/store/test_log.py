"""The log for readers: the `read_log`/holds contract on every engine, and the embedded engine's holds, its
retention, the read-only `EmbeddedLogTail` of another process's data directory, and `LogReader` over both."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from tests.store.conftest import Engine
from tests.waiting import until
from tidewire.store.base import PROTOCOL_AMQP, PROTOCOL_MQTT, PROTOCOL_ROCKETMQ, LogSource, Message, Store
from tidewire.store.embedded.engine import EmbeddedStore
from tidewire.store.embedded.log import HOLDS_DIR, hold_file_name, holder_from_file_name
from tidewire.store.embedded.tail import EmbeddedLogTail
from tidewire.store.log_reader import LogReader
from tidewire.store.properties import Properties
from tidewire.store.records import encode_message_body, frame

Content = tuple[object, ...]


def msg(i: int, *queues: str, protocol: int = PROTOCOL_MQTT, size: int = 60) -> Message:
    return Message(f"dev{i % 4}/t/{i}", (b"%06d" % i) * (size // 6), qos=i % 3, retain=i % 5 == 0,
                   properties=Properties(content_type="application/json", user=[("k", str(i))]).to_block(),
                   timestamp_ms=1_700_000_000_000 + i, expires_at_ms=0 if i % 2 else 1_800_000_000_000 + i,
                   publisher=f"client{i % 3}", queues=queues, protocol=protocol)


def content(m: Message) -> Content:
    return (m.topic, m.payload, m.qos, m.retain, m.properties, m.timestamp_ms, m.expires_at_ms, m.publisher,
            m.queues, m.protocol)


async def log_store(engine: Engine) -> Store:
    """Every engine reads its log (no skip: an engine that lost `read_log` or its holds fails here)."""
    s = engine.store
    await s.read_log(0, 0, 1)
    await s.log_holds(0)
    return s


async def read_partition(s: LogSource, p: int, after: int = 0, limit: int = 1000) -> tuple[list[Message], int]:
    """Every record of partition `p` above `after`, page by page; and the last `upto`."""
    out: list[Message] = []
    while True:
        page = await s.read_log(p, after, limit)
        assert all(m.seq > after for m in page.messages)
        assert page.upto >= after
        out += page.messages
        after = page.upto
        if len(page.messages) < limit:
            return out, after


async def read_everything(s: LogSource, limit: int = 1000) -> list[Message]:
    out: list[Message] = []
    for p in range(s.log_partitions()):
        got, _ = await read_partition(s, p, 0, limit)
        assert [m.seq for m in got] == sorted(m.seq for m in got)  # ascending within the partition
        out += got
    return sorted(out, key=lambda m: m.seq)


# --- the contract, on every engine ------------------------------------------------------------------------------


async def test_read_log_returns_every_record_whatever_its_queues(engine: Engine) -> None:
    s = await log_store(engine)
    assert s.log_partitions() >= 1
    protocols = (PROTOCOL_MQTT, PROTOCOL_AMQP, PROTOCOL_ROCKETMQ)
    sent = [msg(i, *(("q",) if i % 3 else ()), protocol=protocols[i % 3]) for i in range(30)]
    expected = [content(m) for m in sent]
    await s.append(sent[:10])
    await s.append(sent[10:])
    got = await read_everything(s)
    assert [m.seq for m in got] == sorted(m.seq for m in sent)
    assert sorted(content(m) for m in got) == sorted(expected)
    by_seq = {m.seq: content(m) for m in sent}
    assert all(content(m) == by_seq[m.seq] for m in got)


async def test_read_log_pages_at_the_limit_with_upto_the_last_returned(engine: Engine) -> None:
    s = await log_store(engine)
    await s.append([msg(i) for i in range(25)])
    for p in range(s.log_partitions()):
        whole, _ = await read_partition(s, p)
        paged: list[Message] = []
        after = 0
        while True:
            page = await s.read_log(p, after, 4)
            if len(page.messages) == 4:
                assert page.upto == page.messages[-1].seq
            paged += page.messages
            if len(page.messages) < 4:
                break
            after = page.upto
        assert [m.seq for m in paged] == [m.seq for m in whole]


async def test_upto_is_never_passed_by_a_later_append(engine: Engine) -> None:
    s = await log_store(engine)
    await s.append([msg(i) for i in range(10)])
    marks = [(await read_partition(s, p))[1] for p in range(s.log_partitions())]
    later = [msg(i) for i in range(10, 30)]
    await s.append(later)
    seen: list[int] = []
    for p, upto in enumerate(marks):
        got, _ = await read_partition(s, p, upto)
        seen += [m.seq for m in got]
    assert sorted(seen) == sorted(m.seq for m in later)  # each new record lies above its partition's upto


async def test_read_log_past_the_end_and_trimmed_of_a_fresh_log(engine: Engine) -> None:
    s = await log_store(engine)
    batch = [msg(i) for i in range(3)]
    await s.append(batch)
    top = max(m.seq for m in batch)
    for p in range(s.log_partitions()):
        page = await s.read_log(p, top, 10)
        assert page.messages == [] and page.upto >= top and page.trimmed == 0


async def test_an_unknown_partition_is_a_value_error(engine: Engine) -> None:
    s = await log_store(engine)
    for p in (-1, s.log_partitions()):
        with pytest.raises(ValueError):
            await s.read_log(p, 0, 10)
        with pytest.raises(ValueError):
            await s.hold_log(p, "lake", 1)
        with pytest.raises(ValueError):
            await s.log_holds(p)


async def test_holds_are_set_moved_listed_and_dropped_and_survive_a_reopen(engine: Engine) -> None:
    s = await log_store(engine)
    last = s.log_partitions() - 1
    assert await s.log_holds(0) == {}
    await s.hold_log(0, "lake", 5)
    await s.hold_log(0, "lake/other", 3)
    await s.hold_log(last, "lake", 8)
    await s.hold_log(0, "lake", 9)
    assert await s.log_holds(0) == {"lake": 9, "lake/other": 3}
    await s.hold_log(0, "lake/other", -1)
    await s.hold_log(0, "never-set", -1)
    assert await s.log_holds(0) == {"lake": 9}
    await s.append([msg(1)])
    s = await engine.reopen()
    assert await s.log_holds(0) == {"lake": 9}
    if last:
        assert await s.log_holds(last) == {"lake": 8}
    assert len(await read_everything(s)) == 1


# --- embedded: retention and holds -----------------------------------------------------------------------------


async def open_store(path: Path, **kw: object) -> EmbeddedStore:
    s = EmbeddedStore(path, fsync="never", segment_bytes=2048, **kw)  # type: ignore[arg-type]
    await s.open()
    return s


async def fill(s: EmbeddedStore, n: int, batch: int = 10) -> None:
    start = s.last_seq()
    for b in range(0, n, batch):
        await s.append([msg(start + b + i, "q") for i in range(batch)])


async def test_retention_keeps_every_segment_above_the_lowest_hold(tmp_path: Path) -> None:
    s = await open_store(tmp_path, retention_bytes=1)  # as small as it gets: everything but the active segment
    await fill(s, 200)
    assert s.stats()["segments"] > 8
    await s.hold_log(0, "lake", 50)
    await s.hold_log(0, "audit", 120)
    await s.enforce_retention()
    page = await s.read_log(0, 50, 1000)
    assert [m.seq for m in page.messages] == list(range(51, 201))  # nothing above the lowest hold went
    assert 0 < page.trimmed <= 50  # segments wholly at or below it did
    await s.hold_log(0, "lake", 150)
    await s.enforce_retention()
    page = await s.read_log(0, 0, 1000)
    assert 50 < page.trimmed <= 120 and page.messages[0].seq == page.trimmed + 1
    await s.hold_log(0, "audit", -1)
    await s.hold_log(0, "lake", -1)
    await s.enforce_retention()
    assert s.stats()["segments"] == 1
    await s.close()


async def test_retention_ignores_holds_when_told_and_the_reader_counts_what_it_lost(tmp_path: Path) -> None:
    s = await open_store(tmp_path, retention_bytes=1, retention_ignores_holds=True)
    await fill(s, 200)
    await s.hold_log(0, "lake", 10)
    assert await s.enforce_retention() > 0
    assert s.stats()["segments"] == 1
    page = await s.read_log(0, 10, 1000)
    assert page.trimmed > 10 and [m.seq for m in page.messages] == list(range(page.trimmed + 1, 201))
    reader = LogReader(s, 0, 10)
    records = await reader.read(1000)
    assert reader.lost == page.trimmed - 10 and reader.gaps == 1
    assert [r.position for r in records] == list(range(page.trimmed + 1, 201)) and reader.position == 200
    assert await reader.read(10) == [] and reader.gaps == 1
    await s.close()


async def test_a_reopened_store_keeps_its_holds_and_retention_still_honours_them(tmp_path: Path) -> None:
    s = await open_store(tmp_path)
    await fill(s, 200)
    await s.hold_log(0, "lake", 30)
    await s.close()
    s = await open_store(tmp_path, retention_bytes=1)
    assert await s.log_holds(0) == {"lake": 30}
    await s.enforce_retention()
    assert [m.seq for m in (await s.read_log(0, 30, 1000)).messages] == list(range(31, 201))
    await s.close()


def test_holder_names_map_to_safe_file_names_and_back() -> None:
    for name in ("lake", "lake/0", "..", ".lease-x", "a%2F", "ü-🙂", "x" * 64, "tmp file"):
        file_name = hold_file_name(name)
        assert "/" not in file_name and not file_name.startswith(".") and len(file_name) <= 255
        assert holder_from_file_name(file_name) == name
    assert holder_from_file_name("lake%2f") is None  # not a name the encoder makes
    for bad in ("", "x" * 65):
        with pytest.raises(ValueError):
            hold_file_name(bad)


async def test_read_log_limits_and_disk_reads_without_the_ring(tmp_path: Path) -> None:
    s = await open_store(tmp_path, recent_messages=0)
    sent = [msg(i, "q") for i in range(40)]
    await s.append(sent)
    got = (await s.read_log(0, 0, 100)).messages
    assert [content(m) for m in got] == [content(m) for m in sent]
    assert (await s.read_log(0, 7, 0)) == ([], 7, 0)  # no room: complete up to nothing new
    page = await s.read_log(0, 38, 100)
    assert [m.seq for m in page.messages] == [39, 40] and page.upto == 40
    await s.close()


# --- EmbeddedLogTail: another process's data directory, read-only ----------------------------------------------


async def open_tail(path: Path, **kw: int) -> EmbeddedLogTail:
    tail = EmbeddedLogTail(path, **kw)
    await tail.open()
    return tail


async def test_tail_follows_appends_segment_rolls_and_retention(tmp_path: Path) -> None:
    s = await open_store(tmp_path, retention_bytes=4096)
    tail = await open_tail(tmp_path, max_batch_bytes=1500)  # a few records per read: byte-bounded batches
    assert (await tail.read_log(0, 0, 10)) == ([], 0, 0)  # nothing written yet
    sent: dict[int, Content] = {}
    seen: list[Message] = []
    position = 0
    deleted = 0
    for round_ in range(40):
        batch = [msg(round_ * 7 + i, "q", protocol=round_ % 3) for i in range(7)]
        await s.append(batch)
        sent.update((m.seq, content(m)) for m in batch)
        if round_ % 3 == 0:
            page = await tail.read_log(0, position, 5)  # behind on purpose: retention must wait for it
            seen += page.messages
            position = page.upto
            await tail.hold_log(0, "lake", position)
            deleted += await s.enforce_retention()
    assert deleted > 3  # retention deleted what the tail had read, meanwhile
    while True:
        page = await tail.read_log(0, position, 50)
        assert page.trimmed <= position  # the hold kept everything the tail had not read
        seen += page.messages
        position = page.upto
        if not page.messages:
            break
    assert position == s.last_seq() == 280
    assert [m.seq for m in seen] == list(range(1, 281))
    assert all(content(m) == sent[m.seq] for m in seen)
    await tail.hold_log(0, "lake", -1)
    await s.enforce_retention()
    assert (await tail.read_log(0, 0, 1)).trimmed > 200  # the deleted segments are gone for the tail too
    await tail.close()
    await s.close()


async def test_tail_waits_for_a_partial_frame_and_never_writes(tmp_path: Path) -> None:
    s = await open_store(tmp_path)
    await s.append([msg(i, "q") for i in range(5)])
    await s.close()
    seg = sorted((tmp_path / "log").glob("*.log"))[-1]
    whole = frame(encode_message_body(msg(6, "q"), 6))
    tail = await open_tail(tmp_path)
    with open(seg, "ab") as f:  # the writer, halfway through a write
        f.write(whole[:30])
    size = seg.stat().st_size
    page = await tail.read_log(0, 0, 100)
    assert [m.seq for m in page.messages] == [1, 2, 3, 4, 5] and page.upto == 5
    assert (await tail.read_log(0, 5, 100)) == ([], 5, 0)
    assert seg.stat().st_size == size  # not cut
    with open(seg, "ab") as f:
        f.write(whole[30:])
    page = await tail.read_log(0, 5, 100)
    assert [m.seq for m in page.messages] == [6] and content(page.messages[0]) == content(msg(6, "q"))
    damaged = bytearray(frame(encode_message_body(msg(7, "q"), 7)))
    damaged[-1] ^= 0xFF
    with open(seg, "ab") as f:  # whole length, wrong crc: still "not yet" in the last segment
        f.write(damaged)
    assert (await tail.read_log(0, 6, 100)).messages == []
    assert not list((tmp_path / "log").glob("*.tmp"))
    await tail.close()


async def test_tail_reads_on_past_a_bad_frame_of_a_complete_segment(tmp_path: Path) -> None:
    s = await open_store(tmp_path)
    await s.append([msg(i, "q") for i in range(3)])
    await s.close()
    first = sorted((tmp_path / "log").glob("*.log"))[0]
    with open(first, "ab") as f:
        f.write(b"\x10\x00\x00\x00garbage")  # a torn write the writer will cut at its next start
    (tmp_path / "log" / f"{10:020d}.log").write_bytes(frame(encode_message_body(msg(10, "q"), 10)))
    tail = await open_tail(tmp_path)
    page = await tail.read_log(0, 0, 100)
    assert [m.seq for m in page.messages] == [1, 2, 3, 10] and page.upto == 10
    await tail.close()


async def test_tail_lease_is_exclusive_across_processes(tmp_path: Path) -> None:
    a = await open_tail(tmp_path)
    b = await open_tail(tmp_path)  # its own open file description: flock conflicts as from another process
    assert await a.lease("lake/0", "bridge-a", 10_000) == 1
    assert await a.lease("lake/0", "bridge-a", 10_000) == 1  # a renewal keeps the epoch
    assert await b.lease("lake/0", "bridge-b", 10_000) == 0
    await a.release("lake/0", "bridge-a")
    assert await b.lease("lake/0", "bridge-b", 10_000) == 2  # epochs go on across holders
    await b.close()  # closing releases
    lock = tmp_path / "log" / HOLDS_DIR / f".lease-{hold_file_name('lake/0')}"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys\nfd = os.open(sys.argv[1], os.O_RDWR)\n"
         "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('locked', flush=True)\nsys.stdin.read()\n", str(lock)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdin is not None
        assert holder.stdout.readline() == b"locked\n"
        assert await a.lease("lake/0", "bridge-a", 10_000) == 0
        holder.stdin.close()
        holder.wait(5)
        assert await a.lease("lake/0", "bridge-a", 10_000) == 3
    finally:
        holder.kill()
        holder.wait()
        for pipe in (holder.stdin, holder.stdout):
            if pipe is not None:
                pipe.close()
    assert await a.log_holds(0) == {}  # lease files are no holds
    await a.close()


async def test_tail_lease_between_owners_of_one_process_follows_the_ttl(tmp_path: Path) -> None:
    tail = await open_tail(tmp_path)
    assert await tail.lease("k", "one", 50) == 1
    assert await tail.lease("k", "two", 50) == 0
    await asyncio.sleep(0.08)  # the behaviour under test: past the lease's 50 ms TTL
    assert await tail.lease("k", "two", 50) == 2  # lapsed: taken anew
    await tail.release("k", "one")  # not the holder: nothing happens
    assert await tail.lease("k", "one", 50) == 0
    await tail.close()


async def test_tail_has_one_partition_and_refuses_others(tmp_path: Path) -> None:
    tail = await open_tail(tmp_path)
    assert tail.log_partitions() == 1
    with pytest.raises(ValueError):
        await tail.read_log(1, 0, 1)
    with pytest.raises(ValueError):
        LogReader(tail, 1, 0)
    await tail.close()
    assert not (tmp_path / "log").exists()  # a read-only tail creates nothing by reading


# --- LogReader ---------------------------------------------------------------------------------------------------


async def test_log_reader_records_carry_every_field(tmp_path: Path) -> None:
    s = await open_store(tmp_path)
    m = Message("plant/line1/temp", b'{"t": 81}', 1, True,
                Properties(content_type="application/json", correlation_data=b"c1", response_topic="r/1",
                           user=[("site", "a"), ("site", "b")], utf8_payload=True).to_block(),
                1_700_000_000_123, 1_700_000_060_000, "sensor-7", ("plant/line1/temp",), protocol=PROTOCOL_AMQP)
    await s.append([m, msg(2)])
    tail = await open_tail(tmp_path)
    for source in (s, tail):
        records = await LogReader(source, 0, 0).read(10)
        r = records[0]
        assert (r.position, r.partition, r.received_ms, r.topic, r.first_level, r.client_id, r.protocol, r.qos,
                r.retain, r.payload, r.expires_at_ms) == (
            1, 0, 1_700_000_000_123, "plant/line1/temp", "plant", "sensor-7", "amqp", 1, True, b'{"t": 81}',
            1_700_000_060_000)
        assert r.properties == Properties(content_type="application/json", correlation_data=b"c1",
                                          response_topic="r/1", user=[("site", "a"), ("site", "b")],
                                          utf8_payload=True, expiry_interval=None)
        assert records[1].position == 2 and records[1].protocol == "mqtt"
    await tail.close()
    await s.close()


@pytest.mark.parametrize("via_tail", [False, True])
async def test_log_reader_tail_yields_batches_until_closed(tmp_path: Path, via_tail: bool) -> None:
    s = await open_store(tmp_path)
    await s.append([msg(i) for i in range(10)])
    source: LogSource = await open_tail(tmp_path) if via_tail else s
    reader = LogReader(source, 0, 3)
    got: list[int] = []

    async def consume() -> None:
        async for batch in reader.tail(4, 0.005):
            assert 0 < len(batch) <= 4
            got.extend(r.position for r in batch)
            if len(got) >= 27:
                reader.close()

    task = asyncio.create_task(consume())
    for b in range(4):  # each batch appended once the tailing reader has caught up with the log
        await until(lambda b=b: bool(got) and got[-1] == 10 + b * 5, what=f"the reader at {10 + b * 5}")  # type: ignore[misc]
        await s.append([msg(10 + b * 5 + i) for i in range(5)])
    await asyncio.wait_for(task, 5)
    assert got == list(range(4, 31)) and reader.position == 30 and reader.lost == 0
    if isinstance(source, EmbeddedLogTail):
        await source.close()
    await s.close()


async def test_log_reader_reads_every_partition(engine: Engine) -> None:
    s = await log_store(engine)
    await s.append([msg(i) for i in range(12)])
    got: list[int] = []
    for p in range(s.log_partitions()):
        reader = LogReader(s, p, 0)
        while batch := await reader.read(5):
            got += [r.position for r in batch]
        assert reader.lost == 0
    assert sorted(got) == sorted(m.seq for m in await read_everything(s))
    assert len(got) == 12
