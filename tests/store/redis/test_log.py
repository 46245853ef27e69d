"""Tests of the Redis engine's log for readers (`store.redis.log`): `read_log`, holds and retention.

On a private redis-server with 1 and 4 partitions and on a real 3-master Redis Cluster with 4 (each emptied
before a test): the whole log read back partition by partition (every message once, each partition ascending,
every field decoded), cuts at the limit and at the per-call visit bound, a reader tailing while another store
appends (a later append never lands at or below an `upto` already handed out), retention with and without holds
and the `trimmed` it reports, holds across a reopen and a Redis kill -9, legacy (v0) records, and round trips.
"""
# ruff: noqa: F811 - the fixtures imported from the support module are requested by name as parameters

from __future__ import annotations

import asyncio
import time
import zlib
from struct import Struct

import pytest
import redis.asyncio as aioredis

import tidewire.store.redis.log as redis_log
from tests.store.redis.redis_cluster_support import (  # noqa: F401 - fixtures are used by name
    OPEN,
    client_commands,
    cluster,
    opened,
    server,
)
from tests.store.redis_server import RedisClusterServers, RedisServer
from tidewire.store.base import PROTOCOL_AMQP, PROTOCOL_MQTT, PROTOCOL_ROCKETMQ, Message
from tidewire.store.records import UnsupportedRecord
from tidewire.store.redis.engine import RedisStore
from tidewire.store.redis.scripts import EPOCH_MS, TICKS


class Where:
    def __init__(self, name: str, url: str, partitions: int, server: RedisServer | None) -> None:
        self.name, self.url, self.partitions, self.server = name, url, partitions, server


@pytest.fixture(params=["p1", "p4", "cluster"])
def where(request: pytest.FixtureRequest) -> Where:
    if request.param == "cluster":
        c: RedisClusterServers = request.getfixturevalue("cluster")
        return Where("cluster", c.url, 4, None)
    s: RedisServer = request.getfixturevalue("server")
    return Where(request.param, s.url, 1 if request.param == "p1" else 4, s)


def part_of(topic: str, partitions: int) -> int:
    return zlib.crc32(topic.encode()) % partitions


PROTOCOLS = (PROTOCOL_MQTT, PROTOCOL_AMQP, PROTOCOL_ROCKETMQ)


def mk(i: int, prefix: str = "d") -> Message:
    """Message i: topics spread over partitions; some index into no queue (the log has them all the same)."""
    topic = f"{prefix}/{i % 13}/t"
    queues = () if i % 5 == 0 else (topic, f"{prefix}/#")
    return Message(topic, f"payload {i}".encode(), qos=i % 3, retain=i % 7 == 0, publisher=f"c{i % 4}",
                   queues=queues, protocol=PROTOCOLS[i % 3], properties=b"\x03\x00\x04text" if i % 2 else b"")


async def read_partition(s: RedisStore, p: int, limit: int, after: int = 0) -> tuple[list[Message], int]:
    """Read partition p to its end; checks every slice's own promises on the way."""
    got: list[Message] = []
    while True:
        sl = await s.read_log(p, after, limit)
        assert len(sl.messages) <= limit
        assert sl.upto >= after
        assert all(after < m.seq <= sl.upto for m in sl.messages)
        if len(sl.messages) == limit:
            assert sl.upto == sl.messages[-1].seq  # cut at the limit
        got.extend(sl.messages)
        if not sl.messages and sl.upto == after:
            return got, after
        after = sl.upto


def fields(m: Message) -> tuple[object, ...]:
    return (m.seq, m.topic, m.payload, m.qos, m.retain, m.publisher, m.queues, m.protocol, m.properties,
            m.timestamp_ms, m.expires_at_ms)


async def test_reads_the_whole_log_once_in_order_per_partition(where: Where, opened: OPEN) -> None:
    s = await opened(where.url, partitions=where.partitions)
    P = s.log_partitions()
    assert where.partitions == P
    sent: list[Message] = []
    for b in range(12):  # batches of mixed topics: with P > 1 each partition's part of a batch has gaps
        batch = [mk(b * 40 + i) for i in range(40)]
        await s.append(batch)
        sent.extend(batch)
    seen: list[Message] = []
    for p in range(P):
        got, end = await read_partition(s, p, limit=17)
        assert [m.seq for m in got] == sorted(m.seq for m in got)  # ascending, no duplicate
        assert all(m.seq % P == p for m in got)
        assert {part_of(m.topic, P) for m in got} <= {p}
        assert end >= max((m.seq for m in got), default=0)
        seen.extend(got)
    assert sorted(fields(m) for m in seen) == sorted(fields(m) for m in sent)  # the union: each message once


