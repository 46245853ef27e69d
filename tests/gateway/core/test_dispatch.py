"""Notify dispatch (`gateway.core.dispatch`): a node's own append is pushed in the tick of the append, taken by the
cache as appended or read back while the store answers reads at once; rounds move to the dispatch task while
reads suspend, and back. Real node, real embedded store, paho subscribers over real sockets."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.integration.paho import PahoClient
from tidewire.extensions.hooks import AllowAll
from tidewire.gateway.config import Settings
from tidewire.gateway.core.dispatch import INLINE_MAX_MESSAGES
from tidewire.gateway.node import Node
from tidewire.gateway.server import open_listeners
from tidewire.lookup.base import InProcessLookup
from tidewire.notify.base import LocalNotifier
from tidewire.store.base import Message, Slice
from tidewire.store.embedded.engine import EmbeddedStore


class SlowReads(EmbeddedStore):
    """The embedded store whose reads wait one loop tick while `slow` (as a networked store's would)."""

    slow = False
    reads = 0  # of the queue "t" (sessions also read their P2P queue when they attach)

    async def read(self, queue: str, after_seq: int, limit: int, seal: int = 0) -> Slice:
        self.reads += queue == "t"
        if self.slow:
            await asyncio.sleep(0)  # the behaviour under test: a read that suspends for one turn of the loop
        return await super().read(queue, after_seq, limit, seal)


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[tuple[Node, SlowReads, int]]:
    settings = Settings(data_dir=tmp_path, port=0, sys_events=False, node_id="n1")
    store = SlowReads(tmp_path, fsync="never")
    await store.open()
    lookup = InProcessLookup()
    node = Node(settings, store, lookup, LocalNotifier(lookup), AllowAll())
    await node.start()
    servers = await open_listeners(node, None)
    try:
        yield node, store, servers[0].sockets[0].getsockname()[1]  # type: ignore[attr-defined]
    finally:
        for server in servers:
            server.close()
        await node.stop()
        await store.close()


async def _subscriber(port: int, topic: str) -> PahoClient:
    paho = PahoClient(port, "sub", version=5)
    await asyncio.to_thread(paho.connect)
    await asyncio.to_thread(paho.subscribe, [(topic, 1)])
    return paho


async def _published_in(gw: Node, behind: bool = False) -> int:
    """Publish one message and return how many loop ticks passed before it was pushed (0: in the append's).
    `behind`: first a message of "another writer" lands in the store unseen, so the cache must read the queue."""
    if behind:
        await gw.store.append([Message("t", b"other", qos=1, queues=gw.subscriptions.wildcards.queues_for("t"))])
    loop = asyncio.get_running_loop()
    before = gw.counters.messages_out
    ticks = 0
    pushed = loop.create_future()

    def probe() -> None:  # queued behind the flush task's wake-up: runs once per tick after it
        nonlocal ticks
        if gw.counters.messages_out > before:
            pushed.set_result(ticks)
        else:
            ticks += 1
            loop.call_soon(probe)

    gw.publish(Message("t", b"x", qos=1))  # wakes the flush loop: its step runs first in the next tick
    loop.call_soon(probe)
    return await asyncio.wait_for(pushed, 5.0)


async def test_own_append_is_pushed_in_the_tick_of_the_append(node: tuple[Node, SlowReads, int]) -> None:
    gw, store, port = node
    paho = await _subscriber(port, "t")
    try:
        assert [await _published_in(gw) for _ in range(3)] == [0] * 3
        assert store.reads == 0  # the cache took each batch as appended
        assert await _published_in(gw, behind=True) == 0  # read back (the store answers at once), same tick
        assert store.reads == 1
        got = await asyncio.to_thread(paho.expect, 5, 3.0)
        assert [m.payload for m in got] == [b"x"] * 3 + [b"other", b"x"]
        assert gw.dispatcher.inline
    finally:
        await asyncio.to_thread(paho.close)


async def test_rounds_go_to_the_dispatch_task_while_reads_suspend(node: tuple[Node, SlowReads, int]) -> None:
    gw, store, port = node
    paho = await _subscriber(port, "t")
    try:
        store.slow = True
        await _published_in(gw, behind=True)  # this round ran in the flush loop and found the read suspending
        assert not gw.dispatcher.inline
        reads = store.reads
        late = await _published_in(gw, behind=True)
        assert late >= 2 and store.reads == reads + 1  # the task's round: a wake-up, then the read's tick
        store.slow = False
        await _published_in(gw, behind=True)  # the task's round did not suspend: the flush loop's again
        assert gw.dispatcher.inline
        assert await _published_in(gw, behind=True) == 0
        got = await asyncio.to_thread(paho.expect, 8, 3.0)
        assert [m.payload for m in got] == [b"other", b"x"] * 4
        await asyncio.to_thread(paho.assert_nothing, 0.3)
    finally:
        await asyncio.to_thread(paho.close)


async def test_a_round_without_reads_is_the_flush_loops_and_keeps_the_mode(
        node: tuple[Node, SlowReads, int]) -> None:
    gw, store, port = node
    paho = await _subscriber(port, "t")
    try:
        store.slow = True
        await _published_in(gw, behind=True)
        assert not gw.dispatcher.inline
        reads = store.reads
        assert await _published_in(gw) == 0  # the cache took it as appended: no read, pushed in the same tick
        gw.publish(Message("nobody/listens", b"y"))  # nor does a queue without readers need a read
        assert await _published_in(gw) == 0  # a marker in the same batch: its round, pushed in the same tick
        assert store.reads == reads and not gw.dispatcher.inline
        got = await asyncio.to_thread(paho.expect, 4, 3.0)
        assert [m.payload for m in got] == [b"other", b"x", b"x", b"x"]
    finally:
        await asyncio.to_thread(paho.close)


async def test_a_large_batch_is_pushed_by_the_dispatch_task(node: tuple[Node, SlowReads, int]) -> None:
    gw, _store, port = node
    paho = await _subscriber(port, "t")
    try:
        loop = asyncio.get_running_loop()
        before = gw.counters.messages_out
        n = INLINE_MAX_MESSAGES + 1
        for i in range(n):  # one batch: the flush loop takes everything published before its next tick
            gw.publish(Message("t", str(i).encode(), qos=1))
        in_flush_tick: list[int] = []
        loop.call_soon(lambda: in_flush_tick.append(gw.counters.messages_out - before))
        got = await asyncio.to_thread(paho.expect, n, 3.0)
        assert in_flush_tick == [0]  # pushed in a later tick, by the task
        assert [m.payload for m in got] == [str(i).encode() for i in range(n)]
    finally:
        await asyncio.to_thread(paho.close)
