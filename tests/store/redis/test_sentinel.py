"""The Redis engine behind Redis Sentinel with `replicas = 1`: a primary, one replica, 3 real sentinels.

`sync()` (what a node awaits before acknowledging) refuses while the replica does not confirm, and after a
failover it appends again what only the dead primary had; the store follows the new primary without reopening,
after a kill -9 or a graceful failover (and reloads its scripts there: NOSCRIPT). Each test starts its own
servers (seconds): `slow`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from tests.store import redis_server
from tests.store.redis.redis_cluster_support import msg
from tests.store.redis_server import RedisSentinelServers, RedisServer, command
from tests.waiting import until
from tidewire.store.redis.conn import RedisUnavailable
from tidewire.store.redis.engine import RedisStore

pytestmark = pytest.mark.slow
TIMEOUT = 0.3  # replica_timeout of these stores (s)
BACKLOG = 2  # replica_backlog of these stores: messages appended and not yet confirmed


@pytest.fixture
async def servers(tmp_path: Path) -> AsyncIterator[RedisSentinelServers]:
    if not redis_server.sentinel_available():
        pytest.skip("redis-server / redis-sentinel are not installed")
    s = RedisSentinelServers(tmp_path)
    await asyncio.to_thread(s.start)
    try:
        yield s
    finally:
        await asyncio.to_thread(s.stop)


@pytest.fixture
async def store(servers: RedisSentinelServers) -> AsyncIterator[RedisStore]:
    s = RedisStore(servers.url, replicas=1, replica_timeout=TIMEOUT, replica_backlog=BACKLOG, connect_timeout=0.5,
                   socket_timeout=2.0)
    await s.open()
    try:
        yield s
    finally:
        await s.close()


def lag(servers: RedisSentinelServers) -> tuple[RedisServer, RedisServer]:
    """Pause the replica and cut its link: the primary's next writes reach it only once it resumes."""
    primary = servers.server(servers.primary_port())
    replica = next(s for s in servers.servers if s is not primary)
    replica.pause()
    assert command(primary.port, "CLIENT", "KILL", "TYPE", "replica").startswith(b":1")
    return primary, replica


async def eventually(step: Callable[[], Awaitable[object]], timeout: float) -> None:
    """Retry `step` (as a node's ack loop retries `sync`) until it stops raising RedisUnavailable."""
    async def ok() -> bool:
        try:
            await step()
        except RedisUnavailable:
            return False
        return True

    await until(ok, timeout, what="the store serving again", interval=0.1)


async def test_sync_refuses_until_the_replica_confirms(servers: RedisSentinelServers, store: RedisStore) -> None:
    await store.append([msg("t/a")])
    await store.sync()
    _, replica = lag(servers)
    await store.append([msg("t/b")])  # the primary takes it
    with pytest.raises(RedisUnavailable, match="0 of 1 replicas"):
        await store.sync()  # never acknowledged as durable
    await store.append([msg("t/c")])
    with pytest.raises(RedisUnavailable, match="replica_backlog 2"):  # what it keeps to append again is bounded
        await store.append([msg("t/d")])
    replica.resume()  # it reconnects and catches up
    await eventually(store.sync, 10.0)
    await store.append([msg("t/d")])  # confirmed: room again


async def test_failover_appends_again_what_only_the_old_primary_had(
        servers: RedisSentinelServers, store: RedisStore) -> None:
    first = msg("t/a", payload=b"confirmed")
    await store.append([first])
    await store.sync()
    primary, replica = lag(servers)
    await store.append([msg("t/a", payload=b"primary only")])
    with pytest.raises(RedisUnavailable):
        await store.sync()
    primary.kill()  # kill -9: the write the replica never got dies with it
    replica.resume()
    new = await asyncio.to_thread(servers.wait_failover, primary.port)
    assert new == replica.port
    await asyncio.to_thread(servers.rejoin, primary.port, new)  # a replica again: sync can be confirmed

    await eventually(store.sync, 15.0)  # the same store object: no reopen
    got = await store.read("t/a", 0, 100)
    assert [m.payload for m in got.messages] == [b"confirmed", b"primary only"]
    assert got.messages[1].seq > first.seq
    await store.append([msg("t/a", payload=b"after")])  # the scripts run on the new primary too
    await store.sync()
    assert [m.payload for m in (await store.read("t/a", 0, 100)).messages][-1] == b"after"


async def test_a_graceful_failover_is_followed_without_reopening(
        servers: RedisSentinelServers, store: RedisStore) -> None:
    await store.append([msg("t/a", payload=b"before")])
    await store.sync()
    old = servers.primary_port()
    # SENTINEL FAILOVER: the old primary stays up and becomes a replica (the sentinels close its clients).
    assert command(servers.sentinel_ports[0], "SENTINEL", "FAILOVER", redis_server.SENTINEL_MASTER).startswith(b"+OK")
    new = await asyncio.to_thread(servers.wait_failover, old)
    # The sentinels reconfigure it some seconds after the switch.
    await until(lambda: b"role:slave" in command(old, "INFO", "replication"), redis_server.SENTINEL_TIMEOUT,
                what="the old primary demoted", interval=0.05)

    await eventually(lambda: store.append([msg("t/a", payload=b"after")]), 10.0)
    await eventually(store.sync, 10.0)  # confirmed by the old primary, now a replica
    got = [m.payload for m in (await store.read("t/a", 0, 100)).messages]
    # "after" may be stored twice: its append began before the store learnt of the new primary (at-least-once).
    assert got[0] == b"before" and got.count(b"before") == 1 and set(got[1:]) == {b"after"}, got
    assert b"role:master" in command(new, "INFO", "replication")