async def test_limit_cuts_exactly_and_the_next_read_goes_on_from_upto(where: Where, opened: OPEN) -> None:
    s = await opened(where.url, partitions=where.partitions)
    batch = [mk(i) for i in range(60)]
    await s.append(batch)
    p = part_of(batch[1].topic, s.log_partitions())
    mine = [m.seq for m in batch if part_of(m.topic, s.log_partitions()) == p]
    first = await s.read_log(p, 0, 3)
    assert [m.seq for m in first.messages] == mine[:3] and first.upto == mine[2]
    second = await s.read_log(p, first.upto, 3)
    assert [m.seq for m in second.messages] == mine[3:6]
    rest = await s.read_log(p, second.upto, 1000)
    assert [m.seq for m in rest.messages] == mine[6:]
    assert rest.upto >= mine[-1]  # not cut: the partition's counter
    empty = await s.read_log(p, rest.upto, 1000)
    assert empty.messages == [] and empty.upto == rest.upto and empty.trimmed == 0
    zero = await s.read_log(p, 5, 0)
    assert zero.messages == [] and zero.upto == 5
    mid = await s.read_log(p, mine[2] - 1, 2)  # a position between seqs (not ≡ p mod P) works too
    assert [m.seq for m in mid.messages] == mine[2:4]
    with pytest.raises(ValueError):
        await s.read_log(s.log_partitions(), 0, 10)
    with pytest.raises(ValueError):
        await s.hold_log(-1, "h", 0)
    for bad in ("", "ü" * 33):
        with pytest.raises(ValueError):
            await s.hold_log(0, bad, 1)
    await s.hold_log(0, "ü" * 32, 1)  # 64 bytes: the most a holder name may have
    assert await s.log_holds(0) == {"ü" * 32: 1}


