"""Connects/s, CONNACK latency, memory per idle connection, 1k msgs/s QoS 1 latency and QoS 1 fan-in (10 publishers
with 100 unacknowledged each, to one subscriber), Tidewire beside Mosquitto.

`python -m loadtest.conn_bench [--runs 3] [--connections 10000] [--concurrency 100] [--rate 1000] [--seconds 5]`

The load comes from `loadtest/mqttload.c` (C, epoll, one thread), compiled on first use with `cc -O2` into
`$XDG_CACHE_HOME/tidewire` (default `~/.cache/tidewire`), named by the source's hash so an edit rebuilds it.
Each broker runs on core 0 (`loadtest.servers`), the tool on core 1 (taskset). Every (mode, run) gets a fresh
broker, so the idle measure does not reuse memory freed by an earlier connect storm, and the targets alternate
run by run so other load on the machine spreads over both. Bytes per idle connection = (RSS with N idle
connections, sampled SETTLE_S after the last CONNACK - RSS before) / N. `core0_other`/`core1_other` are the
shares of the broker's/tool's core used by anything else during a run: when not near 0, the run shared its core.
`server_us_per_connect` (broker CPU time / connects) is the steadiest connect figure on a shared machine.
`tool_core` is the tool's share of its core: most of it is the kernel's loopback TCP work (the handshake and
the delivery of what the tool sends run in softirq on the sender's core), so near 1.0 the tool is the limit;
`tool_ceiling_per_s` (connects / tool CPU) is the rate at which it would be: ~15k/s here, below what Mosquitto
can take (~45 us of broker CPU per connect), so compare brokers on `server_us_per_connect` as well.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadtest import servers, text_table
from loadtest.bench import LOAD_CORE, raise_nofile
from tidewire.compiled import PURE_ENV

SOURCE = Path(__file__).with_name("mqttload.c")
CFLAGS = ("-O2", "-std=c99", "-Wall")
SETTLE_S = 1.0  # between the last CONNACK and the idle RSS sample: the broker finishes per-connection setup
WARMUP_CONNECTS = 100  # before the idle RSS baseline: one-time costs of the first connections are not per-conn
TOOL_SLACK_S = 15.0  # subprocess timeout beyond the tool's own global deadline
MODES = ("connect", "idle", "latency", "fanin")
TARGETS = ("tidewire", "tidewire-py", "mosquitto", "bare")
DEFAULT_TARGETS = ("tidewire", "mosquitto")
# What each target runs: Tidewire as installed (its hot path compiled when the build could), the same with
# TIDEWIRE_PURE_PYTHON=1 (the fallback), Mosquitto, and a bare uvloop CONNACK server (connect and idle only).
TARGET_LABELS = {"tidewire": "Tidewire", "tidewire-py": "Tidewire (pure Python)", "mosquitto": "Mosquitto",
                 "bare": "bare uvloop"}


class ToolError(RuntimeError):
    """The load tool could not be built or gave no usable result."""


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tidewire"


def build_tool(out_dir: Path | None = None, cc: str | None = None) -> Path:
    """The compiled tool for the current source, built if missing (atomically: concurrent builds are safe)."""
    compiler = cc or os.environ.get("CC") or shutil.which("cc")
    if not compiler:
        raise ToolError("no C compiler: install cc (gcc or clang) or set CC")
    src = SOURCE.read_bytes()
    digest = hashlib.sha256(src + " ".join(CFLAGS).encode()).hexdigest()[:16]
    target_dir = out_dir or cache_dir()
    exe = target_dir / f"mqttload-{digest}"
    if os.access(exe, os.X_OK):
        return exe
    target_dir.mkdir(parents=True, exist_ok=True)
    tmp = target_dir / f".mqttload-{digest}.{os.getpid()}.tmp"
    proc = subprocess.run([compiler, *CFLAGS, "-o", str(tmp), str(SOURCE)], capture_output=True, text=True,
                          timeout=120)
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise ToolError(f"compiling {SOURCE.name} failed:\n{proc.stderr[-2000:]}")
    os.replace(tmp, exe)
    return exe


def pin_prefix(core: int | None) -> list[str]:
    taskset = shutil.which("taskset")
    if core is None or taskset is None or (os.cpu_count() or 1) <= core:
        return []
    return [taskset, "-c", str(core)]


def end_process(proc: subprocess.Popen[str]) -> None:
    """Kill the tool if it still runs, and close its pipes."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


