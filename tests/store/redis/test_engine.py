"""Redis-specific tests of `store.redis.engine.RedisStore` (the shared contract is in test_contract.py).

On a private redis-server (one partition, and 16 partitions on one server) and on a real 3-master Redis
Cluster (tests/store/redis_server.py), each emptied before a test: round trips per call, the hybrid-clock seqs,
`upto`/`seal` across partitions and nodes, the wildcard version check, session fencing, spread plain queues,
concurrent nodes with a merged reader, durability across kill -9 with AOF, Redis down, retention, and the Lua
retained matcher against the gateway's own matcher.
"""
# ruff: noqa: F811 - the fixtures imported from the support module are requested by name as parameters

from __future__ import annotations

import asyncio
import itertools
import random
import time
import zlib
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio as aioredis

from tests.store.redis.redis_cluster_support import (  # noqa: F401 - fixtures are used by name
    OPEN,
    P,
    Target,
    client_commands,
    cluster,
    msg,
    opened,
    part,
    server,
    target,
    topics_in,
)
from tests.store.redis_server import RedisClusterServers, RedisServer, command
from tests.waiting import until
from tidewire.errors import StaleWildcards, StoreClosed
from tidewire.gateway.core.topics import matches
from tidewire.store.base import Message, SessionRecord, WillRecord
from tidewire.store.redis.engine import RedisStore, RedisUnavailable
from tidewire.store.redis.scripts import EPOCH_MS, MAX_SEQ, TICKS

# --- one partition ------------------------------------------------------------------------------------------


async def test_one_partition_one_round_trip_per_append_batch_and_per_read(server: RedisServer, opened: OPEN) -> None:
    rs = await opened(server.url, seal_interval=3600)
    admin = aioredis.Redis.from_url(server.url)
    try:
        await rs.append([msg("warm")])  # loads the scripts (NOSCRIPT once) before counting
        await rs.read("warm", 0, 10)
        await rs.set_offsets({"warm": (0, 0, 0)})
        await rs.claim_session("warm", "n1")
        batch = [msg(f"t/{i}", f"t/{i}", "t/#", "all") for i in range(64)]
        assert await client_commands(server.url, admin, lambda: rs.append(batch)) == ["evalsha"]
        got: list[Message] = []

        async def read() -> None:
            got.extend((await rs.read("all", 0, 1000)).messages)

        assert await client_commands(server.url, admin, read) == ["evalsha"]
        assert [m.topic for m in got] == [f"t/{i}" for i in range(64)]
        seqs = [m.seq for m in batch]
        assert [m.seq for m in got] == seqs and seqs == list(range(seqs[0], seqs[0] + 64))  # dense in a batch
        assert rs.last_seq() == seqs[-1]  # one counter: own appends are sealed at once
        assert await client_commands(server.url, admin, lambda: rs.set_offsets({"a": (1, 1, 0)})) == ["evalsha"]
        assert await client_commands(server.url, admin, lambda: rs.claim_session("a", "n1")) == ["evalsha"]
    finally:
        await admin.aclose()


async def test_acked_message_survives_redis_kill_and_restart(server: RedisServer, opened: OPEN) -> None:
    s = await opened(server.url)
    await s.append([msg("d/1", "d", payload=b"acked")])
    await s.put_session(SessionRecord("c1"))
    await s.set_offsets({"c1": (1, 1, 0)})
    _, epoch = await s.claim_session("c1", "n1")
    await s.sync()
    server.restart()  # kill -9: only what AOF fsynced survives
    # The same store recovers: idempotent calls retry once on a fresh connection, scripts reload after NOSCRIPT.
    got = (await s.read("d", 0, 10)).messages
    assert [(m.topic, m.payload) for m in got] == [("d/1", b"acked")]
    await s.append([msg("d/2", "d")])
    seqs = [m.seq for m in (await s.read("d", 0, 10)).messages]
    assert len(seqs) == 2 and seqs[0] < seqs[1]
    s2 = await opened(server.url)
    assert s2.last_seq() == seqs[1]  # a new process starts at the stored end
    rec = await s2.get_session("c1")
    assert rec is not None and (rec.offset, rec.sent_upto, rec.epoch, rec.owner) == (1, 1, epoch, "n1")


