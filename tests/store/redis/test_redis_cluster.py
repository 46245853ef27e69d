"""The Redis engine on a real 3-master Redis Cluster: a crash of every master, and partitions spread over all."""

from __future__ import annotations

from redis.asyncio.cluster import RedisCluster

from tests.store.redis.redis_cluster_support import (  # noqa: F401 - fixtures are used by name
    OPEN,
    P,
    cluster,
    msg,
    opened,
    topics_in,
)
from tests.store.redis_server import RedisClusterServers, command
from tidewire.store.base import SessionRecord


async def test_cluster_restart_with_aof_loses_no_acked_write(
        cluster: RedisClusterServers, opened: OPEN) -> None:  # noqa: F811 - fixtures, by name
    s = await opened(cluster.url, partitions=P)
    batch = [msg(t, t, "k/#") for t in topics_in(set(range(P)), "k/", 48)]
    await s.append(batch)
    v = await s.add_wildcards(["k/+"], "n")
    await s.put_session(SessionRecord("c1", offset=3))
    await s.set_retained("k/r", msg("k/r"))
    await s.sync()
    cluster.restart()  # kill -9 every master; each comes back from its AOF
    got = await s.read("k/#", 0, 1000)  # the same store finds the restarted nodes
    assert [m.seq for m in got.messages] == sorted(m.seq for m in batch)
    s2 = await opened(cluster.url, partitions=P)
    assert s2.last_seq() >= max(m.seq for m in batch)
    assert await s2.wildcards() == (v, frozenset({"k/+"}))
    rec = await s2.get_session("c1")
    assert rec is not None and rec.offset == 3
    assert [m.topic for m in await s2.match_retained("k/#")] == ["k/r"]
    late = msg("k/late", "k/late", "k/#")
    await s2.append([late], wildcard_version=v)
    assert late.seq > max(m.seq for m in batch)


async def test_partitions_spread_over_the_three_masters(
        cluster: RedisClusterServers, opened: OPEN) -> None:  # noqa: F811 - fixtures, by name
    s = await opened(cluster.url, partitions=P)
    await s.append([msg(t, t, "all/#") for t in topics_in(set(range(P)), "spread/", 64)])
    admin = RedisCluster.from_url(f"redis://127.0.0.1:{cluster.ports[0]}")
    try:
        await admin.initialize()
        nodes = [admin.get_node_from_key(f"{{tw:{p}}}:seq") for p in range(P)]
        owners = {n.port for n in nodes if n is not None}
    finally:
        await admin.aclose()
    assert owners == set(cluster.ports)
    for port in cluster.ports:  # every master holds part of the log
        assert int(command(port, "DBSIZE")[1:].split(b"\r\n")[0]) > 0
    assert len((await s.read("all/#", 0, 1000)).messages) == 64
