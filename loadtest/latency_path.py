"""The gateway's own share of publish → deliver latency: client and node in one process, on one event loop.

`python -m loadtest.latency_path [--messages 5000] [--interval-ms 1] [--qos 1] [--fsync batch] [--runs 3]`

One publisher and one subscriber (the load generator's client, `loadtest.client`) talk to an in-process node
(`gateway.server.serve`, embedded store in a temporary directory) over real loopback sockets, all on the same
uvloop loop, pinned to one core. Every message is published alone, `--interval-ms` apart, and its latency is
the time from the publisher's send to the subscriber's read: the node's path (parse, append, notify, dispatch,
push) plus a few loop ticks and two loopback sends, without the cross-process wake-ups and the second core
that make `python -m loadtest.bench latency` noisy. Reports p50/p99 per run and the medians; compare two
versions of the gateway with `PYTHONPATH=<their tree>`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from loadtest.client import Counters, Publisher, connect
from loadtest.scenarios import percentiles
from loadtest.servers import free_port
from tidewire.gateway.config import Settings
from tidewire.gateway.server import serve

TOPIC = "bench/latency_path"
WARMUP = 200  # messages before the measured ones: first-use costs (caches, encoders) are not per message
READY_TIMEOUT_S = 10.0
SETTLE_S = 0.5  # after the last publish: late deliveries still count


async def _one_run(messages: int, interval_s: float, qos: int, fsync: str, payload: int) -> tuple[float, float, int]:
    """(p50 µs, p99 µs, lost) of one run on a fresh node."""
    with tempfile.TemporaryDirectory(prefix="latency-path-") as tmp:
        port = free_port()
        settings = Settings(port=port, data_dir=Path(tmp), fsync=fsync, amqp_port=None, rocketmq_port=None,
                            sys_events=False)
        stop = asyncio.Event()
        server = asyncio.create_task(serve(settings, stop))
        try:
            counters = Counters()
            deadline = time.monotonic() + READY_TIMEOUT_S
            while True:
                try:
                    sub = await connect("127.0.0.1", port, "latency-path-sub", counters)
                    break
                except OSError:
                    if server.done() or time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.05)
            await sub.subscribe(TOPIC, qos)
            pub = await connect("127.0.0.1", port, "latency-path-pub", counters)
            pub.publisher = Publisher(counters, TOPIC, qos, 1, payload)
            for phase in (WARMUP, messages):
                counters.reset()
                for _ in range(phase):
                    pub.send(1)
                    await asyncio.sleep(interval_s)
                await asyncio.sleep(SETTLE_S)
            p50, p99, _ = percentiles(counters.latencies_ns)
            lost = counters.sent - (counters.received - counters.dup)
            sub.close()
            pub.close()
        finally:
            stop.set()
            await server
    return (p50 or 0.0) * 1000, (p99 or 0.0) * 1000, lost


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m loadtest.latency_path", description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=5000, help="measured messages per run")
    ap.add_argument("--interval-ms", type=float, default=1.0, help="between two publishes")
    ap.add_argument("--qos", type=int, choices=[0, 1, 2], default=1)
    ap.add_argument("--fsync", choices=["batch", "interval", "never"], default="batch")
    ap.add_argument("--payload", type=int, default=64, help="bytes (>= 20)")
    ap.add_argument("--runs", type=int, default=3, help="fresh nodes; medians are reported")
    ap.add_argument("--core", type=int, default=0, help="pin this process to this core (-1: do not pin)")
    args = ap.parse_args(argv)
    if args.core >= 0 and hasattr(os, "sched_setaffinity") and args.core < (os.cpu_count() or 1):
        os.sched_setaffinity(0, {args.core})
    import uvloop

    p50s: list[float] = []
    p99s: list[float] = []
    for run in range(max(1, args.runs)):
        p50, p99, lost = uvloop.run(_one_run(args.messages, args.interval_ms / 1000, args.qos, args.fsync,
                                             args.payload))
        p50s.append(p50)
        p99s.append(p99)
        print(f"run {run + 1}: p50 {p50:.1f} µs  p99 {p99:.1f} µs  lost {lost}", flush=True)
    print(f"median of {len(p50s)}: p50 {statistics.median(p50s):.1f} µs  p99 {statistics.median(p99s):.1f} µs "
          f"(QoS {args.qos}, fsync {args.fsync}, one message every {args.interval_ms:g} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