async def test_no_keyspace_scan_in_any_call(server: RedisServer, opened: OPEN) -> None:
    rs = await opened(server.url, partitions=3, retention_bytes=500)
    command(server.port, "CONFIG", "RESETSTAT")
    await rs.append([msg(f"{lv}/{i}", f"{lv}/{i}", f"{lv}/#", "spread") for lv in ("a", "b", "$SYS")
                     for i in range(5)])
    for t in ("a/1", "a/2/3", "b", "$SYS/x"):
        await rs.set_retained(t, msg(t))
    for f in ("#", "+/+", "a/#", "a/1", "$SYS/#"):
        await rs.match_retained(f)
    await rs.put_session(SessionRecord("c1"))
    await rs.claim_session("c1", "n")
    await rs.put_will(WillRecord("c1", msg("w")))
    await rs.list_sessions()
    await rs.list_wills()
    await rs.add_wildcards(["a/+"], "n")
    await rs.read("a/#", 0, 100)
    await rs.read("spread", 0, 100)
    assert await rs.enforce_retention() > 0
    stats = command(server.port, "INFO", "commandstats").decode()
    used = {line.split(":", 1)[0].removeprefix("cmdstat_") for line in stats.splitlines() if ":" in line}
    assert {"evalsha", "hset", "zadd"} <= used  # inner script commands are counted too
    # Paging through one hash or set (HSCAN/SSCAN: list_sessions, the indexes) is fine; walking the keyspace not.
    assert not used & {"scan", "keys"}


async def test_redis_down_raises_oserror_then_recovers(server: RedisServer, opened: OPEN) -> None:
    rs = await opened(server.url)
    await rs.append([msg("u/1", "u")])
    server.kill()
    calls: list[Callable[[], Awaitable[Any]]] = [
        lambda: rs.append([msg("u/2", "u")]), lambda: rs.read("u", 0, 10), lambda: rs.get_session("c"),
        lambda: rs.put_session(SessionRecord("c")), lambda: rs.set_offsets({"c": (1, 1, 0)}),
        lambda: rs.claim_session("c", "n"), lambda: rs.delete_session("c", 3), lambda: rs.wildcards(),
        lambda: rs.add_wildcards(["x/+"], "n"), lambda: rs.list_sessions(), lambda: rs.set_retained("u", msg("u")),
        lambda: rs.match_retained("#"), lambda: rs.list_wills(), lambda: rs.delete_will("c"), rs.seal_now,
    ]
    for call in calls:
        with pytest.raises(RedisUnavailable) as info:
            await asyncio.wait_for(call(), 5)
        assert isinstance(info.value, OSError)
    server.start()
    await rs.append([msg("u/3", "u")])
    assert [m.topic for m in (await rs.read("u", 0, 10)).messages] == ["u/1", "u/3"]  # the failed append: nothing


async def test_open_fails_cleanly_when_redis_is_down(server: RedisServer) -> None:
    server.kill()
    s = RedisStore(server.url, connect_timeout=0.5)
    with pytest.raises(RedisUnavailable):
        await s.open()
    with pytest.raises(StoreClosed):
        await s.read("q", 0, 1)
    await s.close()


async def test_open_refuses_another_partition_count(server: RedisServer, opened: OPEN) -> None:
    await opened(server.url, partitions=4)
    with pytest.raises(ValueError, match="4 partitions"):
        await opened(server.url, partitions=8)
    with pytest.raises(ValueError, match="from 1 to 64"):
        RedisStore(server.url, partitions=65)


async def test_retention_by_bytes_and_age_trims_bodies_and_queues(server: RedisServer, opened: OPEN) -> None:
    rs = await opened(server.url)
    admin = aioredis.Redis.from_url(server.url)
    try:
        batch = [msg(f"r/{i}", "r", f"own/{i}") for i in range(30)]
        await rs.append(batch)
        assert await rs.enforce_retention() == 0  # no limits configured
        rs.retention_bytes = sum([await admin.hstrlen("{tw:0}:msg", str(m.seq)) for m in batch[20:]])
        assert await rs.enforce_retention() == 20
        assert [m.topic for m in (await rs.read("r", 0, 100)).messages] == [f"r/{i}" for i in range(20, 30)]
        assert await admin.exists("{tw:0}:q:own/0", "{tw:0}:q:own/19") == 0  # emptied queues are gone
        assert [m.topic for m in (await rs.read("own/20", 0, 10)).messages] == ["r/20"]
        rs.retention_bytes = 0
        rs.retention_seconds = 1
        await asyncio.sleep(1.05)  # the behaviour under test: the records age past retention_seconds=1
        await rs.append([msg("r/new", "r")])
        assert await rs.enforce_retention() == 10
        assert [m.topic for m in (await rs.read("r", 0, 100)).messages] == ["r/new"]
        assert await admin.hlen("{tw:0}:msg") == 1
        assert await admin.zcard("{tw:0}:bt") == 1  # entries of deleted batches are dropped too
    finally:
        await admin.aclose()


