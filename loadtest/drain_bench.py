"""Drain time: SIGTERM to process exit of a broker holding N idle MQTT clients, Tidewire beside Mosquitto.

`python -m loadtest.drain_bench [--runs 3] [--connections 10000] [--mqtt311] [--targets tidewire,mosquitto]`

The clients are the C load tool's `idle` mode (`loadtest/mqttload.c`, built as `loadtest.conn_bench` does): N
connections, CONNACKed, then only read until the broker closes them. Each run starts a fresh broker on core 0
and the tool on core 1 (taskset), waits `SETTLE_S`, sends SIGTERM and times the broker's exit; then the tool is
released and says how many of its connections the broker had closed (`closed`: all N, or the run is reported as
failed). Tidewire's own `drain.done` log line gives the drain's part of it (`drain_ms`; the rest is the
process's start of shutdown and Python's exit). MQTT 5 by default: Tidewire then writes N DISCONNECT 0x8B
packets, paced (`gateway.ops.drain`), and waits for the clients to close; Mosquitto 2.0 closes the sockets.
Targets alternate run by run, so background load spreads over both; the table shows medians.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadtest import servers, text_table
from loadtest.bench import LOAD_CORE, raise_nofile
from loadtest.conn_bench import TOOL_SLACK_S, Tool, ToolError, build_tool, end_process, parse_json_line

SETTLE_S = 1.0  # after the last CONNACK, before SIGTERM: the broker finishes per-connection work
EXIT_TIMEOUT_S = 60.0  # a broker still running this long after SIGTERM is killed and the run failed
TARGETS = ("tidewire", "mosquitto")
_DRAIN_DONE = re.compile(r"event=drain\.done .*?elapsed_ms=(\d+)")


@dataclass(slots=True)
class Config:
    connections: int = 10_000
    concurrency: int = 100  # connects in flight; Mosquitto listens with a backlog of 100
    mqtt5: bool = True
    server_core: int | None = servers.SERVER_CORE
    load_core: int | None = LOAD_CORE


def start_target(target: str, cfg: Config) -> servers.Server:
    if target == "mosquitto":
        return servers.start_mosquitto(core=cfg.server_core)
    # info: the drain's own log lines (connects are sampled at that level, not one line each)
    return servers.start_tidewire(core=cfg.server_core, extra_env={"TIDEWIRE_LOG_LEVEL": "info"})


def measure(target: str, exe: Path, cfg: Config) -> dict[str, Any]:
    """One run on a fresh broker: open the idle clients, SIGTERM, time the exit, count what the broker closed."""
    server = start_target(target, cfg)
    tool = Tool(exe, server.host, server.port, cfg.load_core, cfg.mqtt5)
    cmd = tool.command("idle", "-n", str(cfg.connections), "-c", str(cfg.concurrency), "--keepalive", "600")
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        first = proc.stdout.readline()  # the tool's own deadline bounds this wait
        if not first:
            raise ToolError(f"{' '.join(cmd)} printed nothing (exit {proc.wait(TOOL_SLACK_S)})")
        up = parse_json_line(first, "idle up")
        time.sleep(SETTLE_S)
        rss_kb = server.rss_kb()
        t0 = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        try:
            code = server.proc.wait(EXIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            server.proc.kill()
            server.proc.wait()
            raise RuntimeError(f"{target} still running {EXIT_TIMEOUT_S}s after SIGTERM") from None
        exit_s = time.monotonic() - t0
        out, _ = proc.communicate(input="", timeout=TOOL_SLACK_S)  # stdin EOF: the tool reports and exits
        done = parse_json_line(out.strip().splitlines()[-1], "idle done") if out.strip() else {}
        found = _DRAIN_DONE.findall(server.log_tail(200_000))
        return {"target": target, "server": server.label, "mqtt": 5 if cfg.mqtt5 else 4, "held": int(up.get("ok", 0)),
                "errors": up.get("errors"), "rss_kb": rss_kb, "exit_code": code, "exit_s": round(exit_s, 3),
                "drain_ms": int(found[-1]) if found else None, "closed": done.get("dropped")}
    finally:
        end_process(proc)
        server.stop()


def median_of(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [float(r[key]) for r in runs if isinstance(r.get(key), (int, float))]
    return statistics.median(values) if values else None


def table(results: dict[str, list[dict[str, Any]]]) -> str:
    rows = [("metric", *results)]
    for label, key, digits in (("SIGTERM → exit s", "exit_s", 3), ("drain (logged) ms", "drain_ms", 0),
                               ("clients held", "held", 0), ("closed by the broker", "closed", 0),
                               ("RSS before SIGTERM MB", "rss_kb", 1)):
        cells = []
        for runs in results.values():
            v = median_of(runs, key)
            if v is not None and key == "rss_kb":
                v /= 1024
            cells.append("-" if v is None else f"{v:,.{digits}f}")
        rows.append((label, *cells))
    return text_table.render(rows)


def run_all(cfg: Config, runs: int, targets: Sequence[str], exe: Path,
            log: Callable[[str], None]) -> tuple[dict[str, list[dict[str, Any]]], list[str]]:
    results: dict[str, list[dict[str, Any]]] = {t: [] for t in targets}
    failures: list[str] = []
    for i in range(runs):
        for target in targets:  # alternate, so background load spreads over both
            try:
                r = measure(target, exe, cfg)
            except (ToolError, RuntimeError, OSError, subprocess.SubprocessError) as e:
                failures.append(f"{target} run {i + 1}: {e}")
                log(f"{target:<9} run {i + 1}: FAILED {e}")
                continue
            r["run"] = i + 1
            if r["held"] != cfg.connections or r["closed"] != r["held"] or r["exit_code"] not in (0, None):
                failures.append(f"{target} run {i + 1}: held {r['held']}, closed {r['closed']}, exit {r['exit_code']}")
            results[target].append(r)
            log(f"{target:<9} run {i + 1}: exit {r['exit_s']:.3f} s (drain {r['drain_ms']} ms), held {r['held']}, "
                f"closed {r['closed']}, exit code {r['exit_code']}")
    return results, failures


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m loadtest.drain_bench", description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="fresh-broker runs per target (median)")
    ap.add_argument("--connections", type=int, default=10_000, help="idle clients held when SIGTERM arrives")
    ap.add_argument("--concurrency", type=int, default=100, help="connects in flight while opening them")
    ap.add_argument("--mqtt311", action="store_true", help="MQTT 3.1.1 clients (default 5.0)")
    ap.add_argument("--targets", default=",".join(TARGETS), help="comma-separated subset of " + ",".join(TARGETS))
    ap.add_argument("--no-pin", action="store_true", help="do not pin the broker and the tool to cores")
    args = ap.parse_args(argv)
    targets = [t for t in args.targets.split(",") if t]
    if bad := [t for t in targets if t not in TARGETS]:
        print(f"unknown target: {', '.join(bad)}", file=sys.stderr)
        return 2
    if "mosquitto" in targets and servers.mosquitto_path() is None:
        print("mosquitto not installed: Tidewire only", file=sys.stderr)
        targets.remove("mosquitto")
    hard = raise_nofile()  # before any broker starts: they inherit it
    if args.connections + 64 > hard:
        print(f"fd limit {hard} is too low for {args.connections} connections", file=sys.stderr)
        return 2
    cfg = Config(connections=args.connections, concurrency=args.concurrency, mqtt5=not args.mqtt311,
                 server_core=None if args.no_pin else servers.SERVER_CORE,
                 load_core=None if args.no_pin else LOAD_CORE)
    exe = build_tool()
    results, failures = run_all(cfg, max(1, args.runs), targets, exe, lambda s: print(s, file=sys.stderr, flush=True))
    print(f"\nmedians of {max(1, args.runs)} run(s): {cfg.connections:,} idle MQTT {'5' if cfg.mqtt5 else '3.1.1'} "
          f"clients, SIGTERM to exit (broker on core {cfg.server_core}, clients on core {cfg.load_core})")
    print(table(results))
    for runs in results.values():
        for r in runs:
            print(json.dumps(r, sort_keys=True))
    for f in failures:
        print(f"FAILED {f}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
