"""Cluster notify over real fabrics (RPC sockets, redis-server membership): targeted, merged, broadcast fallback."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

from tests.waiting import until
from tidewire.lookup.fabric import ClusterFabric
from tidewire.lookup.slots import SlotTable

SECRET = "notify-test-secret"
INTERVAL, TTL = 0.05, 0.3


class Cluster:
    def __init__(self, fabrics: dict[str, ClusterFabric]) -> None:
        self.f = fabrics
        self.events: dict[str, list[set[str]]] = {name: [] for name in fabrics}
        for name, fab in fabrics.items():
            fab.notifier.register(name, self.events[name].append)

    @property
    def table(self) -> SlotTable:
        table = next(iter(self.f.values())).lookup.table
        assert table is not None
        return table

    def queue_owned_by(self, node: str, prefix: str = "t/") -> str:
        return next(f"{prefix}{i}" for i in range(10_000) if self.table.owner_of(f"{prefix}{i}") == node)

    def received(self, node: str) -> set[str]:
        return {q for event in self.events[node] for q in event}

    def frames_in(self) -> dict[str, int]:
        return {name: fab.rpc.frames_received for name, fab in self.f.items()}

    async def subscribed(self, queue: str, *nodes: str) -> None:
        for node in nodes:
            self.f[node].lookup.add_queue_subscriber(queue, node)
        owner = self.table.owner_of(queue)
        assert owner is not None
        await until(lambda: self.f[owner].lookup.local_nodes_for_queue(queue, self.table.epoch) == set(nodes))

    async def unsubscribed(self, queue: str, *nodes: str) -> None:
        for node in nodes:
            self.f[node].lookup.remove_queue_subscriber(queue, node)
        owner = self.table.owner_of(queue)
        assert owner is not None
        await until(lambda: not set(nodes) & (self.f[owner].lookup.local_nodes_for_queue(queue, self.table.epoch)
                                              or set()))

    async def quiet(self, window: float = 0.05) -> None:
        """Until no node has received a frame for `window` seconds: stray lookup traffic (resyncs,
        heartbeat-driven work) is over before frames are counted, and a frame that should not be sent has had time
        to show (an absence: there is no event to wait on)."""
        seen, since = self.frames_in(), time.monotonic()

        def settled() -> bool:
            nonlocal seen, since
            now = self.frames_in()
            if now != seen:
                seen, since = now, time.monotonic()
            return time.monotonic() - since >= window

        await until(settled, what=lambda: f"no RPC frame for {window}s (frames in: {seen})")


@contextlib.asynccontextmanager
async def cluster(redis: Any, *ids: str, **options: Any) -> AsyncIterator[Cluster]:
    made: dict[str, ClusterFabric] = {}
    try:
        for i in ids:
            made[i] = ClusterFabric(i, redis, secret=SECRET, heartbeat_interval=INTERVAL, member_ttl=TTL, **options)
            await made[i].start()
        await until(lambda: len({f.epoch for f in made.values()}) == 1
                    and all(len(f.members) == len(ids) and f.stats()["lookup_complete"] for f in made.values()))
        yield Cluster(made)
    finally:
        for f in made.values():
            await f.stop()


async def test_events_go_only_to_interested_nodes(redis: Any) -> None:
    async with cluster(redis, "a", "b", "c", "d") as c:
        q_a, q_d = c.queue_owned_by("a"), c.queue_owned_by("d")
        await c.subscribed(q_a, "b")
        await c.subscribed(q_d, "b")
        await c.quiet()

        before = c.frames_in()
        c.f["a"].notifier.notify([q_a])  # a owns it: straight to b
        await until(lambda: c.events["b"] == [{q_a}])
        after = c.frames_in()
        assert after["b"] - before["b"] == 1
        assert after["c"] == before["c"] and after["d"] == before["d"]

        c.f["a"].notifier.notify([q_d])  # d owns it: a -> d -> b
        await until(lambda: c.events["b"] == [{q_a}, {q_d}])
        await c.quiet()
        final = c.frames_in()
        assert final["d"] - after["d"] == 1 and final["c"] == before["c"]
        assert c.events["a"] == c.events["c"] == c.events["d"] == []
        assert c.f["a"].stats()["notify_broadcasts"] == 0 and c.f["d"].stats()["notify_broadcasts"] == 0

        # more interested nodes: more event messages; the others still see nothing
        q_b = c.queue_owned_by("b")
        await c.subscribed(q_b, "a", "b", "c")
        await c.quiet()
        before = c.frames_in()
        c.f["a"].notifier.notify([q_b])
        await until(lambda: all(q_b in c.received(n) for n in "abc"))
        await c.quiet()
        assert c.frames_in()["d"] == before["d"]


async def test_a_local_subscriber_is_called_directly(redis: Any) -> None:
    async with cluster(redis, "a", "b") as c:
        q = c.queue_owned_by("a")
        await c.subscribed(q, "a")
        await c.quiet()
        sent = c.f["a"].rpc.frames_sent
        c.f["a"].notifier.notify([q])
        await until(lambda: c.events["a"] == [{q}])
        assert c.f["a"].rpc.frames_sent == sent


async def test_many_notifies_in_a_tick_are_one_event(redis: Any) -> None:
    async with cluster(redis, "a", "b", "c") as c:
        q1, q2 = c.queue_owned_by("c", "x/"), c.queue_owned_by("c", "y/")
        await c.subscribed(q1, "b")
        await c.subscribed(q2, "b")
        for _ in range(1000):
            c.f["a"].notifier.notify([q1])
        c.f["a"].notifier.notify([q2, q1])
        await until(lambda: c.received("b") == {q1, q2})
        await c.quiet()
        assert c.events["b"] == [{q1, q2}]
        stats = c.f["a"].stats()
        assert stats["notify_names"] == 1002 and stats["notify_merged"] == 1000
        assert stats["notify_route_msgs"] == 1 and c.f["c"].stats()["notify_event_msgs"] == 1


async def test_p2p_events_follow_the_client(redis: Any) -> None:
    async with cluster(redis, "a", "b", "c") as c:
        client = c.queue_owned_by("b", "client-")
        c.f["c"].lookup.set_client_location(client, "c")
        await until(lambda: c.f["b"].lookup.local_nodes_for_queue("p2p#" + client, c.table.epoch) == {"c"})
        c.f["a"].notifier.notify(["p2p#" + client])
        await until(lambda: c.events["c"] == [{"p2p#" + client}])
        await c.quiet()
        assert c.events["a"] == c.events["b"] == []


async def test_a_dead_owner_falls_back_to_broadcast_and_loses_nothing(redis: Any) -> None:
    async with cluster(redis, "a", "b", "c", "d") as c:
        on_d = [c.queue_owned_by("d", f"d{i}/") for i in range(5)]
        elsewhere = [c.queue_owned_by(n, f"{n}{i}/") for n in "abc" for i in range(3)]
        for q in on_d + elsewhere:
            await c.subscribed(q, "b")
        await c.f["d"].abandon()  # killed: its owner role is gone before anyone knows

        c.f["a"].notifier.notify([on_d[0]])
        await until(lambda: on_d[0] in c.received("b"))
        assert on_d[0] in c.received("c")  # it was broadcast
        assert c.f["a"].stats()["notify_broadcasts"] >= 1

        # through the removal of d, the new epoch and the resync: every event arrives
        survivors = [f for n, f in c.f.items() if n != "d"]
        sent: list[str] = []
        i = 0
        while i < 40 or not all(len(f.members) == 3 and f.stats()["lookup_complete"] for f in survivors):
            assert i < 1000, "the survivors never settled on a complete table of 3"
            names = [on_d[i % 5], elsewhere[i % 9]]
            sent += names
            c.f["a" if i % 2 else "c"].notifier.notify(names)
            i += 1
            await asyncio.sleep(0.02)  # pacing: notifies go on from d's death through the new epoch's resync
        await until(lambda: set(sent) <= c.received("b"))
        assert all(len(f.members) == 3 for f in survivors)


async def test_without_a_table_everything_is_broadcast_locally(redis: Any) -> None:
    fabric = ClusterFabric("lonely", redis, secret=SECRET)
    got: list[set[str]] = []
    fabric.notifier.register("lonely", got.append)
    fabric.notifier.register("other", lambda qs: None)  # another node's handler is not ours to call
    fabric.notifier.notify(["q"])
    await until(lambda: got == [{"q"}])
    assert fabric.stats()["notify_broadcasts"] == 1


async def test_a_leased_answer_makes_the_next_notify_one_hop(redis: Any) -> None:
    async with cluster(redis, "a", "b", "c", "d") as c:
        q = c.queue_owned_by("d")
        await c.subscribed(q, "b")
        await c.quiet()
        c.f["a"].notifier.notify([q])  # a -> d -> b, and d leases its answer ({b}) to a
        await until(lambda: c.events["b"] == [{q}] and c.f["a"].stats()["notify_leases_held"] == 1)
        await c.quiet()

        before = c.frames_in()
        c.f["a"].notifier.notify([q])
        await until(lambda: c.events["b"] == [{q}, {q}])
        await c.quiet()
        after = c.frames_in()
        assert after["b"] - before["b"] == 1
        assert after["d"] == before["d"] and after["c"] == before["c"]  # the owner is not asked again
        stats = c.f["a"].stats()
        assert stats["notify_route_msgs"] == 1 and stats["notify_direct_msgs"] == 1

        # a queue nobody reads costs no frame at all once its (empty) answer is leased
        empty = c.queue_owned_by("c", "none/")
        c.f["a"].notifier.notify([empty])
        await until(lambda: c.f["a"].stats()["notify_leases_held"] == 2)
        await c.quiet()
        sent = c.f["a"].rpc.frames_sent
        c.f["a"].notifier.notify([empty])
        await c.quiet()
        assert c.f["a"].rpc.frames_sent == sent


async def test_a_reader_that_joins_or_leaves_during_a_lease_is_followed(redis: Any) -> None:
    async with cluster(redis, "a", "b", "c", "d") as c:
        q = c.queue_owned_by("d")
        await c.subscribed(q, "b")
        c.f["a"].notifier.notify([q])
        await until(lambda: c.f["a"].stats()["notify_leases_held"] == 1 and c.received("b") == {q})
        c.f["a"].notifier.notify([q])  # on the lease
        await until(lambda: len(c.events["b"]) == 2)

        # c joins after a used its lease: the owner's update makes a tell c at once (it may have missed news)
        c.f["c"].lookup.add_queue_subscriber(q, "c")
        await until(lambda: c.received("c") == {q}, what=lambda: f"c got {c.events['c']}")
        assert c.f["a"].stats()["notify_catchup_msgs"] == 1 and c.f["d"].stats()["notify_update_msgs"] >= 1
        await c.quiet()

        before = c.frames_in()
        c.f["a"].notifier.notify([q])  # direct to both readers' nodes
        await until(lambda: len(c.events["b"]) == 3 and len(c.events["c"]) == 2)
        await c.quiet()
        assert c.frames_in()["d"] == before["d"]

        await c.unsubscribed(q, "b")
        await until(lambda: c.f["a"].notifier._held.nodes(q, c.table.epoch) == {"c"})
        await c.quiet()
        before = c.frames_in()
        c.f["a"].notifier.notify([q])
        await until(lambda: len(c.events["c"]) == 3)
        await c.quiet()
        assert c.frames_in()["b"] == before["b"] and len(c.events["b"]) == 3


async def test_leases_end_with_the_epoch_and_nothing_is_missed(redis: Any) -> None:
    async with cluster(redis, "a", "b", "c") as c:
        queues = [c.queue_owned_by(n, f"{n}/") for n in "bc"]
        for q in queues:
            await c.subscribed(q, "b")
        c.f["a"].notifier.notify(queues)
        await until(lambda: c.f["a"].stats()["notify_leases_held"] == 2)

        joiner = ClusterFabric("e", redis, secret=SECRET, heartbeat_interval=INTERVAL, member_ttl=TTL)
        await joiner.start()
        try:
            await until(lambda: all(f.epoch == joiner.epoch and f.stats()["lookup_complete"]
                                    for f in [*c.f.values(), joiner]))
            assert c.f["a"].stats()["notify_leases_held"] == 0
            assert c.f["b"].stats()["notify_leases_granted"] == c.f["c"].stats()["notify_leases_granted"] == 0
            seen = len(c.events["b"])
            c.f["a"].notifier.notify(queues)
            await until(lambda: len(c.events["b"]) > seen and set(queues) <= set().union(*c.events["b"][seen:]))
        finally:
            await joiner.stop()


async def test_lease_zero_always_routes_through_the_owner(redis: Any) -> None:
    async with cluster(redis, "a", "b", "d", notify_lease=0.0) as c:
        q = c.queue_owned_by("d")
        await c.subscribed(q, "b")
        for n in range(1, 4):
            c.f["a"].notifier.notify([q])
            await until(lambda n=n: len(c.events["b"]) == n)  # type: ignore[misc]
        stats = c.f["a"].stats()
        assert stats["notify_route_msgs"] == 3 and stats["notify_direct_msgs"] == 0
        assert stats["notify_leases_held"] == 0 and c.f["d"].stats()["notify_lease_msgs"] == 0


async def test_a_leased_p2p_answer_follows_the_client_to_another_node(redis: Any) -> None:
    async with cluster(redis, "a", "b", "c") as c:
        client = c.queue_owned_by("b", "client-")
        queue = "p2p#" + client
        c.f["c"].lookup.set_client_location(client, "c")
        await until(lambda: c.f["b"].lookup.local_nodes_for_queue(queue, c.table.epoch) == {"c"})
        c.f["a"].notifier.notify([queue])
        await until(lambda: c.events["c"] == [{queue}] and c.f["a"].stats()["notify_leases_held"] == 1)

        c.f["c"].lookup.remove_client_location(client, "c")  # the client moves to a itself
        c.f["a"].lookup.set_client_location(client, "a")
        await until(lambda: c.f["a"].notifier._held.nodes(queue, c.table.epoch) == {"a"})
        await c.quiet()
        sent = c.f["a"].rpc.frames_sent
        c.f["a"].notifier.notify([queue])
        await until(lambda: c.events["a"] == [{queue}])
        assert c.f["a"].rpc.frames_sent == sent  # its own handler, called directly
        assert c.events["c"] == [{queue}]


async def test_a_nodes_own_appends_come_back_at_once_and_go_only_to_the_others(redis: Any) -> None:
    async with cluster(redis, "a", "b", "c") as c:
        routed, leased, unread = c.queue_owned_by("c", "r/"), c.queue_owned_by("b", "l/"), c.queue_owned_by("a")
        for q in (routed, leased):
            await c.subscribed(q, "a", "b")
        await c.subscribed(unread, "a")
        names = {routed, leased, unread}
        assert c.f["a"].notifier.notify_from("a", names) == names  # a dispatches them itself, in this tick
        await until(lambda: c.received("b") == {routed, leased})
        await until(lambda: c.f["a"].stats()["notify_leases_held"] == 2)  # a owns `unread`: no lease needed
        assert c.f["a"].notifier.notify_from("a", names) == names  # now on leases
        await until(lambda: len(c.events["b"]) == 2)
        await c.quiet()
        assert c.events["a"] == [] and c.events["c"] == []  # a is never told of its own appends
        c.f["c"].notifier.notify_from("c", {routed})  # another node's append: a is told
        await until(lambda: c.events["a"] == [{routed}])