async def test_retention_per_partition_visits_in_bounded_steps(server: RedisServer, opened: OPEN) -> None:
    rs = await opened(server.url, partitions=5, retention_bytes=5)  # one byte per partition: delete all
    # One batch: each partition's entry spans ~2500 seqs to visit, more than one retention step.
    await rs.append([msg(f"k/{i}", f"k/{i}", "k/#") for i in range(2500)])
    assert (await rs.stats())["messages"] == 2500
    assert await rs.enforce_retention() == 2500
    assert (await rs.read("k/#", 0, 10)).messages == [] and (await rs.stats())["messages"] == 0


async def test_any_partition_count_up_to_64_keeps_seqs_unique_and_sealed(server: RedisServer, opened: OPEN) -> None:
    a, b = await opened(server.url, partitions=7), await opened(server.url, partitions=7)
    batches = [[msg(f"n/{i}/{j}", f"n/{i}/{j}", "n/#") for j in range(9)] for i in range(6)]
    await asyncio.gather(*(s.append(batch) for s, batch in zip(itertools.cycle((a, b)), batches)))
    sent = [m for batch in batches for m in batch]
    assert len({m.seq for m in sent}) == len(sent)
    assert all(m.seq % 7 == zlib.crc32(m.topic.encode()) % 7 for m in sent)
    high = max(m.seq for m in sent)
    got = await a.read("n/#", 0, 100, seal=high + 12345)
    assert [m.seq for m in got.messages] == sorted(m.seq for m in sent) and got.upto >= high + 12345
    later = [msg(f"n/late/{j}") for j in range(14)]
    await b.append(later)
    assert min(m.seq for m in later) > got.upto


async def test_lua_retained_matcher_agrees_with_gateway_matcher(server: RedisServer, opened: OPEN) -> None:
    rs = await opened(server.url)
    rng = random.Random(7)
    words = ["a", "b", "", "$s"]
    topics = sorted({"/".join(rng.choice(words) for _ in range(rng.randint(1, 4))) for _ in range(80)})
    for t in topics:
        await rs.set_retained(t, msg(t))
    filters = {"#", "+", "+/#", "/#"}
    for _ in range(150):
        levels = [rng.choice([*words, "+"]) for _ in range(rng.randint(1, 4))]
        if rng.random() < 0.4:
            levels.append("#")
        filters.add("/".join(levels))
    for f in sorted(filters):
        got = sorted(m.topic for m in await rs.match_retained(f))
        assert got == [t for t in topics if matches(f, t)], f
    for t in topics[::2]:
        await rs.set_retained(t, None)
    assert sorted(m.topic for m in await rs.match_retained("#")) == [
        t for t in topics[1::2] if not t.startswith("$")
    ]


async def test_open_reports_whether_redis_fsyncs_every_write(server: RedisServer, opened: OPEN) -> None:
    assert (await opened(server.url)).durable is True
    command(server.port, "CONFIG", "SET", "appendfsync", "everysec")
    try:
        assert (await opened(server.url)).durable is False
    finally:
        command(server.port, "CONFIG", "SET", "appendfsync", "always")


# --- partitions: one server with 16, and the 3-master cluster ----------------------------------------------


async def test_round_trips_per_call_with_partitions(target: Target, opened: OPEN) -> None:
    s = await opened(target.url, partitions=P, seal_interval=3600)  # no background seals while counting
    topics = [f"t/{i}" for i in range(64)]
    await s.append([msg(t, t, "t/#") for t in topics])  # scripts loaded on every node
    await s.read("t/#", 0, 1)
    before = target.scripts_run()
    await s.append([msg(t, t, "t/#") for t in topics])
    assert target.scripts_run() - before == len({part(t) for t in topics})  # one per partition touched
    before = target.scripts_run()
    assert len((await s.read("t/5", 0, 100)).messages) == 2
    assert target.scripts_run() - before == 1  # a topic's queue: its partition only
    before = target.scripts_run()
    assert len((await s.read("t/#", 0, 1000)).messages) == 128
    assert target.scripts_run() - before == P  # a wildcard queue: every partition, pipelined


