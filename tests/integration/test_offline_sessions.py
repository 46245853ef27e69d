"""Offline persistent sessions cost a node what their filters cost, not a pass over every filter per filter: a node
restarts over 20,000 stored sessions, each with its own wildcard, within the start timeout, and a message
published for one of them after the restart is kept for it."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from tests.integration.conftest import GatewayFactory, PahoFactory
from tidewire.store.base import NEVER_EXPIRES, SessionRecord, SubscriptionRecord
from tidewire.store.embedded.engine import EmbeddedStore

pytestmark = pytest.mark.tidewire_only

SESSIONS = 20_000


async def store_sessions(data_dir: Path, n: int) -> None:
    """What n clients with clean session off, one wildcard subscription each, leave in the store."""
    store = EmbeddedStore(data_dir)
    await store.open()
    try:
        for i in range(n):
            f = f"dev/{i}/+/cmd"
            await store.put_session(SessionRecord(f"off-{i}", expiry_interval=NEVER_EXPIRES, disconnected_at_ms=1,
                                                  subscriptions={f: SubscriptionRecord(f, 1)}))
    finally:
        await store.close()


@pytest.mark.slow
def test_a_node_restarts_over_20000_offline_wildcard_sessions_in_seconds(gateway_factory: GatewayFactory,
                                                                        paho_factory: PahoFactory) -> None:
    """Before, each stored wildcard was registered alone and the whole set read back after each: O(filters^2)
    at start (25,000 such sessions: 304 s); the start timeout is 10 s."""
    gw = gateway_factory(start=False, env={"TIDEWIRE_OVERLOAD_LOOP_LAG_MS": "0"})  # not refused when busy elsewhere
    asyncio.run(store_sessions(gw.data_dir, SESSIONS))
    started = time.monotonic()
    gw.start()
    took = time.monotonic() - started
    pub = paho_factory(gw.port, "off-pub")
    pub.connect()
    assert pub.publish("dev/12345/x/cmd", b"kept", qos=1) == 0
    sub = paho_factory(gw.port, "off-12345", version=4, clean=False)
    assert sub.connect().session_present
    m = sub.get(5)
    assert (m.topic, m.payload) == ("dev/12345/x/cmd", b"kept")
    sub.assert_nothing(0.3)
    print(f"start over {SESSIONS} offline sessions: {took:.1f} s")