async def test_visit_bound_cuts_a_call_without_skipping(where: Where, opened: OPEN,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    s = await opened(where.url, partitions=where.partitions)
    sent: list[Message] = []
    for b in range(3):
        batch = [mk(b * 50 + i) for i in range(50)]
        await s.append(batch)
        sent.extend(batch)
    P = s.log_partitions()
    monkeypatch.setattr(redis_log, "READ_LOG_VISITS", 3)
    for p in range(P):
        want = [m.seq for m in sent if m.seq % P == p]
        sl = await s.read_log(p, 0, 1000)
        assert len(sl.messages) <= 3 and sl.upto < want[-1]  # cut by the bound: upto = the last candidate
        got, _ = await read_partition(s, p, limit=1000)
        assert [m.seq for m in got] == want
    if P > 1:  # a cut may find nothing (gaps of another partition's messages) and still move on
        p = part_of(sent[0].topic, P)
        monkeypatch.setattr(redis_log, "READ_LOG_VISITS", 1)
        after, empties = 0, 0
        while True:
            sl = await s.read_log(p, after, 1000)
            if not sl.messages and sl.upto == after:
                break
            empties += not sl.messages
            after = sl.upto
        assert empties > 0


async def test_tail_while_another_store_appends(where: Where, opened: OPEN) -> None:
    writer = await opened(where.url, partitions=where.partitions)
    reader = await opened(where.url, partitions=where.partitions)
    P = reader.log_partitions()
    # Every counter 30 s ahead, as a node whose clock runs ahead leaves them: appends then take the counter + P
    # (not the clock), the tightest case for an `upto` handed out just before.
    await writer.read("any/#", 0, 1, seal=(int(time.time() * 1000) - EPOCH_MS + 30_000) * TICKS)
    handed_out = [0] * P  # the highest upto any tail has been given, per partition
    appended: list[Message] = []
    late: list[tuple[int, int]] = []
    done = asyncio.Event()

    async def write() -> None:
        try:
            for b in range(40):
                before = list(handed_out)
                batch = [mk(b * 10 + i) for i in range(10)]
                await writer.append(batch)
                late.extend((m.seq, before[m.seq % P]) for m in batch if m.seq <= before[m.seq % P])
                appended.extend(batch)
                await asyncio.sleep(0.002)  # pacing: appends interleave with the tails' reads
        finally:
            done.set()  # the tails end even if an append failed

    async def tail(p: int) -> list[Message]:
        got: list[Message] = []
        after = 0
        while True:
            finished = done.is_set()  # seen before the read: every append has returned, the read gets all
            sl = await reader.read_log(p, after, 7)
            got.extend(sl.messages)
            after = sl.upto
            handed_out[p] = max(handed_out[p], after)
            if not sl.messages:
                if finished:
                    return got
                await asyncio.sleep(0.001)  # the tail's poll interval

    tailing = [asyncio.ensure_future(tail(p)) for p in range(P)]
    await asyncio.gather(write(), *tailing)
    tails = [t.result() for t in tailing]
    assert late == []
    for p, got in enumerate(tails):
        assert [m.seq for m in got] == sorted({m.seq for m in got})
        assert all(m.seq % P == p for m in got)
    assert sorted(m.seq for got in tails for m in got) == sorted(m.seq for m in appended)
    assert max(handed_out) > 0


async def test_retention_removes_up_to_the_lowest_hold_and_reports_trimmed(where: Where, opened: OPEN) -> None:
    s = await opened(where.url, partitions=where.partitions)
    P = s.log_partitions()
    sent: list[Message] = []
    for b in range(4):
        batch = [mk(b * 30 + i) for i in range(30)]
        await s.append(batch)
        sent.extend(batch)
    per = {p: [m.seq for m in sent if m.seq % P == p] for p in range(P)}
    hold = {p: seqs[len(seqs) // 2] for p, seqs in per.items()}
    for p in range(P):
        await s.hold_log(p, "lake", hold[p])
        await s.hold_log(p, "slow", hold[p] + 1000 * P)  # the lowest hold counts
        assert await s.log_holds(p) == {"lake": hold[p], "slow": hold[p] + 1000 * P}
        assert (await s.read_log(p, 0, 1)).trimmed == 0
    s.retention_bytes = 1  # everything is over budget
    assert await s.enforce_retention() == sum(len([x for x in seqs if x <= hold[p]]) for p, seqs in per.items())
    for p, seqs in per.items():
        got, _ = await read_partition(s, p, limit=1000)
        assert [m.seq for m in got] == [x for x in seqs if x > hold[p]]
        assert (await s.read_log(p, 0, 1)).trimmed == hold[p]  # a reader at 0 knows it lost up to there
    assert await s.enforce_retention() == 0  # held: nothing more
    # The reader moves on: retention follows its hold; a dropped hold no longer counts.
    p = part_of(sent[0].topic, P)
    await s.hold_log(p, "lake", per[p][-2])
    await s.hold_log(p, "slow", -1)
    assert await s.log_holds(p) == {"lake": per[p][-2]}
    assert await s.enforce_retention() == len([x for x in per[p] if hold[p] < x <= per[p][-2]])
    got, _ = await read_partition(s, p, limit=1000)
    assert [m.seq for m in got] == per[p][-1:]
    assert (await s.read_log(p, 0, 1000)).trimmed == per[p][-2]
    # Queue indexes lose the removed seqs too.
    left = {m.seq for m in (await s.read("d/#", 0, 10_000)).messages}
    assert left == {x for p2, seqs in per.items() for x in seqs
                    if x > (per[p][-2] if p2 == p else hold[p2])} & {m.seq for m in sent if m.queues}


async def test_retention_ignores_holds_when_built_to(where: Where, opened: OPEN) -> None:
    s = await opened(where.url, partitions=where.partitions, retention_ignores_holds=True, retention_bytes=1)
    batch = [mk(i) for i in range(40)]
    await s.append(batch)
    for p in range(s.log_partitions()):
        await s.hold_log(p, "lake", 0)
    assert await s.enforce_retention() == 40
    for p in range(s.log_partitions()):
        sl = await s.read_log(p, 0, 1000)
        mine = [m.seq for m in batch if m.seq % s.log_partitions() == p]
        assert sl.messages == [] and sl.trimmed == max(mine, default=0)
        assert await s.log_holds(p) == {"lake": 0}  # kept, just not honoured


async def test_retention_by_age_stops_at_a_hold(server: RedisServer, opened: OPEN) -> None:
    s = await opened(server.url, retention_seconds=1)
    old = [mk(i) for i in range(10)]
    await s.append(old)
    await s.hold_log(0, "lake", old[3].seq)
    await asyncio.sleep(1.05)  # the behaviour under test: the records age past retention_seconds=1
    await s.append([mk(100)])
    assert await s.enforce_retention() == 4
    got, _ = await read_partition(s, 0, limit=100)
    assert [m.seq for m in got] == [m.seq for m in old[4:]] + [got[-1].seq]
    await s.hold_log(0, "lake", -1)
    assert await s.enforce_retention() == 6  # the new batch is too young
    assert [m.payload for m in (await s.read_log(0, 0, 100)).messages] == [b"payload 100"]


async def test_holds_survive_a_reopen_and_a_redis_kill(where: Where, opened: OPEN) -> None:
    s = await opened(where.url, partitions=where.partitions)
    await s.append([mk(i) for i in range(20)])
    for p in range(s.log_partitions()):
        await s.hold_log(p, "lake", 7 + p)
        await s.hold_log(p, "other:node/1", 99)
    await s.close()
    if where.server is not None:
        where.server.restart()  # kill -9: the holds come back from the AOF
    again = await opened(where.url, partitions=where.partitions, retention_bytes=1)
    for p in range(again.log_partitions()):
        assert await again.log_holds(p) == {"lake": 7 + p, "other:node/1": 99}
    assert await again.enforce_retention() == 0  # every seq is above the holds


LEGACY = Struct("<qqqBBHHIIHI")  # store.records' v0 message header (written before the versioned format)


def legacy_body(topic: str, payload: bytes, queue: str, ts: int) -> bytes:
    pub, t, q = b"old", topic.encode(), queue.encode()
    return LEGACY.pack(0, ts, 0, 1, 0, len(pub), len(t), 0, len(payload), 1, len(q)) + pub + t + payload + q


async def test_legacy_records_are_read_and_trimmed_from_their_queues(server: RedisServer, opened: OPEN) -> None:
    admin = aioredis.Redis.from_url(server.url)
    try:
        now = int(time.time() * 1000)
        body = legacy_body("old/t", b"legacy", "old/t", now)
        # A partition as an older build left it: one batch of one message (seq 5) indexed into a queue.
        await admin.hset("{tw:0}:msg", "5", body)
        await admin.zadd("{tw:0}:bt", {f"5:5:{now}": 5})
        await admin.zadd("{tw:0}:q:old/t", {"5": 5})
        await admin.set("{tw:0}:seq", 5)
        await admin.set("{tw:0}:bytes", len(body))
        s = await opened(server.url)
        new = [mk(1)]
        await s.append(new)
        got = (await s.read_log(0, 0, 10)).messages
        assert [(m.seq, m.topic, m.payload, m.protocol, m.publisher) for m in got] == [
            (5, "old/t", b"legacy", PROTOCOL_MQTT, "old"), (new[0].seq, new[0].topic, b"payload 1", PROTOCOL_AMQP,
                                                           "c1")]
        s.retention_bytes = 1
        assert await s.enforce_retention() == 2
        assert await admin.exists("{tw:0}:q:old/t", f"{{tw:0}}:q:{new[0].topic}", "{tw:0}:q:d/#", "{tw:0}:msg") == 0
        assert (await s.read_log(0, 0, 10)).trimmed == new[0].seq
        # A record of a newer format version: the reader stops loudly; retention still removes it.
        await admin.hset("{tw:0}:msg", "999999999999", b"TWLOG\x00\xff\x02" + bytes(40))
        await admin.zadd("{tw:0}:bt", {f"999999999999:999999999999:{now}": 999999999999})
        await admin.set("{tw:0}:seq", 999999999999)
        await admin.incrby("{tw:0}:bytes", 48)
        with pytest.raises(UnsupportedRecord):
            await s.read_log(0, 0, 10)
        assert await s.enforce_retention() == 1
        assert (await s.read_log(0, 0, 10)).trimmed == 999999999999
    finally:
        await admin.aclose()


async def test_read_log_is_one_script_call(server: RedisServer, opened: OPEN) -> None:
    s = await opened(server.url, partitions=4, seal_interval=3600)
    admin = aioredis.Redis.from_url(server.url)
    try:
        await s.append([mk(i) for i in range(30)])
        await s.read_log(0, 0, 1)  # loads the script (NOSCRIPT once) before counting
        got: list[int] = []

        async def read() -> None:
            got.append(len((await s.read_log(1, 0, 1000)).messages))

        assert await client_commands(server.url, admin, read) == ["evalsha"]
        assert got[0] > 0
    finally:
        await admin.aclose()
