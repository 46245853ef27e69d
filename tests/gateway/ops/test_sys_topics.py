"""`$SYS` on the clock it is given, moved by hand: the uptime counts from the node's start on that clock, and
events and stats carry its time."""

from __future__ import annotations

import asyncio
import json

from tests.gateway.fakeclock import FakeClock
from tidewire.gateway.ops.sys_topics import Counters, SysTopics
from tidewire.store.base import Message


async def test_uptime_and_timestamps_are_the_clock_s() -> None:
    clock = FakeClock()
    published: list[Message] = []
    sys_topics = SysTopics("n1", published.append, clock=clock)
    clock.advance(42.5)
    sys_topics.stats(Counters(), {"clients/connected": 0})
    uptime = next(m for m in published if m.topic == "$SYS/brokers/n1/stats/uptime")
    assert uptime.payload == b"42" and uptime.timestamp_ms == int(clock.wall * 1000)
    published.clear()
    sys_topics.event("c1", "connected", address="127.0.0.1:1")
    await asyncio.sleep(0)  # published with the next batch
    [event] = published
    assert json.loads(event.payload)["ts"] == int(clock.wall * 1000) == event.timestamp_ms