def parse_json_line(line: str, what: str) -> dict[str, Any]:
    """One JSON object the C tool printed, or ToolError saying what came instead."""
    try:
        value = json.loads(line)
    except json.JSONDecodeError as e:
        raise ToolError(f"{what}: not a JSON line: {line[:300]!r}") from e
    if not isinstance(value, dict):
        raise ToolError(f"{what}: not a JSON object: {line[:300]!r}")
    return value


@dataclass(slots=True)
class Tool:
    """How to run the compiled tool against one broker."""

    exe: Path
    host: str
    port: int
    core: int | None = LOAD_CORE
    mqtt5: bool = False
    timeout_s: float = 120.0  # the tool's global deadline

    def command(self, mode: str, *args: str) -> list[str]:
        cmd = [*pin_prefix(self.core), str(self.exe), mode, "--host", self.host, "--port", str(self.port),
               "--timeout", str(self.timeout_s), *args]
        return [*cmd, "--mqtt5"] if self.mqtt5 else cmd

    def run(self, mode: str, *args: str) -> dict[str, Any]:
        """One run of connect or latency: its JSON line (the exit status only says whether it was perfect)."""
        cmd = self.command(mode, *args)
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=self.timeout_s + TOOL_SLACK_S,
                              stdin=subprocess.DEVNULL)
        lines = proc.stdout.strip().splitlines()
        if not lines:
            raise ToolError(f"{' '.join(cmd)} printed nothing (exit {proc.returncode}): {proc.stderr[-500:]}")
        return parse_json_line(lines[-1], mode)

    def hold_idle(self, n: int, concurrency: int, on_up: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        """Open n idle connections, call on_up(up line) while they are held, then release them; the up line
        with the done line's fields added."""
        cmd = self.command("idle", "-n", str(n), "-c", str(concurrency), "--keepalive", "600")
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        try:
            assert proc.stdout is not None and proc.stdin is not None
            first = proc.stdout.readline()  # the tool's deadline bounds this wait
            if not first:
                raise ToolError(f"{' '.join(cmd)} printed nothing (exit {proc.wait(TOOL_SLACK_S)})")
            up = parse_json_line(first, "idle")
            on_up(up)
            out, _ = proc.communicate(input="", timeout=TOOL_SLACK_S)  # stdin EOF releases the connections
            done = parse_json_line(out.strip().splitlines()[-1], "idle done") if out.strip() else {}
            up.update({f"done_{k}": v for k, v in done.items() if k not in ("mode", "phase")})
            return up
        finally:
            end_process(proc)


@dataclass(slots=True)
class Config:
    connections: int = 10_000
    concurrency: int = 100  # connects in flight; Mosquitto listens with a backlog of 100
    idle_connections: int = 10_000
    rate: float = 1000.0
    seconds: float = 5.0
    payload: int = 64
    mqtt5: bool = False
    publishers: int = 10  # fanin: to one subscriber, each with `window` QoS 1 publishes unacknowledged
    window: int = 100
    server_core: int | None = servers.SERVER_CORE
    load_core: int | None = LOAD_CORE
    tidewire_src: Path | None = None  # run Tidewire from this source tree (e.g. a `git archive` of a commit)


class _CoreMeter:
    """How busy the two cores were over one measurement, and with what: the broker's share of its core, the
    tool's share of its core (near 1.0: the tool was the bottleneck), and what other processes took of each."""

    def __init__(self, server: servers.Server, cfg: Config) -> None:
        self.server, self.cores = server, {"core0": cfg.server_core, "core1": cfg.load_core}
        self.t0 = time.monotonic()
        self.busy0 = {name: servers.core_busy_seconds(c) for name, c in self.cores.items() if c is not None}
        self.cpu0 = server.cpu_seconds()

    def stop(self, tool_cpu_s: float) -> dict[str, float]:
        wall = max(time.monotonic() - self.t0, 1e-9)
        own = {"core0": self.server.cpu_seconds() - self.cpu0, "core1": tool_cpu_s}
        out = {"server_cpu": round(own["core0"] / wall, 3), "server_cpu_s": round(own["core0"], 3),
               "tool_core": round(tool_cpu_s / wall, 3)}
        for name, busy0 in self.busy0.items():
            busy = servers.core_busy_seconds(self.cores[name] or 0) - busy0
            out[f"{name}_other"] = round(max(0.0, busy - own[name]) / wall, 3)
        return out


def measure_connect(server: servers.Server, tool: Tool, cfg: Config) -> dict[str, Any]:
    meter = _CoreMeter(server, cfg)
    r = tool.run("connect", "-n", str(cfg.connections), "-c", str(cfg.concurrency), "--prefix", "cb-conn")
    r.update(meter.stop(float(r.get("tool_cpu_s", 0.0))))
    if r.get("ok"):  # what a connect costs the broker: steadier than connects/s when the core is shared
        r["server_us_per_connect"] = round(r["server_cpu_s"] * 1e6 / r["ok"], 1)
    if r.get("ok") and r.get("tool_cpu_s"):  # the rate at which the tool would fill its own core
        r["tool_ceiling_per_s"] = round(r["ok"] / r["tool_cpu_s"], 1)
    return r


def measure_idle(server: servers.Server, tool: Tool, cfg: Config) -> dict[str, Any]:
    tool.run("connect", "-n", str(WARMUP_CONNECTS), "-c", "10", "--prefix", "cb-warm")
    time.sleep(SETTLE_S)
    before = server.rss_kb()
    sample: dict[str, int] = {}

    def on_up(up: dict[str, Any]) -> None:
        time.sleep(SETTLE_S)
        sample["after"] = server.rss_kb()

    r = tool.hold_idle(cfg.idle_connections, cfg.concurrency, on_up)
    after = sample.get("after", before)
    held = int(r.get("ok", 0))
    r.update(rss_before_kb=before, rss_after_kb=after,
             bytes_per_conn=round((after - before) * 1024 / held, 1) if held else None)
    return r


def measure_latency(server: servers.Server, tool: Tool, cfg: Config) -> dict[str, Any]:
    meter = _CoreMeter(server, cfg)
    r = tool.run("latency", "--rate", str(cfg.rate), "--seconds", str(cfg.seconds), "--payload", str(cfg.payload),
                 "--qos", "1", "--prefix", "cb-lat")
    r.update(meter.stop(float(r.get("tool_cpu_s", 0.0))))
    return r


def measure_fanin(server: servers.Server, tool: Tool, cfg: Config) -> dict[str, Any]:
    meter = _CoreMeter(server, cfg)
    r = tool.run("fanin", "-n", str(cfg.publishers), "--window", str(cfg.window), "--seconds", str(cfg.seconds),
                 "--payload", str(cfg.payload), "--qos", "1", "--prefix", "cb-fanin")
    r.update(meter.stop(float(r.get("tool_cpu_s", 0.0))))
    return r


MEASURES: dict[str, Callable[[servers.Server, Tool, Config], dict[str, Any]]] = {
    "connect": measure_connect, "idle": measure_idle, "latency": measure_latency, "fanin": measure_fanin}


def start_target(target: str, cfg: Config) -> servers.Server:
    if target == "mosquitto":
        return servers.start_mosquitto(core=cfg.server_core)
    if target == "bare":
        return servers.start_bare(core=cfg.server_core)
    env = {"PYTHONPATH": str(cfg.tidewire_src)} if cfg.tidewire_src is not None else {}
    if target == "tidewire-py":
        env[PURE_ENV] = "1"
    return servers.start_tidewire(core=cfg.server_core, extra_env=env)  # the embedded store: its default


def measure(target: str, mode: str, exe: Path, cfg: Config) -> dict[str, Any]:
    """One run of one mode on a fresh broker."""
    with start_target(target, cfg) as server:
        tool = Tool(exe, server.host, server.port, cfg.load_core, cfg.mqtt5)
        r = MEASURES[mode](server, tool, cfg)
        r["target"], r["server"] = target, server.label
        if server.proc.poll() is not None:
            r["server_exited"] = server.proc.returncode
        return r


@dataclass(slots=True)
class Row:
    label: str
    mode: str
    key: str
    digits: int = 1
    aim: str = ""
    check: Callable[[float, float | None], bool] | None = None  # (tidewire, mosquitto) -> aim met
    scale: float = 1.0


ROWS = (
    Row("connects/s", "connect", "connects_per_s", 0, "≥ Mosquitto", lambda t, m: m is None or t >= m),
    Row("broker CPU µs/connect", "connect", "server_us_per_connect", 1),
    Row("CONNACK p50 ms", "connect", "p50_ms", 2),
    Row("CONNACK p99 ms", "connect", "p99_ms", 2),
    Row("CONNACK p999 ms", "connect", "p999_ms", 2),
    Row("connect errors", "connect", "errors", 0),
    Row("KB per idle conn", "idle", "bytes_per_conn", 2, "≤ 1.5 KB", lambda t, m: t <= 1.5, 1024.0),
    Row("idle opens/s", "idle", "opens_per_s", 0),
    Row("latency p50 µs", "latency", "p50_us", 0, "≤ 150 µs", lambda t, m: t <= 150),
    Row("latency p99 µs", "latency", "p99_us", 0),
    Row("latency lost", "latency", "lost", 0),
    Row("fan-in QoS 1 msgs/s", "fanin", "msgs_per_s", 0, "≥ Mosquitto", lambda t, m: m is None or t >= m),
    Row("fan-in lost", "fanin", "lost", 0),
    Row("broker core use (fan-in)", "fanin", "server_cpu", 2),
    Row("tool core use (fan-in)", "fanin", "tool_core", 2),
    Row("broker core use (connect)", "connect", "server_cpu", 2),
    Row("tool core use (connect)", "connect", "tool_core", 2),
    Row("tool ceiling conn/s", "connect", "tool_ceiling_per_s", 0),
    Row("core0 other (connect)", "connect", "core0_other", 2),
    Row("core1 other (connect)", "connect", "core1_other", 2),
    Row("core0 other (latency)", "latency", "core0_other", 2),
)


def median_of(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [float(r[key]) for r in runs if isinstance(r.get(key), (int, float))]
    return statistics.median(values) if values else None


def _fmt(v: float | None, digits: int) -> str:
    return "-" if v is None else f"{v:,.{digits}f}"


def table(results: dict[str, dict[str, list[dict[str, Any]]]]) -> str:
    """metric | each target's median | Tidewire / Mosquitto | aim (checked on Tidewire's median)."""
    targets = [t for t in TARGETS if t in results]
    head = ("metric", *(f"{TARGET_LABELS[t]}" for t in targets), "ratio T/M", "aim")
    lines = [head]
    for row in ROWS:
        medians = {t: median_of(results[t].get(row.mode, []), row.key) for t in targets}
        if all(v is None for v in medians.values()):
            continue
        scaled = {t: None if v is None else v / row.scale for t, v in medians.items()}
        t, m = medians.get("tidewire"), medians.get("mosquitto")
        ratio = f"{t / m:.2f}" if t is not None and m else "-"
        aim = row.aim
        ts = scaled.get("tidewire")
        ms = scaled.get("mosquitto")
        if row.check is not None and ts is not None and (ms is not None or "Mosquitto" not in row.aim):
            aim += "  met" if row.check(ts, ms) else "  NOT met"
        lines.append((row.label, *(_fmt(scaled[t], row.digits) for t in targets), ratio, aim))
    return text_table.render(lines)


@dataclass(slots=True)
class Bench:
    cfg: Config
    runs: int
    modes: Sequence[str]
    targets: Sequence[str]
    results: dict[str, dict[str, list[dict[str, Any]]]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    def run(self, exe: Path, log: Callable[[str], None]) -> None:
        for mode in self.modes:
            for i in range(self.runs):
                for target in self.targets:  # alternate, so background load spreads over both
                    if target == "bare" and mode in ("latency", "fanin"):
                        continue  # it routes nothing
                    try:
                        r = measure(target, mode, exe, self.cfg)
                    except (ToolError, RuntimeError, OSError, subprocess.SubprocessError) as e:
                        self.failures.append(f"{target} {mode} run {i + 1}: {e}")
                        log(f"{target:<9} {mode:<7} run {i + 1}: FAILED {e}")
                        continue
                    r["run"] = i + 1
                    self.results.setdefault(target, {}).setdefault(mode, []).append(r)
                    log(f"{target:<9} {mode:<7} run {i + 1}: {summary(r)}")


def summary(r: dict[str, Any]) -> str:
    mode = r.get("mode")
    if mode == "connect":
        return (f"{r['connects_per_s']:,.0f} conn/s p99 {r['p99_ms']:.2f} ms errors {r['errors']}"
                f" core0_other {r.get('core0_other', '-')} tool_core {r.get('tool_core', '-')}")
    if mode == "idle":
        return (f"{r.get('bytes_per_conn')} B/conn ({r['ok']} held, rss {r['rss_before_kb']} -> "
                f"{r['rss_after_kb']} KB) errors {r['errors']}")
    if mode == "fanin":
        return (f"{r['msgs_per_s']:,.0f} msgs/s p99 {r['p99_ms']:.2f} ms sent {r['sent']} lost {r['lost']}"
                f" dup {r['dup']} tool_core {r.get('tool_core', '-')}")
    return (f"p50 {r['p50_us']:.0f} us p99 {r['p99_us']:.0f} us sent {r['sent']} lost {r['lost']}"
            f" core0_other {r.get('core0_other', '-')}")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m loadtest.conn_bench", description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="fresh-broker runs per mode and target (median)")
    ap.add_argument("--connections", type=int, default=10_000, help="connect mode: total connections")
    ap.add_argument("--idle-connections", type=int, default=None, help="idle mode (default: --connections)")
    ap.add_argument("--concurrency", type=int, default=100, help="connections in flight")
    ap.add_argument("--rate", type=float, default=1000.0, help="latency mode: msgs/s")
    ap.add_argument("--seconds", type=float, default=5.0, help="latency mode: publishing time")
    ap.add_argument("--payload", type=int, default=64, help="latency mode: payload bytes (≥ 16)")
    ap.add_argument("--mqtt5", action="store_true", help="MQTT 5 instead of 3.1.1")
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of " + ",".join(MODES))
    ap.add_argument("--targets", default=",".join(DEFAULT_TARGETS),
                    help="comma-separated subset of " + ",".join(TARGETS))
    ap.add_argument("--no-pin", action="store_true", help="do not pin the broker and the tool to cores")
    ap.add_argument("--tidewire-src", type=Path, default=None,
                    help="run Tidewire from this source tree instead of the installed one, e.g. a baseline "
                         "from `git archive COMMIT | tar -x -C DIR`")
    ap.add_argument("--json", type=Path, default=None, help="also write every raw run to this file")
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    targets = [t for t in args.targets.split(",") if t]
    bad = [m for m in modes if m not in MODES] + [t for t in targets if t not in TARGETS]
    if bad:
        print(f"unknown mode/target: {', '.join(bad)}", file=sys.stderr)
        return 2
    if "mosquitto" in targets and servers.mosquitto_path() is None:
        print("mosquitto not installed: Tidewire only", file=sys.stderr)
        targets.remove("mosquitto")
    hard = raise_nofile()  # before any broker starts: they inherit it
    idle_n = args.idle_connections or args.connections
    if idle_n + 64 > hard:
        print(f"fd limit {hard} is too low for {idle_n} idle connections", file=sys.stderr)
        return 2
    cfg = Config(connections=args.connections, concurrency=args.concurrency, idle_connections=idle_n,
                 rate=args.rate, seconds=args.seconds, payload=args.payload, mqtt5=args.mqtt5,
                 server_core=None if args.no_pin else servers.SERVER_CORE,
                 load_core=None if args.no_pin else LOAD_CORE,
                 tidewire_src=args.tidewire_src.resolve() if args.tidewire_src else None)
    exe = build_tool()
    print(f"tool {exe}; broker on core {cfg.server_core}, tool on core {cfg.load_core}", file=sys.stderr)
    bench = Bench(cfg, max(1, args.runs), modes, targets)
    bench.run(exe, lambda s: print(s, file=sys.stderr, flush=True))
    print(f"\nmedians of {bench.runs} run(s); {cfg.connections:,} connects at concurrency {cfg.concurrency}, "
          f"{cfg.idle_connections:,} idle, latency QoS 1 at {cfg.rate:,.0f} msgs/s for {cfg.seconds:g} s, "
          f"MQTT {'5' if cfg.mqtt5 else '3.1.1'}; Tidewire from {cfg.tidewire_src or 'the installed tree'}")
    print(table(bench.results))
    print("\nraw runs:")
    raw = [r for per_mode in bench.results.values() for rs in per_mode.values() for r in rs]
    for r in raw:
        print(json.dumps(r, sort_keys=True))
    if args.json is not None:
        args.json.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in raw))
    for f in bench.failures:
        print(f"FAILED {f}", file=sys.stderr)
    return 1 if bench.failures else 0


if __name__ == "__main__":
    sys.exit(main())
