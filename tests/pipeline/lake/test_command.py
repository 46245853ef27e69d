"""command.py: the lake as a node runs it (bridge and events as one task; cancelling it flushes everything)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.pipeline.lake.support import T0, assert_once, messages, read_lake
from tests.waiting import until
from tidewire.gateway.core.event_buffer import EventBuffer
from tidewire.pipeline.lake.command import Lake, run_lake
from tidewire.store.base import LogSlice
from tidewire.store.embedded.engine import EmbeddedStore


class ReadUpTo:
    """The store, recording how far its log has been read."""

    def __init__(self, store: EmbeddedStore) -> None:
        self.store = store
        self.upto = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.store, name)

    async def read_log(self, partition: int, after_seq: int, limit: int) -> LogSlice:
        got = await self.store.read_log(partition, after_seq, limit)
        self.upto = max(self.upto, got.upto)
        return got


async def test_cancelling_run_lake_flushes_messages_and_events(tmp_path: Path) -> None:
    store = EmbeddedStore(tmp_path / "data", fsync="never")
    await store.open()
    lake = tmp_path / "lake"
    events = EventBuffer(capacity=1000)
    source = ReadUpTo(store)
    try:
        task = asyncio.create_task(run_lake(source, lake, "node-a", events=events,  # type: ignore[arg-type]
                                            node="node-a", flush_seconds=60, idle_s=0.01, compression="none"))
        await store.append(messages(300))
        events.add("connected", T0, "d1")
        events.add("delivered", T0 + 5, "d2", topic="a/b", position=3, qos=1)
        # read and buffered; flush_seconds is far off
        await until(lambda: source.upto >= 300 and not events.items, what="the 300 records and 2 events taken")
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
    await until(lambda: lake.stats()["events"]["files"] == 1, what="the event flushed (flush_seconds 0.05)")
    assert read_lake(tmp_path, "events").num_rows == 1
    await lake.stop()
    await task
    assert lake.stats() == {"events": {"rows": 1, "files": 1, "flushes": 1, "failed": 0, "dropped": 0,
                                       "buffered": 0}}
