"""Running compaction (`pipeline.lake.compaction`): in the background of a bridge, or once from the command line.

`BackgroundCompactor` is the bridge process's loop: every `CHECK_S` it compacts the hours closed for longer than
`after_s`, in a worker thread, so the bridge's event loop (its reads and timed flushes) keeps running; stopping
it ends the pass between two groups. `main(argv)` is `tidewire lake compact --lake DIR [--older-than 1h]`
(`python -m tidewire.pipeline.lake.compact_command`): one pass, its numbers printed as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from tidewire.pipeline.lake.compaction import CompactStats, compact_lake
from tidewire.pipeline.window import seconds

log = logging.getLogger(__name__)

CHECK_S = 60.0  # how often the bridge looks for hours to compact (an hour closes once an hour)


@dataclass(frozen=True, slots=True)
class CompactOptions:
    """The `lake_compact_*` settings."""

    target_bytes: int = 256 << 20
    after_s: float = 3600.0
    grace_s: float = 3600.0
    compression: str = "zstd"


def run_pass(lake: str | Path, opts: CompactOptions, older_than_s: float | None = None,
             clock: Callable[[], float] = time.time, stop: threading.Event | None = None) -> CompactStats:
    return compact_lake(lake, older_than_ms=int((opts.after_s if older_than_s is None else older_than_s) * 1000),
                        target_bytes=opts.target_bytes, grace_ms=int(opts.grace_s * 1000), clock=clock,
                        compression=opts.compression, stop=stop)


class BackgroundCompactor:
    """Compaction passes every `check_s` in a worker thread until `stop()`."""

    def __init__(self, lake: str | Path, opts: CompactOptions, check_s: float = CHECK_S,
                 clock: Callable[[], float] = time.time) -> None:
        self.lake, self.opts, self.check_s, self.clock = lake, opts, check_s, clock
        self.totals = CompactStats()
        self.passes = 0
        self.failures = 0
        self._stop = threading.Event()
        self._wake = asyncio.Event()

    async def run(self) -> None:
        while not self._stop.is_set():
            try:
                stats = await asyncio.to_thread(run_pass, self.lake, self.opts, None, self.clock, self._stop)
                self.totals.add(stats)
                self.passes += 1
                if stats.outputs or stats.deleted:
                    log.info("lake compaction: %d files into %d, %d replaced files deleted", stats.inputs,
                             stats.outputs, stats.deleted)
            except OSError as e:  # a full disk, a vanished directory: the next pass retries (and recovers)
                self.failures += 1
                log.error("lake compaction failed: %s", e)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.check_s)

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def stats(self) -> dict[str, object]:
        return {"passes": self.passes, "failures": self.failures, **asdict(self.totals)}


def _parser() -> argparse.ArgumentParser:
    d = CompactOptions()
    p = argparse.ArgumentParser(prog="tidewire lake compact",
                                description="Rewrite the closed hours' small files into few, exactly once.")
    p.add_argument("--lake", type=Path, required=True, help="the lake directory")
    p.add_argument("--older-than", type=seconds, default=d.after_s,
                   help="compact hours that ended at least this long ago (default 1h; 0: every ended hour)")
    p.add_argument("--target-bytes", type=int, default=d.target_bytes, help="size of the files written")
    p.add_argument("--grace", type=seconds, default=d.grace_s,
                   help="replaced files stay this long for readers that listed them (default 1h)")
    p.add_argument("--compression", default=d.compression, choices=["zstd", "snappy", "gzip", "lz4", "none"])
    p.add_argument("--log-level", default="INFO")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not args.lake.is_dir():
        print(f"tidewire lake compact: no lake at {args.lake}", file=sys.stderr)
        return 2
    opts = CompactOptions(args.target_bytes, args.older_than, args.grace, args.compression)
    try:
        stats = run_pass(args.lake, opts, args.older_than)
    except OSError as e:
        print(f"tidewire lake compact: {e}", file=sys.stderr)
        return 1
    print(json.dumps(asdict(stats)))
    if stats.skipped:
        print("tidewire lake compact: another compactor holds the lake's lock; nothing done", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