async def test_seqs_are_hybrid_clock_values_unique_and_ordered_per_topic(target: Target, opened: OPEN) -> None:
    a, b = await opened(target.url, partitions=P), await opened(target.url, partitions=P)
    topics = [f"h/{i}" for i in range(24)]
    sent: dict[str, list[int]] = {t: [] for t in topics}

    async def writer(s: RedisStore, mine: list[str]) -> None:
        for k in range(30):
            batch = [msg(mine[(k + j) % len(mine)]) for j in range(3)]
            await s.append(batch)
            for m in batch:
                sent[m.topic].append(m.seq)

    now_ticks = (time.time() * 1000 - EPOCH_MS) * TICKS
    await asyncio.gather(writer(a, topics[:12]), writer(b, topics[12:]))
    seqs = [s for v in sent.values() for s in v]
    assert len(set(seqs)) == len(seqs) == 180  # unique across partitions and nodes
    for t, v in sent.items():
        assert all(s % P == part(t) for s in v), t  # the partition number in the low bits
        assert v == sorted(v), t  # per topic: ascending in append order
    assert all(now_ticks - 1000 * TICKS < s < now_ticks + 5000 * TICKS for s in seqs)  # a clock, ms * 4096
    assert max(seqs) < MAX_SEQ
    # One node's batch spanning partitions reads back in batch order (no partition ran ahead here).
    batch = [msg(f"o/{i}", f"o/{i}", "o/#") for i in range(20)]
    await a.append(batch)
    got = await b.read("o/#", 0, 100, seal=max(m.seq for m in batch))
    assert [m.topic for m in got.messages] == [f"o/{i}" for i in range(20)]


async def test_partition_ahead_and_the_2_53_guard(target: Target, opened: OPEN) -> None:
    s = await opened(target.url, partitions=P, seal_interval=3600)
    admin = target.admin()
    try:
        t = "ahead/1"
        key = f"{{tw:{part(t)}}}:seq"
        far = (1 << 50) + part(t)
        await admin.set(key, far)
        first = msg(t, t, "ahead/#")
        await s.append([first, msg(t, t, "ahead/#")])
        assert first.seq == far + P  # a counter ahead of the clock carries the partition on
        await admin.set(key, MAX_SEQ - P + part(t))
        with pytest.raises(Exception, match="2\\^53"):
            await s.append([msg(t, t, "ahead/#")])
        assert len((await s.read("ahead/#", 0, 10)).messages) == 2  # the refused batch stored nothing
    finally:
        await admin.aclose()


async def test_upto_and_seal_on_a_topic_queue(target: Target, opened: OPEN) -> None:
    writer, reader = await opened(target.url, partitions=P), await opened(target.url, partitions=P)
    m = msg("a/1")
    await writer.append([m])
    got = await reader.read("a/1", 0, 10)  # another node: the topic's partition covers the append
    assert [x.seq for x in got.messages] == [m.seq] and got.upto >= m.seq
    sealed = await reader.read("b/2", 0, 10, seal=got.upto + 10**6)
    assert sealed.messages == [] and sealed.upto >= got.upto + 10**6
    late = msg("b/2")
    await writer.append([late])  # no later append lands at or below what a reader was told
    assert late.seq > sealed.upto
    await writer.append([msg("b/2"), msg("b/2")])
    cut = await reader.read("b/2", 0, 2)
    assert len(cut.messages) == 2 and cut.upto == cut.messages[-1].seq  # cut at the limit


async def test_upto_seal_and_last_seq_across_partitions_and_nodes(target: Target, opened: OPEN) -> None:
    a, b, c = [await opened(target.url, partitions=P) for _ in range(3)]
    ta, tb = topics_in({0, 1, 2, 3}, "w/a", 1)[0], topics_in({12, 13}, "w/b", 1)[0]
    ma = msg(ta, ta, "w/#")
    await a.append([ma])
    first = await c.read("w/#", 0, 100)
    assert all(m.seq <= first.upto for m in first.messages)  # complete up to upto, nothing beyond it
    sealed = await c.read("w/#", 0, 100, seal=ma.seq)  # e.g. told by a notify: every partition sealed to it
    assert [m.seq for m in sealed.messages] == [ma.seq] and sealed.upto >= ma.seq
    mb = msg(tb, tb, "w/#")
    await b.append([mb])  # another node, another partition: lands above what c was told
    assert mb.seq > sealed.upto
    own = msg(ta, ta, "w/#")
    await a.append([own])
    mine = await a.read("w/#", sealed.upto, 100)  # a node's own appends are covered by its reads
    assert own.seq in [m.seq for m in mine.messages] and mine.upto >= own.seq
    # the background seals of the open stores reach every partition
    await until(lambda: c.last_seq() >= own.seq, timeout=2, what="last_seq covering another node's append")
    mark = c.last_seq()
    later = [msg(t) for t in topics_in(set(range(P)), "w/z", 32)]
    await b.append(later)
    assert min(m.seq for m in later) > mark  # sealed: no append after it took a seq at or below it


