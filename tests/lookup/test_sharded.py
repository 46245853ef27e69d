"""Slot table and sharded lookup: real RPC sockets, real redis-server membership, several fabrics in one loop."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

from tests.waiting import until
from tidewire.lookup.base import Lookup
from tidewire.lookup.fabric import ClusterFabric
from tidewire.lookup.rpc import RpcNode
from tidewire.lookup.sharded import ShardedLookup
from tidewire.lookup.slots import SLOTS, SlotTable, slot_of
from tidewire.notify.base import Notifier

SECRET = "fabric-test-secret"
INTERVAL, TTL = 0.05, 0.3


# --- slot table ---------------------------------------------------------------------------------------------


def test_slot_table_is_deterministic_and_balanced() -> None:
    members = [f"node-{i}" for i in range(5)]
    a = SlotTable(7, members)
    b = SlotTable(7, list(reversed(members)))
    assert [a.owner(s) for s in range(SLOTS)] == [b.owner(s) for s in range(SLOTS)]
    counts = Counter(a.owner(s) for s in range(SLOTS))
    assert set(counts) == set(members)
    assert all(abs(n - SLOTS / 5) < SLOTS / 5 * 0.15 for n in counts.values())
    assert all(0 <= slot_of(k) < SLOTS for k in ("", "a/b", "ü", "x" * 1000))
    assert SlotTable(1, []).owner_of("k") is None


def test_a_join_or_leave_moves_few_slots() -> None:
    three = SlotTable(1, ["a", "b", "c"])
    four = SlotTable(2, ["a", "b", "c", "d"])
    moved = [s for s in range(SLOTS) if three.owner(s) != four.owner(s)]
    assert all(four.owner(s) == "d" for s in moved)  # only to the newcomer
    assert abs(len(moved) - SLOTS / 4) < SLOTS / 4 * 0.15
    two = SlotTable(3, ["a", "c"])
    assert all(two.owner(s) == three.owner(s) for s in range(SLOTS) if three.owner(s) != "b")


# --- the lookup between two nodes, epochs set by hand --------------------------------------------------------


@contextlib.asynccontextmanager
async def pair() -> AsyncIterator[tuple[ShardedLookup, ShardedLookup]]:
    rpcs = [RpcNode(i, "127.0.0.1", 0, SECRET) for i in ("a", "b")]
    try:
        for r in rpcs:
            await r.start()
        for r in rpcs:
            r.set_peers({x.node_id: f"127.0.0.1:{x.port}" for x in rpcs})
        yield ShardedLookup("a", rpcs[0], repair_interval=0.02), ShardedLookup("b", rpcs[1], repair_interval=0.02)
    finally:
        for r in rpcs:
            await r.close()


def key_owned_by(table: SlotTable, node: str, prefix: str = "k") -> str:
    return next(f"{prefix}{i}" for i in range(10_000) if table.owner_of(f"{prefix}{i}") == node)


async def test_an_owner_answers_only_once_every_member_resynced() -> None:
    async with pair() as (la, lb):
        la.set_client_location("c-a", "a")  # held before any epoch: sent with the first resync
        la.set_membership(1, ["a", "b"])
        assert la.table is not None
        key = key_owned_by(la.table, "a")
        la.set_client_location(key, "a")
        await until(lambda: la._shard is not None and key in la._shard.clients and bool(lb._future),
                    what="a's own report applied, its epoch-1 stream held by b")
        assert la.local_client_nodes(key, 1) is None  # b has not reported for epoch 1
        assert await lb.client_location(key) is None
        lb.set_membership(1, ["a", "b"])
        await until(lambda: la.local_client_nodes(key, 1) == {"a"})
        assert await lb.client_location(key) == "a"
        assert await lb.client_location("c-a") == "a"
        assert la.local_client_nodes(key, 2) is None  # asked about another epoch: unknown

        # a newer epoch reaching an owner first is held until the owner learns it
        lb.set_membership(2, ["a", "b"])
        await until(lambda: any(payload[0] == 2 for _, payload in la._future), what="b's epoch-2 stream held by a")
        assert la.local_client_nodes(key, 1) == {"a"}
        la.set_membership(2, ["a", "b"])
        await until(lambda: la.local_client_nodes(key, 2) == {"a"})
        assert await lb.client_location(key) == "a"


async def test_a_gap_in_a_stream_is_repaired_by_a_resync() -> None:
    async with pair() as (la, lb):
        for lk in (la, lb):
            lk.set_membership(1, ["a", "b"])
        assert la.table is not None
        keys = [f"k{i}" for i in range(200) if la.table.owner_of(f"k{i}") == "b"][:5]
        await until(lambda: lb.stats()["lookup_complete"] == 1)
        la._out["b"].seq += 1  # as if one update to b had been lost
        for k in keys:
            la.set_client_location(k, "a")
        await until(lambda: all(lb.local_client_nodes(k, 1) == {"a"} for k in keys))
        assert lb.stats()["lookup_gaps"] >= 1 and lb.stats()["lookup_resyncs_asked"] == 1


async def test_queue_subscribers_are_counted_and_p2p_follows_the_client() -> None:
    async with pair() as (la, lb):
        for lk in (la, lb):
            lk.set_membership(1, ["a", "b"])
        assert la.table is not None
        q = key_owned_by(la.table, "b", "queue/")
        la.add_queue_subscriber(q, "a")
        la.add_queue_subscriber(q, "a")
        lb.add_queue_subscriber(q, "b")
        la.add_queue_subscriber(q, "zz")  # a node reports only itself
        await until(lambda: lb.nodes_for_queue(q) == {"a", "b"})
        assert la.nodes_for_queue(q) is None  # not a's slot
        la.remove_queue_subscriber(q, "a")
        # a barrier: a's stream to b is ordered, so a removal sent before this marker would arrive before it
        marker = key_owned_by(la.table, "b", "marker/")
        la.add_queue_subscriber(marker, "a")
        await until(lambda: lb.nodes_for_queue(marker) == {"a"}, what="the marker after the removal")
        assert lb.nodes_for_queue(q) == {"a", "b"}  # one local reader left
        la.remove_queue_subscriber(q, "a")
        await until(lambda: lb.nodes_for_queue(q) == {"b"})
        client = key_owned_by(la.table, "b", "client-")
        la.set_client_location(client, "a")
        await until(lambda: lb.nodes_for_queue("p2p#" + client) == {"a"})


# --- fabrics on a real redis-server --------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def fabrics(redis: Any, *ids: str) -> AsyncIterator[dict[str, ClusterFabric]]:
    made: dict[str, ClusterFabric] = {}
    try:
        for i in ids:
            made[i] = ClusterFabric(i, redis, secret=SECRET, heartbeat_interval=INTERVAL, member_ttl=TTL)
            await made[i].start()
        await settled(made.values())
        yield made
    finally:
        for f in made.values():
            await f.stop()


async def settled(fabs: Any, timeout: float = 5.0) -> None:
    """Every fabric on the same epoch with the same members, every owner complete."""
    fabs = list(fabs)

    def done() -> bool:
        epochs = {f.epoch for f in fabs}
        members = {frozenset(f.members) for f in fabs}
        return (len(epochs) == 1 and members == {frozenset(f.node_id for f in fabs)}
                and all(f.stats()["lookup_complete"] for f in fabs))

    await until(done, timeout)


def test_the_fabric_provides_the_node_interfaces() -> None:
    fabric = ClusterFabric("n", None, secret="s")
    lookup: Lookup = fabric.lookup
    notifier: Notifier = fabric.notifier
    assert lookup is fabric.lookup and notifier is fabric.notifier


async def test_a_location_set_on_a_is_read_on_c(redis: Any) -> None:
    async with fabrics(redis, "a", "b", "c") as f:
        table = f["a"].lookup.table
        assert table is not None
        clients = [f"client-{i}" for i in range(30)]
        assert {table.owner_of(c) for c in clients} == {"a", "b", "c"}
        for c in clients:
            f["a"].lookup.set_client_location(c, "a")

        async def all_on_a() -> bool:
            return [await f["c"].lookup.client_location(c) for c in clients] == ["a"] * 30

        await until(all_on_a)
        assert await f["b"].lookup.client_location("nobody") is None
        # takeover: connected on c, then a's late cleanup
        moved = clients[:10]
        for c in moved:
            f["c"].lookup.set_client_location(c, "c")

        async def moved_unknown() -> bool:  # on two nodes: unknown
            return [await f["b"].lookup.client_location(c) for c in moved] == [None] * 10

        await until(moved_unknown)
        for c in moved:
            f["a"].lookup.remove_client_location(c, "a")

        async def moved_to_c() -> bool:
            return [await f["b"].lookup.client_location(c) for c in moved] == ["c"] * 10

        await until(moved_to_c)


async def test_a_crashed_owner_makes_its_slots_unknown_until_the_resync(redis: Any) -> None:
    async with fabrics(redis, "a", "b", "c") as f:
        table = f["a"].lookup.table
        assert table is not None
        clients = [f"client-{i}" for i in range(60)]
        on_b = [c for c in clients if table.owner_of(c) == "b"]
        assert on_b
        for c in clients:
            f["a"].lookup.set_client_location(c, "a")
        await until(lambda: f["c"].lookup.client_location(on_b[0]))
        epoch = f["a"].epoch
        await f["b"].abandon()  # killed: no leave
        assert [await f["c"].lookup.client_location(c) for c in on_b] == [None] * len(on_b)
        survivors = [f["a"], f["c"]]
        await until(lambda: all(x.epoch > epoch and set(x.members) == {"a", "c"} for x in survivors), 5.0)
        await settled(survivors)
        assert [await f["c"].lookup.client_location(c) for c in clients] == ["a"] * len(clients)


async def test_a_broken_connection_resyncs_what_it_may_have_lost(redis: Any) -> None:
    async with fabrics(redis, "a", "b", "c") as f:
        table = f["a"].lookup.table
        assert table is not None
        clients = [f"client-{i}" for i in range(300)]
        rng = random.Random(7)
        sent = f["a"].lookup.counters["lookup_ops_sent"]
        for c in clients[:100]:
            f["a"].lookup.set_client_location(c, "a")
        await until(lambda: f["a"].lookup.counters["lookup_ops_sent"] >= sent + 100, what="the first 100 sent")
        for link in list(f["b"].rpc._inbound):
            link.abort("test", quiet=True)
        for c in clients[100:]:
            f["a"].lookup.set_client_location(c, "a")
            if rng.random() < 0.3:
                await asyncio.sleep(0)  # a turn of the loop: updates leave in several batches
        await settled(f.values())

        async def all_on_a() -> bool:
            return [await f["c"].lookup.client_location(c) for c in clients] == ["a"] * len(clients)

        await until(all_on_a)


async def test_a_graceful_leave_rebalances_without_waiting_for_the_ttl(redis: Any) -> None:
    async with fabrics(redis, "a", "b", "c") as f:
        for i in range(20):
            f["c"].lookup.set_client_location(f"client-{i}", "c")
        await f["b"].stop()
        rest = [f["a"], f["c"]]
        await until(lambda: all(set(x.members) == {"a", "c"} for x in rest), TTL / 2)
        await settled(rest)
        assert [await f["a"].lookup.client_location(f"client-{i}") for i in range(20)] == ["c"] * 20


async def test_kick_goes_to_the_node_holding_the_client_or_to_everyone(redis: Any) -> None:
    async with fabrics(redis, "a", "b", "c") as f:
        kicks: list[tuple[str, str, int]] = []
        for name, fab in f.items():
            fab.on_kick(lambda c, e, name=name: kicks.append((name, c, e)))  # type: ignore[misc]
        f["a"].lookup.set_client_location("k", "a")
        await until(lambda: f["c"].lookup.client_location("k"))
        await f["c"].kick("k", 7)
        assert kicks == [("a", "k", 7)]
        await f["c"].kick("unknown", 8)
        await until(lambda: len(kicks) == 3)
        assert sorted(kicks[1:]) == [("a", "unknown", 8), ("b", "unknown", 8)]
        assert f["c"].stats()["kicks_targeted"] == 1 and f["c"].stats()["kicks_broadcast"] == 1
