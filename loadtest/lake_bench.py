"""Benchmark of the lake bridge (issue 9): export rows/s and lag while the gateway takes JSON telemetry.

`python -m loadtest.lake_bench [--rate 20000] [--seconds 20] [--qos 0|1] [--mode in-node|process|both] [--runs 3]`

Each run starts a fresh gateway pinned to core 0 (`servers.start_tidewire`) and `--devices` MQTT publishers in
this process (pinned to core 1) that send small JSON telemetry (`tele/dev-NNNN/data`, ~80 bytes) at `--rate`
msgs/s in total for `--seconds`; optionally one subscriber of `tele/#` measures delivery latency (`--subscribe`).
Modes, each run once per round so their numbers are comparable:
- `none`: the gateway without a lake (the baseline: the bridge must never slow the gateway). After the load,
  the log is exported by a bridge in this process (`--once`): the bridge's catch-up capacity in rows/s.
- `in-node`: `serve --lake` (settings through TIDEWIRE_LAKE_*): bridge and events exporter share core 0.
- `process`: `python -m tidewire.pipeline.lake --data-dir D --lake L` (a read-only tail of the gateway's log), pinned to
  core 2 when there is one, else to core 1 beside the load generator.
Measured: the gateway's ingest rate (telemetry rows / their received-time span, from the lake), its CPU and
the bridge process's; exported rows/s; lag = now - received time of the newest exported row (the checkpoint's
`newest_received_ms`, sampled every 0.5 s during the load; before the first flush, now - load start); the
time from the end of the load until the lake holds every telemetry message; and the check that the lake holds
each message stored in the log exactly once (lake rows == log records, no repeated position).
Prints every run, then the median over runs per mode.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from loadtest import servers
from loadtest.bench import LOAD_CORE, pin_self, raise_nofile
from loadtest.client import Counters
from loadtest.lake_clients import JsonPublisher, LatencySubscriber, subscribe_latency
from loadtest.redis_proc import terminate
from loadtest.scenarios import _paced, close_all, open_many, percentiles
from tidewire.pipeline.lake.schema import MESSAGES, STATE_DIR

TOPIC_PREFIX = "tele/"
SAMPLE_S = 0.5  # lag sampling period
POLL_S = 0.1  # while waiting for the lake to hold everything
ACK_WAIT_S = 10.0  # QoS 1: how long to wait for the last PUBACKs
MODES = ("none", "in-node", "process")


@dataclass(slots=True)
class Config:
    """What every run is given (the command line's options)."""

    rate: float = 20_000.0
    seconds: float = 20.0
    qos: int = 0
    devices: int = 20
    window: int = 1000  # QoS 1: unacked publishes per device
    subscribe: bool = False
    flush_seconds: float | None = None  # None: the gateway's/bridge's default
    flush_rows: int | None = None
    drain_timeout: float = 60.0
    pin: bool = True
    bridge_core: int | None = None  # mode process; None: core 2 if there is one, else the load core


@dataclass(slots=True)
class RunResult:
    mode: str
    sent: int = 0
    acked: int = 0
    expected: int = 0  # telemetry messages the gateway took: sent (QoS 0) or acked (QoS 1)
    skipped: int = 0  # QoS 1 publishes not sent because a device's window was full
    ingest_rate: float = 0.0  # telemetry msgs/s the gateway stored (lake rows / received-time span)
    gateway_cpu: float = 0.0  # fraction of one core during the load
    bridge_cpu: float = 0.0  # the bridge process's (mode process)
    export_rate: float = 0.0  # rows/s exported from load start until the lake held everything (or catch-up)
    lag_ms: list[int] = field(default_factory=list)
    drain_s: float | None = None  # load end -> the lake holds every telemetry message
    lake_rows: int = 0
    lake_telemetry: int = 0
    log_records: int = 0
    log_telemetry: int = 0
    duplicates: int = 0
    files: int = 0
    latency_ms: tuple[float | None, float | None, float | None] = (None, None, None)
    bridge_core: int | None = None

    @property
    def exact(self) -> bool:
        return (self.duplicates == 0 and self.lake_rows == self.log_records
                and self.lake_telemetry == self.log_telemetry == self.expected > 0)

    def lag(self) -> tuple[float, float]:
        return (statistics.median(self.lag_ms), max(self.lag_ms)) if self.lag_ms else (0.0, 0.0)


# --- the lake, seen from outside ------------------------------------------------------------------------------
def checkpoint(lake: Path) -> tuple[int, int, int]:
    """(rows, position, newest_received_ms) over the lake's partition checkpoints (zeros before the first)."""
    rows = position = newest = 0
    state = lake / STATE_DIR
    if state.is_dir():
        for p in state.glob("checkpoint-p*.json"):
            try:
                cp = json.loads(p.read_text())
            except (OSError, ValueError):
                continue  # replaced while read: the next sample sees it
            rows += int(cp.get("rows", 0))
            position = max(position, int(cp.get("position", 0)))
            newest = max(newest, int(cp.get("newest_received_ms", 0)))
    return rows, position, newest


class LakeScan:
    """Totals over the lake's message files; each file is read once (a final name is only ever rewritten with
    the same rows)."""

    def __init__(self, lake: Path) -> None:
        self.root = lake / MESSAGES
        self._files: dict[str, tuple[int, int, pa.Array, int, int]] = {}

    def scan(self) -> tuple[int, int]:
        """(rows, telemetry rows)."""
        if self.root.is_dir():
            for dirpath, dirs, names in os.walk(self.root):
                dirs[:] = [d for d in dirs if not d.startswith((".", "_"))]
                for name in names:
                    path = os.path.join(dirpath, name)
                    if name.startswith((".", "_")) or not name.endswith(".parquet") or path in self._files:
                        continue
                    t = pq.read_table(path, columns=["position", "topic", "received_at"])
                    tele = pc.starts_with(t.column("topic"), TOPIC_PREFIX)
                    ms = t.column("received_at").cast(pa.int64()).filter(tele)
                    lo, hi = pc.min_max(ms).values() if len(ms) else (pa.scalar(0), pa.scalar(0))
                    self._files[path] = (t.num_rows, int(pc.sum(tele).as_py() or 0),
                                         t.column("position").combine_chunks(), lo.as_py() or 0, hi.as_py() or 0)
        return sum(f[0] for f in self._files.values()), sum(f[1] for f in self._files.values())

    def duplicates(self) -> int:
        if not self._files:
            return 0
        positions = pa.chunked_array([f[2] for f in self._files.values()])
        return len(positions) - int(pc.count_distinct(positions).as_py())

    def telemetry_span_ms(self) -> int:
        spans = [(f[3], f[4]) for f in self._files.values() if f[1]]
        return max(h for _, h in spans) - min(lo for lo, _ in spans) if spans else 0

    @property
    def files(self) -> int:
        return len(self._files)


async def count_log(data_dir: Path, upto: int) -> tuple[int, int]:
    """(records, telemetry records) with seq <= upto in the gateway's log, read with a read-only tail."""
    from tidewire.store.embedded.tail import EmbeddedLogTail

    tail = EmbeddedLogTail(data_dir)
    await tail.open()
    records = tele = after = 0
    try:
        while after < upto:
            sl = await tail.read_log(0, after, min(20_000, upto - after))
            batch = [m for m in sl.messages if m.seq <= upto]
            if not batch:
                break
            records += len(batch)
            tele += sum(1 for m in batch if m.topic.startswith(TOPIC_PREFIX))
            after = batch[-1].seq
        return records, tele
    finally:
        await tail.close()


async def catch_up(data_dir: Path, lake: Path, cfg: Config) -> float:
    """Export the whole log with a bridge in this process (`--once`); returns its rows/s."""
    from tidewire.pipeline.lake.command import run_lake
    from tidewire.store.embedded.tail import EmbeddedLogTail

    tail = EmbeddedLogTail(data_dir)
    await tail.open()
    try:
        t0 = time.perf_counter()
        stats = await run_lake(tail, lake, "lake-bench", once=True, **flush_opts(cfg))
        return float(stats["messages"]["rows"]) / max(time.perf_counter() - t0, 1e-9)
    finally:
        await tail.close()


# --- one run --------------------------------------------------------------------------------------------------
async def _load(server: servers.Server, lake: Path, mode: str, cfg: Config, bridge_pid: int | None,
                r: RunResult) -> None:
    """Publish for cfg.seconds, sampling the lag; then wait (bounded) until the lake holds every telemetry
    message (modes with a bridge running)."""
    counters = Counters()
    ep = server.endpoint()
    pubs, _ = await open_many(ep, cfg.devices, f"lb-{mode}", counters, 100)
    sub: LatencySubscriber | None = None
    try:
        if cfg.subscribe:
            sub = await subscribe_latency(ep, f"lb-{mode}-sub", TOPIC_PREFIX + "#")
        for i, c in enumerate(pubs):
            c.publisher = JsonPublisher(counters, f"{TOPIC_PREFIX}dev-{i:04d}/data", cfg.qos, i + 1, cfg.window)
        rows0 = checkpoint(lake)[0]
        cpu0 = server.cpu_seconds()
        bcpu0 = servers.cpu_seconds(bridge_pid) if bridge_pid else 0.0
        start_ms = int(time.time() * 1000)
        t0 = time.perf_counter()

        async def sample() -> None:
            while True:
                await asyncio.sleep(SAMPLE_S)
                r.lag_ms.append(int(time.time() * 1000) - max(checkpoint(lake)[2], start_ms))

        sampler = asyncio.create_task(sample()) if mode != "none" else None
        r.skipped = await _paced(pubs, cfg.rate, cfg.seconds)
        wall = time.perf_counter() - t0
        if sampler is not None:
            sampler.cancel()
        r.gateway_cpu = (server.cpu_seconds() - cpu0) / wall
        if bridge_pid:
            r.bridge_cpu = (servers.cpu_seconds(bridge_pid) - bcpu0) / wall
        t_end = time.perf_counter()
        deadline = t_end + ACK_WAIT_S
        while cfg.qos and counters.acked < counters.sent and time.perf_counter() < deadline:
            await asyncio.sleep(0.01)
        r.sent, r.acked = counters.sent, counters.acked
        r.expected = expected = counters.acked if cfg.qos else counters.sent
        if mode != "none":
            scan = LakeScan(lake)
            deadline = time.perf_counter() + cfg.drain_timeout
            seen = -1
            while time.perf_counter() < deadline:
                rows = checkpoint(lake)[0]
                if rows != seen and scan.scan()[1] >= expected:
                    r.drain_s = time.perf_counter() - t_end
                    r.export_rate = (rows - rows0) / (time.perf_counter() - t0)
                    break
                seen = rows
                await asyncio.sleep(POLL_S)
        if sub is not None:
            r.latency_ms = percentiles([us * 1000 for us in sub.samples_us])
    finally:
        await close_all(pubs + ([sub] if sub is not None else []))


async def _check(server: servers.Server, lake: Path, r: RunResult) -> None:
    """Compare the lake with the log up to the committed position (read between two equal checkpoint reads, so
    no flush is half seen)."""
    scan = LakeScan(lake)
    for _ in range(100):
        before = checkpoint(lake)
        r.lake_rows, r.lake_telemetry = scan.scan()
        if checkpoint(lake) == before:
            break
        await asyncio.sleep(POLL_S)
    r.log_records, r.log_telemetry = await count_log(server.workdir / "data", before[1])
    r.duplicates, r.files = scan.duplicates(), scan.files
    span = scan.telemetry_span_ms()
    r.ingest_rate = r.lake_telemetry / (span / 1000) if span else 0.0


async def _drive(server: servers.Server, lake: Path, mode: str, cfg: Config, bridge_pid: int | None,
                 r: RunResult) -> None:
    await _load(server, lake, mode, cfg, bridge_pid, r)
    if mode == "none":
        await asyncio.sleep(0.5)  # QoS 0: the gateway takes in what the sockets still held
        r.export_rate = await catch_up(server.workdir / "data", lake, cfg)
    await _check(server, lake, r)


def bridge_core(cfg: Config) -> int | None:
    n = os.cpu_count() or 1
    if cfg.bridge_core is not None:
        return cfg.bridge_core if cfg.bridge_core < n else None
    return 2 if n > 2 else (LOAD_CORE if n > LOAD_CORE else None)


def flush_opts(cfg: Config) -> dict[str, Any]:
    """The bridge's flush options given on the command line (the rest: the bridge's defaults)."""
    return {k: v for k, v in (("flush_rows", cfg.flush_rows), ("flush_seconds", cfg.flush_seconds)) if v is not None}


def start_bridge(data_dir: Path, lake: Path, cfg: Config, core: int | None, out: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "tidewire.pipeline.lake", "--data-dir", str(data_dir), "--lake", str(lake),
           "--owner", "lake-bench", "--log-level", "WARNING"]
    for k, v in flush_opts(cfg).items():
        cmd += ["--" + k.replace("_", "-"), str(v)]
    prefix = ["taskset", "-c", str(core)] if core is not None and shutil.which("taskset") else []
    with out.open("wb") as f:
        return subprocess.Popen([*prefix, *cmd], stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def _run_loop(coro: Coroutine[Any, Any, None]) -> None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        asyncio.run(coro)
        return
    uvloop.run(coro)


def run_mode(mode: str, cfg: Config) -> RunResult:
    """One run of `mode` on a fresh gateway and lake."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}")
    tmp = Path(tempfile.mkdtemp(prefix="lake-bench-"))
    lake = tmp / "lake"
    r = RunResult(mode)
    env = {"TIDEWIRE_LAKE_DIR": str(lake), **{f"TIDEWIRE_LAKE_{k.upper()}": str(v) for k, v in flush_opts(cfg).items()}}
    server = servers.start_tidewire(core=servers.SERVER_CORE if cfg.pin else None,
                                    extra_env=env if mode == "in-node" else {})
    bridge: subprocess.Popen[bytes] | None = None
    try:
        if mode == "process":
            r.bridge_core = bridge_core(cfg) if cfg.pin else None
            bridge = start_bridge(server.workdir / "data", lake, cfg, r.bridge_core, tmp / "bridge.log")
        _run_loop(_drive(server, lake, mode, cfg, bridge.pid if bridge else None, r))
        if bridge is not None and bridge.poll() is not None:
            raise RuntimeError(f"the bridge exited early: {(tmp / 'bridge.log').read_text()[-2000:]}")
    finally:
        if bridge is not None:
            terminate(bridge, 10.0)
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return r


# --- report ---------------------------------------------------------------------------------------------------
def format_run(r: RunResult, cfg: Config) -> str:
    lag50, lagmax = r.lag()
    lat = r.latency_ms
    lines = [
        f"mode {r.mode:<8} ingest {r.ingest_rate:,.0f} msgs/s (sent {r.sent:,}"
        + (f", acked {r.acked:,}, skipped {r.skipped:,}" if cfg.qos else "") + f"); gateway cpu {r.gateway_cpu:.0%}"
        + (f", bridge cpu {r.bridge_cpu:.0%} (core {r.bridge_core})" if r.mode == "process" else ""),
        f"  {'catch-up export' if r.mode == 'none' else 'export'} {r.export_rate:,.0f} rows/s"
        + ("" if r.mode == "none" else f"; lag p50 {lag50:,.0f} ms, max {lagmax:,.0f} ms; drain "
           + (f"{r.drain_s:.2f} s" if r.drain_s is not None else "TIMEOUT")),
        f"  lake {r.lake_rows:,} rows ({r.lake_telemetry:,} telemetry) in {r.files} files; log {r.log_records:,}"
        f" ({r.log_telemetry:,}); dup {r.duplicates}: {'exact' if r.exact else 'MISMATCH'}",
    ]
    if lat[0] is not None:
        lines.append(f"  delivery latency p50 {lat[0]:.2f} ms, p99 {lat[1]:.2f} ms, p999 {lat[2]:.2f} ms")
    return "\n".join(lines)


def format_medians(mode: str, rs: list[RunResult]) -> str:
    def med(values: list[float]) -> float:
        return statistics.median(values) if values else 0.0

    drains = [r.drain_s for r in rs if r.drain_s is not None]
    line = (f"median  {mode:<8} ingest {med([r.ingest_rate for r in rs]):,.0f} msgs/s, gateway cpu "
            f"{med([r.gateway_cpu for r in rs]):.0%}, {'catch-up ' if mode == 'none' else ''}export "
            f"{med([r.export_rate for r in rs]):,.0f} rows/s")
    if mode != "none":
        line += (f", lag p50 {med([r.lag()[0] for r in rs]):,.0f} ms / max {med([r.lag()[1] for r in rs]):,.0f} ms"
                 f", drain {med(drains):.2f} s" + (f" ({len(rs) - len(drains)} timed out)" if len(drains) < len(rs)
                                                   else ""))
    if mode == "process":
        line += f", bridge cpu {med([r.bridge_cpu for r in rs]):.0%}"
    p99 = [r.latency_ms[1] for r in rs if r.latency_ms[1] is not None]
    if p99:
        line += f", delivery p99 {med(p99):.2f} ms"
    return line + f"; exact in {sum(r.exact for r in rs)}/{len(rs)} runs"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m loadtest.lake_bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=20_000.0, help="telemetry msgs/s in total")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--qos", type=int, choices=[0, 1], default=0)
    ap.add_argument("--devices", type=int, default=20, help="publisher connections (one topic each)")
    ap.add_argument("--window", type=int, default=1000, help="QoS 1: unacked publishes per device")
    ap.add_argument("--mode", choices=["in-node", "process", "both"], default="both")
    ap.add_argument("--no-baseline", action="store_true", help="skip the run without a lake")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--subscribe", action="store_true", help="one subscriber of tele/#: delivery latency")
    ap.add_argument("--flush-seconds", type=float, help="lake flush interval (default: the bridge's, 5 s)")
    ap.add_argument("--flush-rows", type=int, help="rows per flush (default: the bridge's, 100,000)")
    ap.add_argument("--drain-timeout", type=float, default=60.0)
    ap.add_argument("--bridge-core", type=int, help="mode process: pin the bridge here (default: core 2 if there is "
                    "one, else the load generator's core 1; 0 shares the gateway's)")
    ap.add_argument("--no-pin", action="store_true")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    cfg = Config(rate=args.rate, seconds=args.seconds, qos=args.qos, devices=args.devices, window=args.window,
                 subscribe=args.subscribe, flush_seconds=args.flush_seconds, flush_rows=args.flush_rows,
                 drain_timeout=args.drain_timeout, pin=not args.no_pin, bridge_core=args.bridge_core)
    raise_nofile()
    if cfg.pin:
        pin_self(LOAD_CORE)
    modes = ([] if args.no_baseline else ["none"]) + (["in-node", "process"] if args.mode == "both" else [args.mode])
    print(f"lake bench: {cfg.rate:,.0f} msgs/s QoS {cfg.qos} from {cfg.devices} devices for {cfg.seconds:g} s; "
          f"gateway core {servers.SERVER_CORE if cfg.pin else '-'}, load core {LOAD_CORE if cfg.pin else '-'}, "
          f"bridge process core {bridge_core(cfg) if cfg.pin else '-'}", flush=True)
    results: dict[str, list[RunResult]] = {m: [] for m in modes}
    for i in range(args.runs):
        for mode in modes:
            r = run_mode(mode, cfg)
            results[mode].append(r)
            print(f"run {i + 1}: " + format_run(r, cfg), flush=True)
    for mode in modes:
        print(format_medians(mode, results[mode]), flush=True)
    return 0 if all(r.exact for rs in results.values() for r in rs) else 1


if __name__ == "__main__":
    sys.exit(main())
