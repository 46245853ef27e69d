"""command.py: the lake as a node runs it (bridge and events as one task; cancelling it flushes everything)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.pipeline.lake.support import T0, assert_once, messages, read_lake
from tidewire.gateway.core.events import EventBuffer
from tidewire.pipeline.lake.command import Lake, run_lake
from tidewire.store.embedded.engine import EmbeddedStore


async def test_cancelling_run_lake_flushes_messages_and_events(tmp_path: Path) -> None:
    store = EmbeddedStore(tmp_path / "data", fsync="never")
    await store.open()
    lake = tmp_path / "lake"
    events = EventBuffer(capacity=1000)
    try:
        task = asyncio.create_task(run_lake(store, lake, "node-a", events=events, node="node-a",
                                            flush_seconds=60, idle_s=0.01, compression="none"))
        await store.append(messages(300))
        events.add("connected", T0, "d1")
        events.add("delivered", T0 + 5, "d2", topic="a/b", position=3, qos=1)
        await asyncio.sleep(0.3)  # read and buffered; flush_seconds is far off
        assert not (lake / "messages").exists()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert_once(lake, 300)
        ev = read_lake(lake, "events")
        assert sorted(ev.column("event").to_pylist()) == ["connected", "delivered"]
        assert set(ev.column("node").to_pylist()) == {"node-a"}
    finally:
        await store.close()


async def test_events_only_when_another_process_exports_the_log(tmp_path: Path) -> None:
    events = EventBuffer(capacity=10)
    lake = Lake(None, tmp_path, "node-b", events=events, bridge=False, flush_seconds=0.05)
    task = asyncio.create_task(lake.run())
    events.add("subscribed", T0, "d1", topic="a/#", qos=1)
    await asyncio.sleep(0.3)
    assert read_lake(tmp_path, "events").num_rows == 1
    await lake.stop()
    await task
    assert lake.stats() == {"events": {"rows": 1, "files": 1, "flushes": 1, "failed": 0, "dropped": 0,
                                       "buffered": 0}}