async def test_wildcard_versions_refcounts_and_stale_refusal_stores_nothing(target: Target, opened: OPEN) -> None:
    a, b = await opened(target.url, partitions=P), await opened(target.url, partitions=P)
    v0, filters = await a.wildcards()
    assert (v0, filters) == (0, frozenset())
    v1 = await a.add_wildcards(["s/+", "x/#"], "a")
    assert v1 > v0 and await b.add_wildcards(["s/+"], "b") == v1  # a second holder, on another node: no change
    assert await b.wildcards() == (v1, frozenset({"s/+", "x/#"}))  # cluster-wide
    batch = [msg(f"s/{i}", f"s/{i}", "s/#") for i in range(20)]  # spans many partitions
    with pytest.raises(StaleWildcards):
        await b.append(batch, wildcard_version=v0)
    stats = await b.stats()
    assert stats["messages"] == 0 and (await b.read("s/#", 0, 100)).messages == []  # nothing stored anywhere
    indexed = [msg(f"s/{i}", f"s/{i}", "s/#", "s/+") for i in range(20)]
    await b.append(indexed, wildcard_version=v1)
    got = await a.read("s/+", 0, 100, seal=max(m.seq for m in indexed))  # as a notify would tell it
    assert len(got.messages) == 20
    assert await a.remove_wildcards(["s/+"], "a") == v1  # b still holds it
    v2 = await b.remove_wildcards(["s/+", "never/+"], "b")
    assert v2 > v1 and await a.wildcards() == (v2, frozenset({"x/#"}))
    with pytest.raises(StaleWildcards):
        await a.append([msg("s/0")], wildcard_version=v1)
    admin = target.admin()
    try:  # every partition's copy was raised before the change returned
        assert [int(await admin.get(f"{{tw:{p}}}:wv")) for p in range(P)] == [v2] * P
    finally:
        await admin.aclose()


async def test_an_append_overlapping_a_set_change_is_stored_whole(target: Target, opened: OPEN) -> None:
    s = await opened(target.url, partitions=P)
    v = await s.add_wildcards(["o/+"], "n")
    admin = target.admin()
    try:
        lagging = [p for p in range(P) if p % 2]
        for p in lagging:  # as if an add_wildcards were still raising the copies of those partitions
            await admin.set(f"{{tw:{p}}}:wv", v - 1)
        batch = [msg(t, t, "o/#") for t in topics_in(set(range(P)), "o/", 40)]
        await s.append(batch, wildcard_version=v)  # some partitions took it: the rest take their part too
        assert len((await s.read("o/#", 0, 100)).messages) == 40
        only_lagging = [msg(t, t, "o/#") for t in topics_in(set(lagging), "o/l", 5)]
        with pytest.raises(StaleWildcards):  # all its partitions refuse: nothing stored
            await s.append(only_lagging, wildcard_version=v)
        fresh = await opened(target.url, partitions=P)
        assert await fresh.wildcards() == (v, frozenset({"o/+"}))  # ... and repairs the copies left behind
        assert [int(await admin.get(f"{{tw:{p}}}:wv")) for p in range(P)] == [v] * P
        await s.append(only_lagging, wildcard_version=v)
        assert len((await s.read("o/#", 0, 100)).messages) == 45
    finally:
        await admin.aclose()


