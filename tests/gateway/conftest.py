"""Fixtures of the gateway tests: the integration suite's, which drive a real node process (`gateway_factory`, a
started gateway per call; `paho_factory`, paho clients), and an in-process node on a clock moved by hand
(`clock`, `clocked_node`); all closed at teardown."""

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.gateway.fakeclock import FakeClock
from tests.integration.conftest import gateway_factory, paho_factory
from tidewire.extensions.hooks import AllowAll
from tidewire.gateway.config import Settings
from tidewire.gateway.node import Node
from tidewire.lookup.base import InProcessLookup
from tidewire.notify.base import LocalNotifier
from tidewire.store.embedded.engine import EmbeddedStore

__all__ = ["clock", "clocked_node", "gateway_factory", "paho_factory"]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def clocked_node(tmp_path: Path, clock: FakeClock) -> AsyncIterator[Node]:
    """A started node (embedded store, no socket) that reads `clock` for every time it needs."""
    settings = Settings(data_dir=tmp_path, port=0, sys_events=False, node_id="n1", connect_timeout=10,
                        close_drain_timeout=2)
    store = EmbeddedStore(tmp_path, fsync="never")
    await store.open()
    lookup = InProcessLookup()
    node = Node(settings, store, lookup, LocalNotifier(lookup), AllowAll(), clock=clock)
    await node.start()
    try:
        yield node
    finally:
        await node.stop()
        await store.close()
