"""Membership on a real redis-server: join/leave epochs, expiry with exactly one reaper, id clashes, stalls."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.store import redis_server
from tests.waiting import until
from tidewire.lookup.membership import Membership, NodeIdTaken

INTERVAL, TTL = 0.05, 0.3


class Node:
    """A membership with its callbacks recorded."""

    def __init__(self, redis: Any, node_id: str, **kw: Any) -> None:
        self.changes: list[tuple[int, dict[str, str]]] = []
        self.dead: list[list[str]] = []
        self.dead_tokens: dict[str, str] = {}  # node id -> the token of its process declared dead
        self.expelled = 0
        self.m = Membership(redis, node_id, f"10.0.0.1:{len(node_id)}", interval=kw.pop("interval", INTERVAL),
                            ttl=kw.pop("ttl", TTL), on_change=lambda e, m: self.changes.append((e, m)),
                            on_dead=self._dead, on_expelled=self._expel, **kw)

    def _dead(self, dead: dict[str, str]) -> None:
        self.dead.append(list(dead))
        self.dead_tokens.update(dead)

    def _expel(self) -> None:
        self.expelled += 1


async def beats_by(*nodes: Node, count: int = 3) -> None:
    """Until each node has run `count` more background heartbeats (any of which could change something)."""
    start = [n.m.beats for n in nodes]
    await until(lambda: all(n.m.beats >= b + count for n, b in zip(nodes, start, strict=True)),
                what=f"{count} more heartbeats of {[n.m.node_id for n in nodes]}")


async def everyone_sees(nodes: list[Node]) -> None:
    """Until every node has seen every join (the same epoch, all of them members)."""
    ids = {n.m.node_id for n in nodes}
    await until(lambda: len({n.m.epoch for n in nodes}) == 1 and all(set(n.m.members) == ids for n in nodes),
                what=f"every node seeing all of {sorted(ids)}")


async def test_join_and_leave_bump_the_epoch(redis: Any) -> None:
    a, b = Node(redis, "a"), Node(redis, "b")
    await a.m.start()
    assert a.changes == [(1, {"a": "10.0.0.1:1"})]
    await b.m.start()
    assert (b.m.epoch, set(b.m.members)) == (2, {"a", "b"})
    await until(lambda: a.m.epoch == 2)
    assert a.changes[-1] == (2, {"a": "10.0.0.1:1", "b": "10.0.0.1:1"})
    before = len(a.changes)
    await beats_by(a, b)
    assert len(a.changes) == before  # heartbeats alone change nothing
    await b.m.leave()
    await until(lambda: a.m.epoch == 3)
    assert a.m.members == {"a": "10.0.0.1:1"}
    assert a.dead == [] and b.dead == []  # a graceful leave is no death
    await a.m.leave()
    assert await redis.hlen("{tw}:members") == 0


async def test_a_dead_node_is_reaped_by_exactly_one_survivor(redis: Any) -> None:
    nodes = [Node(redis, f"n{i}") for i in range(4)]
    for n in nodes:
        await n.m.start()
    await everyone_sees(nodes)
    epoch = nodes[0].m.epoch
    # n3's entry expires a TTL after its join, the last one: by then every survivor has been live for a TTL and
    # may reap it, so "exactly one" is a race among all three.
    await nodes[3].m.abandon()  # crash: no leave
    survivors = nodes[:3]
    await until(lambda: all(set(n.m.members) == {"n0", "n1", "n2"} for n in survivors))
    await beats_by(*survivors)  # a second reaper would report n3 on one of these
    reports = [d for n in survivors for d in n.dead]
    assert reports == [["n3"]]
    # the dead process's own token: a restarted n3 has another, so what the survivor releases is never its
    assert [n.dead_tokens for n in survivors if n.dead] == [{"n3": nodes[3].m.token}]
    assert all(n.m.epoch == epoch + 1 for n in survivors)
    for n in survivors:
        await n.m.leave()


async def test_a_node_id_held_by_a_live_process_is_refused(redis: Any) -> None:
    a = Node(redis, "same")
    await a.m.start()
    clash = Node(redis, "same")
    with pytest.raises(NodeIdTaken, match="in use"):
        await clash.m.start()
    assert a.m.members == {"same": "10.0.0.1:4"} and a.expelled == 0
    await a.m.leave()


async def test_a_restart_under_the_same_id_reports_its_crashed_predecessor_once(redis: Any) -> None:
    old = Node(redis, "solo")
    await old.m.start()
    await old.m.abandon()
    new = Node(redis, "solo")
    await new.m.start()  # waits for the old entry to expire instead of failing
    assert new.dead == [["solo"]]
    assert new.m.epoch == 2  # the removal and the new join are one change of the member set
    await new.m.leave()


async def beat_for(seconds: float, *nodes: Node) -> None:
    """Heartbeats by hand, as the background loop would."""
    deadline = asyncio.get_running_loop().time() + seconds
    while asyncio.get_running_loop().time() < deadline:
        for n in nodes:
            await n.m.beat()
        await asyncio.sleep(INTERVAL)  # the heartbeat interval: time passing is what the callers test


async def test_a_stall_of_everyone_declares_no_one_dead(redis: Any) -> None:
    """As after a Redis outage: all entries expired at once; the first to beat must not reap the others."""
    a, b = Node(redis, "a", autobeat=False), Node(redis, "b", autobeat=False)
    await a.m.start()
    await b.m.start()
    await beat_for(TTL * 1.2, a, b)
    await asyncio.sleep(TTL * 1.5)  # the behaviour under test: everyone stalls (no beats) until both entries expire
    await a.m.beat()
    assert a.dead == []  # a was expired itself: it may not judge b
    await beat_for(TTL / 2, a)
    assert a.dead == []  # live again, but not yet for a whole TTL
    await beat_for(TTL * 1.5, a, b)  # b is back in time
    assert a.dead == [] and b.dead == [] and set(a.m.members) == {"a", "b"}
    await beat_for(TTL * 1.5, a)  # now b really stops
    assert a.dead == [["b"]]


async def test_a_node_declared_dead_learns_it_was_expelled_and_can_rejoin(redis: Any) -> None:
    a, b = Node(redis, "a"), Node(redis, "b", autobeat=False)
    await a.m.start()
    await b.m.start()
    await beat_for(TTL, b)
    await until(lambda: a.dead == [["b"]])  # b stalls for longer than the TTL
    await b.m.beat()  # b wakes up
    assert b.expelled == 1 and b.m.expelled
    await b.m.beat()
    assert b.expelled == 1  # once
    assert set(a.m.members) == {"a"}
    epoch = a.m.epoch
    await b.m.rejoin()  # a new process's token: a live member again, the others see its join
    assert not b.m.expelled and set(b.m.members) == {"a", "b"} and b.m.epoch > epoch
    assert b.changes[-1] == (b.m.epoch, {"a": "10.0.0.1:1", "b": "10.0.0.1:1"})
    await b.m.beat()
    assert b.expelled == 1 and not b.m.expelled
    await until(lambda: set(a.m.members) == {"a", "b"})
    await a.m.leave()


async def test_membership_runs_on_redis_cluster(tmp_path: Path) -> None:
    """Every key under one hash tag: the scripts run unchanged on a real 3-master Redis Cluster."""
    from redis.asyncio.cluster import ClusterNode, RedisCluster

    if not redis_server.available():
        pytest.skip("redis-server is not installed")
    servers = redis_server.RedisClusterServers(tmp_path / "cluster")
    servers.start()
    client = RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", p) for p in servers.ports])
    try:
        nodes = [Node(client, f"n{i}") for i in range(3)]
        for n in nodes:
            await n.m.start()
        await everyone_sees(nodes)  # n2 expires a TTL after its join: every survivor may reap it by then
        await nodes[2].m.abandon()
        await until(lambda: all(set(n.m.members) == {"n0", "n1"} for n in nodes[:2]))
        assert [d for n in nodes[:2] for d in n.dead] == [["n2"]]
        for n in nodes[:2]:
            await n.m.leave()
    finally:
        await client.aclose()
        servers.stop()


def test_ttl_must_cover_two_heartbeats() -> None:
    with pytest.raises(ValueError):
        Membership(None, "a", "h:1", interval=1.0, ttl=1.5)


async def test_advertised_services_follow_membership(redis: Any) -> None:
    """What a node advertises (its RocketMQ endpoint) reaches the others with a new epoch and leaves with it."""
    a, b = Node(redis, "a"), Node(redis, "b")
    await a.m.start()
    await b.m.start()
    epoch = b.m.epoch
    b.m.advertise("rocketmq", "10.0.0.2:8081")
    await until(lambda: a.m.services.get("b") == {"rocketmq": "10.0.0.2:8081"}, what="b's endpoint at a")
    assert a.m.epoch > epoch
    assert a.m.services["a"] == {}
    await b.m.abandon()  # crash: a reaps it
    await until(lambda: "b" not in a.m.services, what="b's endpoint gone with b")
    await a.m.leave()
    assert await redis.hlen("{tw}:members:svc") == 0
