"""Consumer groups (`gateway.core.consumers`) on two in-process nodes sharing one store that answers every call late
and out of order (`DelayingStore`): consumers on both nodes compete for one group and each message is claimed
once; a requeued or lapsed claim comes back as a redelivery; a poll waits for the first message; a matcher
passes messages over without claiming them; on one node with a clock moved by hand, an unsettled claim comes
back exactly when its visibility timeout has passed. The protocol handlers (AMQP, RocketMQ) sit on exactly this API."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.gateway.fakeclock import FakeClock
from tests.store.delaying import DelayingStore
from tests.waiting import until
from tidewire.extensions.hooks import AllowAll
from tidewire.gateway.config import Settings
from tidewire.gateway.core.group_reader import Delivery
from tidewire.gateway.core.ingress import publish_future
from tidewire.gateway.node import Node
from tidewire.lookup.base import InProcessLookup
from tidewire.notify.base import LocalNotifier
from tidewire.store.base import GroupRecord, Message
from tidewire.store.embedded.engine import EmbeddedStore

pytestmark = pytest.mark.timeout(60)


class Recorder:
    """A consumer with a prefetch window; acks each delivery after `ack_after` s (never when None)."""

    def __init__(self, node: Node, group: str, prefetch: int, ack_after: float | None = 0.0,
                 visibility_ms: int = 60_000) -> None:
        self.node = node
        self.group = group
        self.prefetch = prefetch
        self.ack_after = ack_after
        self.visibility_ms = visibility_ms
        self.unacked = 0
        self.got: list[Delivery] = []

    def credit(self) -> int:
        return self.prefetch - self.unacked

    def deliver(self, deliveries: list[Delivery]) -> None:
        assert len(deliveries) <= self.credit()
        self.got += deliveries
        self.unacked += len(deliveries)
        if self.ack_after is not None:
            asyncio.get_running_loop().create_task(self._ack(deliveries))

    async def _ack(self, deliveries: list[Delivery]) -> None:
        await asyncio.sleep(self.ack_after or 0)  # a consumer that works a while on each message
        await self.node.groups.ack(self.group, [(d.claim.seq, d.claim.token) for d in deliveries])
        self.unacked -= len(deliveries)
        self.node.groups.wake(self.group)

    def payloads(self) -> list[bytes]:
        return [d.message.payload for d in self.got]


@pytest.fixture
async def nodes(tmp_path: Path) -> AsyncIterator[tuple[Node, Node]]:
    store = DelayingStore(EmbeddedStore(tmp_path, fsync="never"), 3.0, seed=7)
    await store.open()
    lookup = InProcessLookup()
    notifier = LocalNotifier(lookup)
    made = [Node(Settings(data_dir=tmp_path, port=0, sys_events=False, node_id=f"n{i}"), store, lookup, notifier,
                 AllowAll()) for i in (1, 2)]
    for node in made:
        await node.start()
    try:
        yield made[0], made[1]
    finally:
        for node in made:
            await node.stop()
        await store.close()


async def _publish(node: Node, topics: list[str]) -> None:
    now = int(time.time() * 1000)
    await asyncio.gather(*publish_future(node.publish, [Message(t, t.encode(), 1, timestamp_ms=now) for t in topics]))


async def _group(n1: Node, n2: Node, name: str, filters: list[str]) -> None:
    await n1.groups.declare(GroupRecord(name, filters))
    assert await n2.groups.get(name) is not None


async def test_consumers_on_two_nodes_claim_each_message_once(nodes: tuple[Node, Node]) -> None:
    n1, n2 = nodes
    await _group(n1, n2, "work", ["jobs/#", "urgent/+"])
    a, b = Recorder(n1, "work", 10, 0.001), Recorder(n2, "work", 10, 0.001)
    assert n1.groups.consume("work", a) and n2.groups.consume("work", b)
    topics = [f"jobs/{i}" for i in range(300)] + [f"urgent/{i}" for i in range(100)] + ["other/x"]
    await _publish(n1, topics[:200])
    await _publish(n2, topics[200:])
    await until(lambda: len(a.got) + len(b.got) >= 400, timeout=10)
    await asyncio.sleep(0.3)  # absence: a message claimed twice would arrive now (no event to wait on)
    everything = a.payloads() + b.payloads()
    assert sorted(everything) == sorted(t.encode() for t in topics if t != "other/x")
    assert a.got and b.got
    assert all(d.claim.deliveries == 1 for d in a.got + b.got)


async def test_requeued_and_lapsed_claims_come_back_as_redeliveries(nodes: tuple[Node, Node]) -> None:
    n1, n2 = nodes
    await _group(n1, n2, "rq", ["rq/#"])
    holder = Recorder(n1, "rq", 5, None, visibility_ms=300)  # never acks: its claims lapse
    n1.groups.consume("rq", holder)
    await _publish(n1, ["rq/1", "rq/2"])
    await until(lambda: len(holder.got) == 2, timeout=10)
    first = holder.got[0]
    n1.groups.cancel("rq", holder)
    [moved] = await n1.groups.requeue("rq", [(first.claim.seq, first.claim.token)])
    assert moved.token != first.claim.token
    assert await n1.groups.ack("rq", [(first.claim.seq, first.claim.token)]) == []  # the old handle is dead
    taker = Recorder(n2, "rq", 5, 0.0)
    n2.groups.consume("rq", taker)
    await until(lambda: len(taker.got) == 2, timeout=5)  # the requeued one at once, the lapsed one in ~1 s
    assert sorted(taker.payloads()) == [b"rq/1", b"rq/2"]
    assert all(d.claim.deliveries == 2 for d in taker.got)


async def test_a_poll_waits_for_the_first_message(nodes: tuple[Node, Node]) -> None:
    n1, n2 = nodes
    await _group(n1, n2, "poll", ["poll/#"])
    started = time.monotonic()
    assert await n2.groups.receive("poll", 8, 30_000, 0.3) == []
    assert time.monotonic() - started >= 0.25
    receiving = asyncio.get_running_loop().create_task(n2.groups.receive("poll", 8, 30_000, 5.0))
    await until(lambda: n2.groups.consumer_count("poll") == 1, what="the poll waiting")
    await _publish(n1, ["poll/a"])
    got = await receiving
    assert [d.message.payload for d in got] == [b"poll/a"]
    assert await n1.groups.receive("poll", 8, 30_000, 0) == []  # claimed: no one else gets it


async def test_a_matcher_passes_messages_over_without_claiming(nodes: tuple[Node, Node]) -> None:
    n1, n2 = nodes
    await _group(n1, n2, "tagged", ["t/#"])
    for node in nodes:
        node.groups.matcher("tagged", lambda m: m.topic.endswith("/keep"))
    got = Recorder(n1, "tagged", 50)
    n1.groups.consume("tagged", got)
    await _publish(n2, ["t/1/keep", "t/2/drop", "t/3/keep", "t/4/drop"])
    await until(lambda: len(got.got) == 2, timeout=10)
    last = n2.store.last_seq()

    async def passed_over_everything() -> bool:  # a claim comes with the cursor's move and stays pending until acked
        cursor, pending = await n1.store.group_position("tagged")
        return cursor >= last and pending == 0

    await until(passed_over_everything, what=f"the group's cursor at the last message ({last}), no claim pending")
    assert got.payloads() == [b"t/1/keep", b"t/3/keep"]
    cursor, pending = await n1.store.group_position("tagged")
    assert pending == 0 or got.unacked
    assert cursor >= max(d.claim.seq for d in got.got)


async def test_an_unsettled_claim_comes_back_once_the_node_clock_passes_its_visibility(clocked_node: Node,
                                                                                      clock: FakeClock) -> None:
    """The delivery timeout of every protocol handler (AMQP consumer_timeout, RocketMQ invisible duration), on a
    clock moved by hand: hidden from every consumer until then, handed out again from then on as a redelivery
    (the lapsed handle settles nothing). No sleep."""
    node = clocked_node
    await node.groups.declare(GroupRecord("vt", ["vt/#"]))
    await asyncio.gather(*publish_future(node.publish, [Message("vt/1", b"one", 1)]))
    [first] = await node.groups.receive("vt", 8, 30_000, 0)
    assert first.claim.deliveries == 1 and first.message.timestamp_ms == int(clock.wall * 1000)
    clock.advance(29)
    assert await node.groups.receive("vt", 8, 30_000, 0) == []
    clock.advance(1)
    [again] = await node.groups.receive("vt", 8, 30_000, 0)
    assert (again.message.seq, again.claim.deliveries) == (first.message.seq, 2)
    assert await node.groups.ack("vt", [(first.claim.seq, first.claim.token)]) == []
    assert await node.groups.ack("vt", [(again.claim.seq, again.claim.token)]) == [again.claim.seq]
    clock.advance(3600)
    assert await node.groups.receive("vt", 8, 30_000, 0) == []  # settled: never again
