"""A session merging several queues never moves its cursor past a message not yet visible in one of them.

The store is shared (as with another node appending to it): a message lands in queue `x`, a later one in `y`,
and only `y` is notified (the notify for `x` is late, as from another node). The session must not deliver
`y`'s message and skip past `x`'s: it catches `x` up first and delivers both, in store order, once each.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.integration.paho import PahoClient
from tidewire.extensions.hooks import AllowAll
from tidewire.gateway.config import Settings
from tidewire.gateway.node import Node
from tidewire.gateway.server import open_listeners
from tidewire.lookup.base import InProcessLookup
from tidewire.notify.base import LocalNotifier
from tidewire.store.base import Message
from tidewire.store.embedded.engine import EmbeddedStore


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[tuple[Node, int]]:
    settings = Settings(data_dir=tmp_path, port=0, sys_events=False, node_id="n1")
    store = EmbeddedStore(tmp_path, fsync="never")
    await store.open()
    lookup = InProcessLookup()
    node = Node(settings, store, lookup, LocalNotifier(lookup), AllowAll())
    await node.start()
    servers = await open_listeners(node, None)
    try:
        yield node, servers[0].sockets[0].getsockname()[1]  # type: ignore[attr-defined]
    finally:
        for server in servers:
            server.close()
        await node.stop()
        await store.close()


async def test_late_notify_of_one_queue_loses_nothing(node: tuple[Node, int]) -> None:
    gw, port = node
    paho = PahoClient(port, "merger", version=5)
    try:
        await asyncio.to_thread(paho.connect)
        await asyncio.to_thread(paho.subscribe, [("x", 1), ("y", 1)])
        # Appended by "another node": x first, then y; only y's notify arrives.
        early = Message("x", b"early", qos=1, queues=gw.subscriptions.wildcards.queues_for("x"))
        late = Message("y", b"late", qos=1, queues=gw.subscriptions.wildcards.queues_for("y"))
        await gw.store.append([early])
        await gw.store.append([late])
        gw.notified({"y"})
        got = await asyncio.to_thread(paho.expect, 2, 3.0)
        assert [(m.topic, m.payload) for m in got] == [("x", b"early"), ("y", b"late")]
        gw.notified({"x"})  # the late notify changes nothing: no duplicate
        await asyncio.to_thread(paho.assert_nothing, 0.5)
    finally:
        await asyncio.to_thread(paho.close)