async def test_sessions_are_fenced_by_epochs(target: Target, opened: OPEN) -> None:
    n1, n2 = await opened(target.url, partitions=P), await opened(target.url, partitions=P)
    none, e1 = await n1.claim_session("c1", "n1")
    assert none is None and e1 == 1
    assert not await n1.put_session(SessionRecord("c1", offset=5, epoch=0))  # below the claim: refused
    assert await n1.get_session("c1") is None
    assert await n1.put_session(SessionRecord("c1", offset=5, owner="n1", epoch=e1))
    await n1.set_offsets({"c1": (6, 7, e1), "ghost": (1, 1, 99)})
    rec, e2 = await n2.claim_session("c1", "n2")
    assert e2 == e1 + 1 and rec is not None
    assert (rec.owner, rec.epoch, rec.offset, rec.sent_upto) == ("n2", e2, 6, 7)
    # n1 lost the client: its offsets, record and delete are all ignored now.
    await n1.set_offsets({"c1": (99, 99, e1)})
    assert not await n1.put_session(SessionRecord("c1", offset=99, owner="n1", epoch=e1))
    await n1.delete_session("c1", e1)
    got = await n2.get_session("c1")
    assert got is not None and (got.owner, got.epoch, got.offset) == ("n2", e2, 6)
    assert await n2.get_session("ghost") is None  # offsets of an unknown session create nothing
    await n2.set_offsets({"c1": (8, 9, e2)})
    assert [(r.client_id, r.offset, r.sent_upto, r.epoch) for r in await n1.list_sessions()] == [("c1", 8, 9, e2)]
    await n2.delete_session("c1", e2)
    assert await n1.get_session("c1") is None
    _, e3 = await n1.claim_session("c1", "n1")
    assert e3 == e2 + 1  # the epoch outlives the record
    assert not await n2.put_session(SessionRecord("c1", epoch=e2))
    await n2.delete_session("c1")  # -1: unconditional
    assert await n1.put_session(SessionRecord("c1", epoch=e3))


async def test_a_plain_queue_holding_other_topics_is_read_everywhere(target: Target, opened: OPEN) -> None:
    writer, reader = await opened(target.url, partitions=P), await opened(target.url, partitions=P)
    before = await reader.read("bag", 0, 10)  # read from its home partition only, before anything is marked
    topics = topics_in(set(range(P)) - {part("bag")}, "bag/", 6)
    batch = [msg(t, t, "bag") for t in topics]
    await writer.append(batch)
    assert min(m.seq for m in batch) > before.upto  # the mark sealed what the reader was told
    high = max(m.seq for m in batch)
    for s in (writer, reader):  # the writer knows; the reader learns it from the home partition's mark
        assert [m.topic for m in (await s.read("bag", 0, 100, seal=high)).messages] == topics


async def test_two_nodes_append_while_a_third_reads_the_merged_wildcard_queue(
    cluster: RedisClusterServers, opened: OPEN
) -> None:
    a, b, c = [await opened(cluster.url, partitions=P) for _ in range(3)]
    ta, tb = topics_in(set(range(8)), "m/a", 4), topics_in(set(range(8, 16)), "m/b", 4)
    appended: list[Message] = []
    done = asyncio.Event()

    async def writer(s: RedisStore, topics: list[str]) -> None:
        for k in range(60):
            batch = [msg(topics[(k + j) % 4], topics[(k + j) % 4], "m/#", payload=b"%d" % k)
                     for j in range(1 + k % 3)]
            await s.append(batch)
            appended.extend(batch)
            await asyncio.sleep(0)  # a turn of the loop: the two writers interleave

    async def writers() -> None:
        await asyncio.gather(writer(a, ta), writer(b, tb))
        done.set()

    seen: list[Message] = []
    cursor, reads_while_writing = 0, 0
    task = asyncio.create_task(writers())
    while not done.is_set() or not appended or cursor < max(m.seq for m in appended):
        seal = max(m.seq for m in appended) if done.is_set() else 0  # at the end: as told by a notify
        got = await c.read("m/#", cursor, 7, seal=seal)
        assert all(m.seq > cursor for m in got.messages) and got.upto >= cursor
        assert all(m.seq <= got.upto for m in got.messages)
        seen += got.messages
        reads_while_writing += bool(got.messages) and not done.is_set()
        cursor = got.upto
    await task
    assert reads_while_writing > 3  # the reader really ran alongside the writers
    # Walking by upto alone, the reader saw every message exactly once, ascending: nothing ever appeared
    # at or below an upto it had already been given.
    assert [m.seq for m in seen] == sorted(m.seq for m in appended)
    for t in ta + tb:
        order = [m.payload for m in seen if m.topic == t]
        assert order == [m.payload for m in appended if m.topic == t]  # per-topic order
