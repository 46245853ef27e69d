"""Running the lake: the log bridge and the events exporter together, in a node or as their own process.

In a node: `await run_lake(store, lake_dir, node_id, events=node.events, node=node_id)` as a task; cancelling
the task flushes and commits what is buffered. On its own (`python -m tidewire.pipeline.lake`, `tidewire lake run`):
`main(argv)` reads an embedded data directory another process writes (`--data-dir`) or a Redis store
(`--store redis://...`), read-only, and exports until SIGTERM/SIGINT, or with `--once` up to the end of the log.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import sys
from pathlib import Path
from typing import Any

from tidewire.gateway.core.event_buffer import EventBuffer
from tidewire.pipeline.lake.bridge import SPARKPLUG_BIRTHS, LakeBridge
from tidewire.pipeline.lake.compact_command import BackgroundCompactor, CompactOptions
from tidewire.pipeline.lake.event_export import EventExporter
from tidewire.pipeline.window import seconds
from tidewire.store.base import LogSource

log = logging.getLogger(__name__)

STORE_ENV = "TIDEWIRE_LAKE_STORE"
PARENT_CHECK_S = 1.0
BRIDGE_OPTIONS = ("flush_rows", "flush_bytes", "flush_seconds", "read_batch", "lease_ttl_ms", "idle_s", "compression",
                  "holder", "retention_days", "sparkplug_births")


class Lake:
    """The bridge (unless `bridge=False`: another process exports the log) and, given an event buffer, the
    events exporter, run and stopped together."""

    def __init__(self, source: LogSource | None, lake_dir: str | Path, owner: str, *,
                 events: EventBuffer | None = None, node: str = "", bridge: bool = True,
                 compact: CompactOptions | None = None, **opts: Any) -> None:
        unknown = set(opts) - set(BRIDGE_OPTIONS)
        if unknown:
            raise TypeError(f"unknown lake options: {sorted(unknown)}")
        if bridge and source is None:
            raise ValueError("the bridge needs a log source")
        self.bridge = LakeBridge(source, lake_dir, owner=owner, **opts) if bridge and source is not None else None
        self.exporter = None
        if events is not None:
            self.exporter = EventExporter(events, lake_dir, node or owner,
                                          flush_rows=opts.get("flush_rows", 100_000),
                                          flush_seconds=opts.get("flush_seconds", 5.0),
                                          compression=opts.get("compression", "zstd"))
        # Beside the bridge: compaction in a worker thread never holds up the bridge's reads and flushes.
        self.compactor = BackgroundCompactor(lake_dir, compact) if compact is not None and self.bridge else None
        self._stopping = asyncio.Event()

    async def run(self, once: bool = False) -> None:
        """Until `stop()` or cancellation (both flush first); with `once`, until the log is exported."""
        exporter_task = None
        if self.exporter is not None:
            exporter_task = asyncio.get_running_loop().create_task(self.exporter.run(), name="lake-events")
        compactor_task = None
        if self.compactor is not None:
            compactor_task = asyncio.get_running_loop().create_task(self.compactor.run(), name="lake-compaction")
        try:
            if self.bridge is not None:
                await self.bridge.run(once)
            elif not once:
                await self._stopping.wait()
        finally:
            if self.compactor is not None and compactor_task is not None:
                self.compactor.stop()  # ends its pass between two groups
                await asyncio.gather(compactor_task, return_exceptions=True)
            if self.bridge is not None:
                await self.bridge.stop()
            if self.exporter is not None and exporter_task is not None:
                await self.exporter.stop()
                await asyncio.gather(exporter_task, return_exceptions=True)

    async def stop(self) -> None:
        self._stopping.set()
        if self.compactor is not None:
            self.compactor.stop()
        if self.bridge is not None:
            await self.bridge.stop()
        if self.exporter is not None:
            await self.exporter.stop()

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.bridge is not None:
            out["messages"] = self.bridge.stats()
        if self.exporter is not None:
            out["events"] = self.exporter.stats()
        if self.compactor is not None:
            out["compaction"] = self.compactor.stats()
        return out


async def run_lake(source: LogSource | None, lake_dir: str | Path, owner: str, *, once: bool = False,
                   events: EventBuffer | None = None, node: str = "", bridge: bool = True,
                   **opts: Any) -> dict[str, Any]:
    """Run the lake (see `Lake`) until cancelled (or, with `once`, the log is exported); returns its stats.
    `opts`: LakeBridge's flush_rows, flush_bytes, flush_seconds, read_batch, lease_ttl_ms, idle_s, compression,
    holder, retention_days."""
    lake = Lake(source, lake_dir, owner, events=events, node=node, bridge=bridge, **opts)
    await lake.run(once)
    return lake.stats()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tidewire lake run", description="Export the log to a Parquet lake.")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--data-dir", type=Path, help="an embedded store's data directory (a node writes it)")
    src.add_argument("--store", default=os.environ.get(STORE_ENV),
                     help=f"redis://HOST:PORT/DB or redis-cluster://HOST:PORT[,HOST:PORT...] (default ${STORE_ENV}: "
                          "a URL with a password belongs there, not in the process list)")
    p.add_argument("--lake", type=Path, required=True, help="the lake directory")
    p.add_argument("--once", action="store_true", help="export up to the end of the log, then exit")
    p.add_argument("--owner", default=socket.gethostname(),
                   help="lease owner name (default: the host name, so a restarted bridge keeps its partitions)")
    p.add_argument("--partitions", type=int, default=0, help="the Redis store's partitions (0: its default)")
    p.add_argument("--flush-rows", type=int, default=100_000)
    p.add_argument("--flush-bytes", type=int, default=64 << 20)
    p.add_argument("--flush-seconds", type=float, default=5.0)
    p.add_argument("--read-batch", type=int, default=5000)
    p.add_argument("--lease-ttl-ms", type=int, default=15_000)
    p.add_argument("--idle-s", type=float, default=0.2, help="pause between reads once caught up")
    p.add_argument("--compression", default="zstd", choices=["zstd", "snappy", "gzip", "lz4", "none"])
    p.add_argument("--holder", default="lake", help="the bridge's hold on the log (another name for a second lake)")
    c = CompactOptions()
    p.add_argument("--no-compact", dest="compact", action="store_false",
                   help="leave compaction to `tidewire lake compact` or the Spark job")
    p.add_argument("--compact-target-bytes", type=int, default=c.target_bytes, help="size of compacted files")
    p.add_argument("--compact-after", type=seconds, default=c.after_s,
                   help="compact an hour this long after it ends (default 1h)")
    p.add_argument("--compact-grace", type=seconds, default=c.grace_s,
                   help="compacted files stay this long for readers that listed them (default 1h)")
    p.add_argument("--retention-days", type=int, default=0,
                   help="remove the lake's days older than this, export no record older (0: keep forever)")
    p.add_argument("--sparkplug-births", type=int, default=SPARKPLUG_BIRTHS,
                   help="Sparkplug B births (edge nodes and devices) whose aliases the bridge keeps")
    p.add_argument("--log-level", default="INFO")
    p.add_argument("--nice", type=int, default=0, help="lower this process's CPU priority by this much (a node "
                   "starts its bridge at 10: sharing a core, the gateway's deliveries come first)")
    p.add_argument("--parent-pid", type=int, default=0,
                   help="stop (flushing first) once this process is gone: a node's bridge never outlives it")
    return p


async def _open_source(args: argparse.Namespace) -> tuple[LogSource, Any]:
    """The log source and what to close at the end."""
    if args.data_dir is not None:
        from tidewire.store.embedded.tail import EmbeddedLogTail

        tail = EmbeddedLogTail(args.data_dir)
        await tail.open()
        return tail, tail
    from tidewire.store.redis.engine import RedisStore  # redis-py is an extra: imported only when asked for

    store = RedisStore(args.store, partitions=args.partitions)
    await store.open()
    return store, store


async def _main(args: argparse.Namespace) -> dict[str, Any]:
    source, closer = await _open_source(args)
    opts = {k: getattr(args, k) for k in BRIDGE_OPTIONS}
    compact = (CompactOptions(args.compact_target_bytes, args.compact_after, args.compact_grace, args.compression)
               if args.compact and not args.once else None)
    lake = Lake(source, args.lake, args.owner, compact=compact, **opts)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: loop.create_task(lake.stop()))
    watchdog = loop.create_task(_stop_when_orphaned(lake, args.parent_pid)) if args.parent_pid else None
    try:
        await lake.run(args.once)
    finally:
        if watchdog is not None:
            watchdog.cancel()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        close = getattr(closer, "close", None)
        if close is not None:
            with contextlib.suppress(Exception):
                result = close()
                if asyncio.iscoroutine(result):
                    await result
    return lake.stats()


async def _stop_when_orphaned(lake: Lake, parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        await asyncio.sleep(PARENT_CHECK_S)
    log.warning("lake: parent process %d is gone: stopping", parent_pid)
    await lake.stop()


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.data_dir is None and not args.store:
        parser.error(f"one of --data-dir or --store (or ${STORE_ENV}) is required")
    if args.nice > 0:
        os.nice(args.nice)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        stats = asyncio.run(_main(args))
    except (OSError, ValueError) as e:
        print(f"tidewire lake: {e}", file=sys.stderr)
        return 1
    print(json.dumps(stats, default=str))
    return 1 if stats.get("messages", {}).get("failed") else 0
