"""What the lake's at-most-once event buffer loses under a flood of deliveries (issue 24).

`python -m loadtest.lake_events_bench [--messages 100000] [--subscribers 4] [--buffers 1000,10000,100000,1000000]`

For each buffer size (`lake_events_buffer`) a fresh gateway pinned to core 0 runs with `--lake` (its events
exporter only, no log bridge) and `--subscribers` QoS 1 MQTT subscribers of `ev/#` (this process, core 1); one
publisher sends `--messages` QoS 1 messages as fast as a 500-message window allows. Every delivery makes two
events (delivered, acked), so the gateway produces 2 x messages x subscribers delivery events at the delivery
rate. Once every subscriber has every message the gateway is stopped (SIGTERM: the exporter's last flush), and
the delivered/acked rows in the lake are counted: lost = produced - written (all of it `buffer_full`: the test
`tests/pipeline/test_lake_events.py` shows the metric counts exactly that). Prints one line per buffer size:
the delivery events' rate, written, lost and the fraction lost.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.dataset as ds

from loadtest import servers
from loadtest.client import Counters, MqttConn, Publisher, connect, disconnect
from tidewire.pipeline.lake.schema import EVENTS, EVENTS_SCHEMA

LOAD_CORE = 1
WINDOW = 500


def delivery_rows(lake: Path) -> int:
    path = lake / EVENTS
    if not any(path.rglob("*.parquet")):
        return 0
    table = ds.dataset(path, schema=EVENTS_SCHEMA, format="parquet", partitioning="hive").to_table(columns=["event"])
    return int(pc.sum(pc.is_in(table.column("event"), value_set=pc.cast(["delivered", "acked"], "string"))).as_py()
               or 0)


async def flood(port: int, messages: int, subscribers: int, timeout: float) -> float:
    """Seconds from the first publish until every subscriber has every message."""
    loop = asyncio.get_running_loop()
    subs: list[tuple[Counters, MqttConn]] = []
    for i in range(subscribers):
        counters = Counters(max_samples=0)
        conn = await _connect(port, f"ev-sub-{i}", counters)
        assert await conn.subscribe("ev/#", 1) == 1
        subs.append((counters, conn))
    pub_counters = Counters(max_samples=0)
    pub = await _connect(port, "ev-pub", pub_counters)
    pub.publisher = Publisher(pub_counters, "ev/data", 1, 1, 32, window=WINDOW)
    started = loop.time()
    sent = 0
    while sum(c.received for c, _ in subs) < messages * subscribers:
        if sent < messages:
            sent += pub.send(min(WINDOW, messages - sent))
        if loop.time() - started > timeout:
            raise TimeoutError(f"{sum(c.received for c, _ in subs)} of {messages * subscribers} delivered")
        await asyncio.sleep(0.001)
    elapsed = loop.time() - started
    await asyncio.sleep(0.5)  # the subscribers' last PUBACKs reach the gateway
    for _, conn in [*subs, (pub_counters, pub)]:
        await disconnect(conn)
    return elapsed


async def _connect(port: int, client_id: str, counters: Counters) -> MqttConn:
    return await connect("127.0.0.1", port, client_id, counters)


@dataclass(frozen=True, slots=True)
class Result:
    buffer: int
    produced: int  # delivery events the gateway made: delivered + acked per delivery
    written: int  # of them in the lake
    deliveries: int
    seconds: float

    def line(self) -> str:
        lost = self.produced - self.written
        return (f"buffer {self.buffer:>9,}: {self.produced:>9,} delivery events at "
                f"{self.produced / self.seconds:>9,.0f}/s ({self.deliveries / self.seconds:,.0f} deliveries/s): "
                f"written {self.written:>9,}, lost {lost:>9,} ({lost / self.produced:.1%})")


def run(buffer: int, messages: int, subscribers: int, timeout: float, core: int | None = servers.SERVER_CORE
        ) -> Result:
    lake = Path(tempfile.mkdtemp(prefix="lake-events-bench-"))
    try:
        server = servers.start_tidewire(core=core, extra_env={
            "TIDEWIRE_LAKE_DIR": str(lake), "TIDEWIRE_LAKE_BRIDGE": "false", "TIDEWIRE_LAKE_EVENTS_BUFFER": str(buffer),
            "TIDEWIRE_SYS_EVENTS": "false"})
        try:
            elapsed = asyncio.run(flood(server.port, messages, subscribers, timeout))
        finally:
            server.stop(timeout=30)
        return Result(buffer, 2 * messages * subscribers, delivery_rows(lake), messages * subscribers, elapsed)
    finally:
        shutil.rmtree(lake, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.lake_events_bench", description=__doc__.split("\n")[0])
    p.add_argument("--messages", type=int, default=100_000)
    p.add_argument("--subscribers", type=int, default=4)
    p.add_argument("--buffers", default="1000,10000,100000,1000000")
    p.add_argument("--timeout", type=float, default=300.0)
    args = p.parse_args(argv)
    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > 1:
        os.sched_setaffinity(0, {LOAD_CORE})
    for buffer in (int(b) for b in args.buffers.split(",")):
        print(run(buffer, args.messages, args.subscribers, args.timeout).line(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
