"""Redis-specific tests of `store.redis_store.RedisStore` (the shared contract is in test_contract.py).

A private redis-server per module (tests/store/redis_server.py), flushed before each test: round trips per
call (seen with MONITOR), durability across kill -9 with AOF, no keyspace scans, Redis down, retention, and
the Lua retained matcher against the gateway's own matcher.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio as aioredis

from gateway.topics import matches
from store.base import Message, SessionRecord, WillRecord
from store.redis_store import RedisStore, RedisUnavailable, StoreClosed
from tests.store.conftest import flush_redis
from tests.store.redis_server import RedisServer


@pytest.fixture
async def server(redis_server_for_module: RedisServer) -> RedisServer:
    redis_server_for_module.start()  # a test may have left it stopped
    await flush_redis(redis_server_for_module.url)
    return redis_server_for_module


@pytest.fixture
async def rs(server: RedisServer) -> AsyncIterator[RedisStore]:
    s = RedisStore(server.url, connect_timeout=0.5, socket_timeout=2.0)
    await s.open()
    try:
        yield s
    finally:
        await s.close()


@pytest.fixture
async def admin(server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    r = aioredis.Redis.from_url(server.url)
    try:
        yield r
    finally:
        await r.aclose()


def msg(topic: str, *queues: str, payload: bytes = b"x" * 100) -> Message:
    return Message(topic, payload, qos=1, publisher="p", queues=queues)


async def client_commands(url: str, admin: aioredis.Redis, action: Callable[[], Awaitable[object]]) -> list[str]:
    """Names of the commands clients sent while `action` ran (commands run inside scripts excluded)."""
    marker = f"end-{random.getrandbits(64)}"
    seen: list[str] = []
    await admin.ping()  # connected before MONITOR starts: its handshake is not counted
    watcher = aioredis.Redis.from_url(url)
    try:
        async with watcher.monitor() as mon:
            await action()
            await admin.echo(marker)
            while True:
                cmd = await asyncio.wait_for(mon.next_command(), 5)
                if cmd["client_type"] == "lua":
                    continue
                if marker in cmd["command"]:
                    return seen
                seen.append(cmd["command"].split(" ", 1)[0].lower())
    finally:
        await watcher.aclose()


async def test_one_round_trip_per_append_batch_and_per_read(
    server: RedisServer, rs: RedisStore, admin: aioredis.Redis
) -> None:
    await rs.append([msg("warm", "warm")])  # loads the scripts (NOSCRIPT once) before counting
    await rs.read("warm", 0, 10)
    await rs.set_offsets({"warm": (0, 0)})
    batch = [msg(f"t/{i}", f"t/{i}", "t/#", "all") for i in range(64)]
    assert await client_commands(server.url, admin, lambda: rs.append(batch)) == ["evalsha"]
    got: list[Message] = []

    async def read() -> None:
        got.extend(await rs.read("all", 0, 1000))

    assert await client_commands(server.url, admin, read) == ["evalsha"]
    assert [m.topic for m in got] == [f"t/{i}" for i in range(64)]
    assert [m.seq for m in got] == [m.seq for m in batch] == list(range(2, 66))
    assert await client_commands(server.url, admin, lambda: rs.set_offsets({"a": (1, 1), "b": (2, 2)})) == ["evalsha"]


async def test_acked_message_survives_redis_kill_and_restart(server: RedisServer) -> None:
    s = RedisStore(server.url)
    await s.open()
    try:
        await s.append([msg("d/1", "d", payload=b"acked")])
        await s.put_session(SessionRecord("c1"))
        await s.set_offsets({"c1": (1, 1)})
        await s.sync()
        server.restart()  # kill -9: only what AOF fsynced survives
        # The same store object recovers: idempotent calls retry once on a fresh connection (the pooled one
        # died with the server), and the scripts are reloaded after NOSCRIPT.
        got = await s.read("d", 0, 10)
        assert [(m.seq, m.topic, m.payload) for m in got] == [(1, "d/1", b"acked")]
        await s.append([msg("d/2", "d")])
        assert [m.seq for m in await s.read("d", 0, 10)] == [1, 2]
    finally:
        await s.close()
    s = RedisStore(server.url)
    await s.open()
    try:
        assert s.last_seq() == 2  # a new process starts from the stored sequence
        rec = await s.get_session("c1")
        assert rec is not None and (rec.offset, rec.sent_upto) == (1, 1)
    finally:
        await s.close()


async def test_no_keyspace_scan_in_any_call(rs: RedisStore, admin: aioredis.Redis) -> None:
    rs.retention_bytes = 500
    await admin.config_resetstat()
    await rs.append([msg(f"{lv}/{i}", f"{lv}/{i}", f"{lv}/#") for lv in ("a", "b", "$SYS") for i in range(5)])
    for t in ("a/1", "a/2/3", "b", "$SYS/x"):
        await rs.set_retained(t, msg(t))
    for f in ("#", "+/+", "a/#", "a/1", "$SYS/#"):
        await rs.match_retained(f)
    await rs.put_session(SessionRecord("c1"))
    await rs.put_will(WillRecord("c1", msg("w")))
    await rs.list_sessions()
    await rs.list_wills()
    await rs.read("a/#", 0, 100)
    assert await rs.enforce_retention() > 0
    stats = await admin.info("commandstats")
    used = {k.removeprefix("cmdstat_") for k in stats}
    assert used, "commandstats must list what ran"
    assert {"evalsha", "hset", "zadd"} <= used  # inner script commands are counted too
    assert not used & {"scan", "keys", "hscan", "sscan", "zscan"}


async def test_redis_down_raises_oserror_then_recovers(server: RedisServer, rs: RedisStore) -> None:
    await rs.append([msg("u/1", "u")])
    server.kill()
    calls: list[Callable[[], Awaitable[Any]]] = [
        lambda: rs.append([msg("u/2", "u")]), lambda: rs.read("u", 0, 10), lambda: rs.get_session("c"),
        lambda: rs.put_session(SessionRecord("c")), lambda: rs.set_offsets({"c": (1, 1)}),
        lambda: rs.list_sessions(), lambda: rs.set_retained("u", msg("u")), lambda: rs.match_retained("#"),
        lambda: rs.list_wills(), lambda: rs.delete_will("c"),
    ]
    for call in calls:
        with pytest.raises(RedisUnavailable) as info:
            await asyncio.wait_for(call(), 5)
        assert isinstance(info.value, OSError)
    server.start()
    await rs.append([msg("u/3", "u")])
    assert [m.topic for m in await rs.read("u", 0, 10)] == ["u/1", "u/3"]  # the failed append left nothing


async def test_open_fails_cleanly_when_redis_is_down(server: RedisServer) -> None:
    server.kill()
    s = RedisStore(server.url, connect_timeout=0.5)
    with pytest.raises(RedisUnavailable):
        await s.open()
    with pytest.raises(StoreClosed):
        await s.read("q", 0, 1)
    await s.close()


async def test_two_stores_share_one_sequence(server: RedisServer) -> None:
    a, b = RedisStore(server.url), RedisStore(server.url)
    await a.open()
    await b.open()
    try:
        await asyncio.gather(*(s.append([msg(f"n/{i}", "n")]) for i in range(20) for s in (a, b)))
        seqs = [m.seq for m in await a.read("n", 0, 100)]
        assert seqs == list(range(1, 41))
        # Each high-water mark knows only its own appends (the protocol weakness documented in the module).
        assert max(a.last_seq(), b.last_seq()) == 40
    finally:
        await a.close()
        await b.close()


async def test_retention_by_bytes_and_age_trims_bodies_and_queues(rs: RedisStore, admin: aioredis.Redis) -> None:
    await rs.append([msg(f"r/{i}", "r", f"own/{i}") for i in range(30)])
    assert await rs.enforce_retention() == 0  # no limits configured
    rs.retention_bytes = sum([await admin.hstrlen("{tw}:msg", str(seq)) for seq in range(21, 31)])
    assert await rs.enforce_retention() == 20
    assert [m.seq for m in await rs.read("r", 0, 100)] == list(range(21, 31))
    assert await admin.exists("{tw}:q:own/0", "{tw}:q:own/19") == 0  # emptied queues are gone
    assert [m.seq for m in await rs.read("own/20", 0, 10)] == [21]
    rs.retention_bytes = 0
    rs.retention_seconds = 1
    await asyncio.sleep(1.1)
    await rs.append([msg("r/new", "r")])
    assert await rs.enforce_retention() == 10
    assert [m.topic for m in await rs.read("r", 0, 100)] == ["r/new"]
    assert await admin.hlen("{tw}:msg") == 1
    assert await admin.zcard("{tw}:bt") == 1  # batch-time entries of deleted batches are dropped too


async def test_lua_retained_matcher_agrees_with_gateway_matcher(rs: RedisStore) -> None:
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


async def test_open_reports_whether_redis_fsyncs_every_write(server: RedisServer, admin: aioredis.Redis) -> None:
    s = RedisStore(server.url)
    await s.open()
    assert s.durable is True
    await s.close()
    await admin.config_set("appendfsync", "everysec")
    try:
        s = RedisStore(server.url)
        await s.open()
        assert s.durable is False
        await s.close()
    finally:
        await admin.config_set("appendfsync", "always")
