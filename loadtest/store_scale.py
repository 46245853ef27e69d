"""The embedded store at scale: restart time as the log grows, RSS with many queues and with many stored sessions.

    python -m loadtest.store_scale restart|queues|sessions|all [--messages 5M,50M] [--queues 1M]
        [--sessions 1M] [--runs 3] [--dir /tmp/store_scale] [--cold] [--rebuild] [--json PATH]

- `restart`: a log of N messages (1k topics, see `loadtest.store_data`) is built once per N and cached. Then,
  each `--runs` times: `Store.open()` in a fresh process, and a real gateway (`python -m tidewire serve` pinned to
  core 0) from process start until an MQTT CONNECT gets its CONNACK, with its RSS then. Medians.
- `queues`: a log of `--queues` messages on as many distinct topics (written through the store API, not a
  gateway), then a gateway started on it: its RSS and start time; also the RSS of the process that built it.
- `sessions`: `--sessions` persistent sessions written by `Store.put_session` (timed; awaited 10k at a time, one
  `Store.sync` per batch), then `Store.open()` and a gateway started on it: start time and RSS. Below 10M the
  10M figures are extrapolated linearly from the measured ones (marked so).

Every case also starts a gateway on an empty data directory: the fixed cost (interpreter, imports, listeners)
the other figures include. Page cache: warm (every file of the data set is read first) unless `--cold`, which
adds runs after `echo 3 > /proc/sys/vm/drop_caches` (root only; it slows every process on the machine for a
moment). The gateway runs with retention off (`TIDEWIRE_RETENTION_SECONDS=0`) so a cached data set survives.
Data sets live under `--dir` (default /tmp/store_scale), never in the repository.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadtest import servers, store_data
from loadtest.client import DISCONNECT, connect_packet
from loadtest.redis_proc import terminate
from loadtest.store_data import count_label, parse_count

AIM_RESTART_S = 2.0
TEN_M = 10_000_000
GATEWAY_TIMEOUT_S = 3600.0  # today a 50M log replays for minutes
PROBE_REPLY_TIMEOUT_S = 60.0  # a listening gateway may still be busy (e.g. loading sessions) before CONNACK
POLL_S = 0.005
CASES = ("restart", "queues", "sessions")


@dataclass(slots=True)
class Config:
    root: Path = Path("/tmp/store_scale")
    messages: list[int] = field(default_factory=lambda: [5_000_000, 50_000_000])
    topics: int = 1000
    queues: int = 1_000_000
    sessions: int = 1_000_000
    runs: int = 3
    cold: bool = False
    rebuild: bool = False
    reuse_stale: bool = False
    core: int | None = servers.SERVER_CORE
    host: str = "127.0.0.1"
    warmup: bool = True  # one unmeasured gateway start first (bytecode and page cache of the venv)
    gateway_timeout: float = GATEWAY_TIMEOUT_S


@dataclass(slots=True)
class Row:
    case: str
    value: str
    aim: str = ""


@dataclass(slots=True)
class Report:
    """What a run found: the summary rows and every raw measurement (for --json)."""

    rows: list[Row] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict)
    empty: dict[str, float] | None = None  # the gateway on an empty data directory

    def add(self, case: str, value: str, aim: str = "") -> None:
        self.rows.append(Row(case, value, aim))
        print(f"  {case}: {value}" + (f"   (aim: {aim})" if aim else ""), flush=True)


# --- formatting --------------------------------------------------------------------------------------------
def fmt_s(s: float) -> str:
    return f"{s * 1000:.0f} ms" if s < 1 else f"{s:.2f} s"


def fmt_bytes(n: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def fmt_kb(kb: float) -> str:
    return fmt_bytes(kb * 1024)


def table(rows: Sequence[Row]) -> str:
    lines = ["| case | value | aim |", "|---|---|---|"]
    lines += [f"| {r.case} | {r.value} | {r.aim} |" for r in rows]
    return "\n".join(lines)


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def runs_text(values: Sequence[float]) -> str:
    return ", ".join(fmt_s(v) for v in values)


# --- page cache --------------------------------------------------------------------------------------------
def drop_caches() -> bool:
    """Empty the page cache (root only). False when not allowed here."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError:
        return False
    return True


def warm(path: Path, chunk: int = 1 << 20) -> None:
    """Read every file under `path` once so the measured runs find it in the page cache."""
    buf = bytearray(chunk)
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError), open(os.path.join(root, name), "rb", buffering=0) as f:
                while f.readinto(buf):
                    pass


# --- the two restart measurements ---------------------------------------------------------------------------
def pin(core: int | None) -> list[str]:
    taskset = shutil.which("taskset")
    if core is None or taskset is None or (os.cpu_count() or 1) <= core:
        return []
    return [taskset, "-c", str(core)]


def measure_open(data_dir: Path, cfg: Config, queue: str = "", session: str = "") -> dict[str, Any]:
    """`Store.open()` in a fresh process pinned like the gateway, and the checks `store_data.open_once` makes."""
    cmd = [sys.executable, "-m", "loadtest.store_data", "open", str(data_dir), "--queue", queue,
           "--session", session]
    return store_data.run_child(cmd, store_data.OPEN_TIMEOUT_S, pin(cfg.core))


def _connack(host: str, port: int) -> bool:
    """One anonymous MQTT CONNECT; True on a CONNACK. OSError while nothing listens yet."""
    with socket.create_connection((host, port), timeout=PROBE_REPLY_TIMEOUT_S) as s:
        s.sendall(connect_packet(f"store-scale-{os.getpid()}", keepalive=10))
        reply = s.recv(4)
        if reply[:1] != b"\x20":
            return False
        s.sendall(DISCONNECT)
        return True


def measure_gateway(data_dir: Path, cfg: Config) -> dict[str, Any]:
    """Start a gateway on `data_dir`; seconds from process start to the first CONNACK, RSS and peak RSS then."""
    port = servers.free_port(cfg.host)
    env = dict(os.environ, TIDEWIRE_LOG_LEVEL="warning", TIDEWIRE_RETENTION_SECONDS="0",
               TIDEWIRE_RETENTION_BYTES="0")
    cmd = [*pin(cfg.core), *servers.tidewire_command(cfg.host, port, data_dir)]
    log_path = data_dir.parent / f"gateway-{port}.log"
    with open(log_path, "wb") as log:
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                cwd=store_data.REPO)
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"gateway exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
            if time.monotonic() - t0 > cfg.gateway_timeout:
                raise TimeoutError(f"gateway on {data_dir} gave no CONNACK within {cfg.gateway_timeout:.0f} s")
            try:
                if _connack(cfg.host, port):
                    break
            except OSError:
                pass
            time.sleep(POLL_S)
        ready_s = time.monotonic() - t0
        result = {"ready_s": ready_s, "cpu_s": servers.cpu_seconds(proc.pid), "rss_kb": servers.rss_kb(proc.pid),
                  "hwm_kb": store_data.proc_kb("VmHWM", proc.pid)}
    finally:
        terminate(proc, 60.0)
    log_path.unlink(missing_ok=True)
    return result


def repeat(fn: Callable[[], dict[str, Any]], runs: int, cold: bool) -> list[dict[str, Any]]:
    out = []
    for _ in range(runs):
        if cold and not drop_caches():
            raise RuntimeError("cannot drop the page cache here (needs root and a writable /proc/sys)")
        out.append(fn())
    return out


def empty_gateway(cfg: Config, report: Report) -> dict[str, float]:
    """The gateway on an empty data directory (median of the runs), measured once per report."""
    if report.empty is None:
        empty_dir = cfg.root / "empty"
        results = []
        for i in range(cfg.runs + (1 if cfg.warmup else 0)):
            shutil.rmtree(empty_dir, ignore_errors=True)
            (empty_dir / "data").mkdir(parents=True)
            result = measure_gateway(empty_dir / "data", cfg)
            if i or not cfg.warmup:
                results.append(result)
        shutil.rmtree(empty_dir, ignore_errors=True)
        report.empty = {"ready_s": med(results, "ready_s"), "cpu_s": med(results, "cpu_s"),
                        "rss_kb": med(results, "rss_kb")}
        report.raw["empty"] = results
        report.add("gateway on an empty data dir: start→CONNACK", with_cpu(results, "ready_s", "cpu_s"))
        report.add("gateway on an empty data dir: RSS", fmt_kb(report.empty["rss_kb"]))
    return report.empty


def build(cfg: Config, report: Report, kind: str, count: int, topics: int = 0) -> tuple[Path, dict[str, Any]]:
    dataset = store_data.data_set_dir(cfg.root, kind, count, topics)
    what = f"{kind} {count_label(count)}" + (f" on {count_label(topics)} topics" if topics else "")
    print(f"# {what}: {dataset} ({'rebuilding' if cfg.rebuild else 'cached or built'})", flush=True)
    t0 = time.monotonic()
    info = store_data.ensure(dataset, kind, count, topics, rebuild=cfg.rebuild, reuse_stale=cfg.reuse_stale)
    how = "cached" if info["cached"] else f"built in {fmt_s(time.monotonic() - t0)}"
    print(f"  {how}: {fmt_bytes(info['bytes'])} on disk, builder RSS {fmt_kb(info['builder_rss_kb'])} "
          f"(peak {fmt_kb(info['builder_hwm_kb'])}), commit {info['commit']}", flush=True)
    report.raw.setdefault("builds", {})[dataset.name] = info
    return dataset / "data", info


def open_and_gateway(data_dir: Path, cfg: Config, report: Report, key: str, queue: str = "",
                     session: str = "") -> dict[str, Any]:
    """Warm runs (and cold ones with --cold) of both measurements; their medians."""
    warm(data_dir)
    opens = repeat(lambda: measure_open(data_dir, cfg, queue, session), cfg.runs, False)
    gateways = repeat(lambda: measure_gateway(data_dir, cfg), cfg.runs, False)
    out: dict[str, Any] = {"opens": opens, "gateways": gateways}
    if cfg.cold:
        out["cold_opens"] = repeat(lambda: measure_open(data_dir, cfg, queue, session), cfg.runs, True)
        out["cold_gateways"] = repeat(lambda: measure_gateway(data_dir, cfg), cfg.runs, True)
        warm(data_dir)
    report.raw[key] = out
    for check in ("read_ok", "session_ok"):
        bad = [o for o in opens if check in o and not o[check]]
        if bad:
            raise RuntimeError(f"{key}: after Store.open the stored data is not readable: {bad[0]}")
    return out


def med(results: Sequence[dict[str, Any]], key: str) -> float:
    return median([r[key] for r in results])


def with_cpu(results: Sequence[dict[str, Any]], wall: str, cpu: str) -> str:
    """Median wall time and median CPU time: on a shared machine the wall time includes waiting for the core."""
    return f"{fmt_s(med(results, wall))} (CPU {fmt_s(med(results, cpu))})"


def restart_rows(cfg: Config, report: Report, label: str, m: dict[str, Any]) -> None:
    n = cfg.runs
    report.add(f"{label}: Store.open(), warm, median of {n} ({runs_text([o['open_s'] for o in m['opens']])})",
               with_cpu(m["opens"], "open_s", "open_cpu_s"), f"< {AIM_RESTART_S:.0f} s")
    report.add(f"{label}: RSS of the process after Store.open()", fmt_kb(med(m["opens"], "rss_kb")))
    report.add(f"{label}: gateway start→CONNACK, warm, median of {n} "
               f"({runs_text([g['ready_s'] for g in m['gateways']])})",
               with_cpu(m["gateways"], "ready_s", "cpu_s"), f"< {AIM_RESTART_S:.0f} s")
    report.add(f"{label}: gateway RSS at CONNACK (peak)",
               f"{fmt_kb(med(m['gateways'], 'rss_kb'))} ({fmt_kb(med(m['gateways'], 'hwm_kb'))})")
    if "cold_opens" in m:
        report.add(f"{label}: Store.open(), cold page cache", with_cpu(m["cold_opens"], "open_s", "open_cpu_s"),
                   f"< {AIM_RESTART_S:.0f} s")
        report.add(f"{label}: gateway start→CONNACK, cold page cache",
                   with_cpu(m["cold_gateways"], "ready_s", "cpu_s"),
                   f"< {AIM_RESTART_S:.0f} s")


# --- the cases ---------------------------------------------------------------------------------------------
def run_restart(cfg: Config, report: Report) -> None:
    empty = empty_gateway(cfg, report)
    opens: dict[int, float] = {}
    open_s: dict[int, float] = {}
    open_cpu: dict[int, float] = {}
    for n in cfg.messages:
        data_dir, info = build(cfg, report, "log", n, cfg.topics)
        label = f"restart {count_label(n)} msgs"
        report.add(f"{label}: log size / build (append) time",
                   f"{fmt_bytes(info['bytes'])} / {fmt_s(info['append_s'])} "
                   f"({n / info['append_s'] / 1000:.0f}k msgs/s)")
        m = open_and_gateway(data_dir, cfg, report, f"restart-{n}", queue="dev/0/temp")
        if m["opens"][0].get("newest_seq", n) < n:
            raise RuntimeError(f"{label}: the newest message is seq {m['opens'][0]['newest_seq']}, not {n}")
        restart_rows(cfg, report, label, m)
        opens[n] = med(m["gateways"], "ready_s") - empty["ready_s"]
        open_s[n] = med(m["opens"], "open_s")
        open_cpu[n] = med(m["opens"], "open_cpu_s")
    if len(opens) >= 2:
        lo, hi = min(opens), max(opens)
        growth = f"x{hi / lo:.0f} messages"
        report.add(f"restart growth {count_label(lo)}→{count_label(hi)}: Store.open()",
                   f"x{ratio(open_s[hi], open_s[lo])} (CPU x{ratio(open_cpu[hi], open_cpu[lo])}) for {growth}",
                   "flat (x1)")
        report.add(f"restart growth {count_label(lo)}→{count_label(hi)}: gateway start above the empty one",
                   f"{fmt_s(opens[lo])} → {fmt_s(opens[hi])}: x{ratio(opens[hi], opens[lo])} for {growth}",
                   "flat (x1)")


def ratio(a: float, b: float) -> str:
    return f"{a / b:.1f}" if b > 0.001 else "n/a"


def run_queues(cfg: Config, report: Report) -> None:
    empty = empty_gateway(cfg, report)
    q = cfg.queues
    data_dir, info = build(cfg, report, "log", q, q)
    label = f"queues {count_label(q)} (1 msg per topic)"
    report.add(f"{label}: log size / build time (store API, not a gateway)",
               f"{fmt_bytes(info['bytes'])} / {fmt_s(info['append_s'])}")
    report.add(f"{label}: RSS of the building process", fmt_kb(info["builder_rss_kb"]))
    m = open_and_gateway(data_dir, cfg, report, f"queues-{q}", queue="dev/0/temp")
    gw_rss = med(m["gateways"], "rss_kb")
    report.add(f"{label}: gateway RSS at CONNACK (peak)", f"{fmt_kb(gw_rss)} ({fmt_kb(med(m['gateways'], 'hwm_kb'))})",
               f"bounded by hot queues (empty: {fmt_kb(empty['rss_kb'])})")
    report.add(f"{label}: gateway RSS per queue above the empty gateway",
               f"{(gw_rss - empty['rss_kb']) * 1024 / q:.0f} B")
    report.add(f"{label}: gateway start→CONNACK, warm", with_cpu(m["gateways"], "ready_s", "cpu_s"),
               f"< {AIM_RESTART_S:.0f} s")
    report.add(f"{label}: Store.open(), warm", with_cpu(m["opens"], "open_s", "open_cpu_s"))


def run_sessions(cfg: Config, report: Report) -> None:
    empty = empty_gateway(cfg, report)
    s = cfg.sessions
    data_dir, info = build(cfg, report, "sessions", s)
    label = f"sessions {count_label(s)}"
    put_s = info["put_s"]
    report.add(f"{label}: put_session time (batches of {store_data.SESSION_BATCH}, a sync each)",
               f"{fmt_s(put_s)} ({s / put_s / 1000:.0f}k/s)")
    report.add(f"{label}: data dir size", f"{fmt_bytes(info['bytes'])} ({info['bytes'] / s:.0f} B/session)")
    report.add(f"{label}: RSS of the writing process", fmt_kb(info["builder_rss_kb"]))
    m = open_and_gateway(data_dir, cfg, report, f"sessions-{s}", session="sess-00000000")
    ready, rss = med(m["gateways"], "ready_s"), med(m["gateways"], "rss_kb")
    report.add(f"{label}: Store.open(), warm", with_cpu(m["opens"], "open_s", "open_cpu_s"))
    report.add(f"{label}: gateway start→CONNACK, warm", with_cpu(m["gateways"], "ready_s", "cpu_s"),
               f"< {AIM_RESTART_S:.0f} s")
    report.add(f"{label}: gateway RSS at CONNACK (peak)", f"{fmt_kb(rss)} ({fmt_kb(med(m['gateways'], 'hwm_kb'))})",
               f"bounded by what is online (empty: {fmt_kb(empty['rss_kb'])})")
    per = (rss - empty["rss_kb"]) * 1024 / s
    report.add(f"{label}: gateway RSS per stored session above the empty gateway", f"{per:.0f} B")
    if s < TEN_M:
        k = TEN_M / s
        tag = f"10M sessions (extrapolated x{k:.0f} from {count_label(s)}, linear)"
        report.add(f"{tag}: put_session time", fmt_s(put_s * k))
        report.add(f"{tag}: data dir size", fmt_bytes(info["bytes"] * k))
        cpu = med(m["gateways"], "cpu_s")
        report.add(f"{tag}: gateway start→CONNACK",
                   f"{fmt_s(empty['ready_s'] + (ready - empty['ready_s']) * k)} "
                   f"(CPU {fmt_s(empty['cpu_s'] + (cpu - empty['cpu_s']) * k)})", f"< {AIM_RESTART_S:.0f} s")
        report.add(f"{tag}: gateway RSS", fmt_kb(empty["rss_kb"] + (rss - empty["rss_kb"]) * k),
                   "bounded by what is online")


RUNNERS: dict[str, Callable[[Config, Report], None]] = {
    "restart": run_restart, "queues": run_queues, "sessions": run_sessions}


def run(cases: Sequence[str], cfg: Config) -> Report:
    cfg.root.mkdir(parents=True, exist_ok=True)
    usage = shutil.disk_usage(cfg.root)
    report = Report()
    report.raw["meta"] = {"commit": store_data.git_commit(), "fingerprint": store_data.store_fingerprint(),
                          "runs": cfg.runs, "cold": cfg.cold, "core": cfg.core, "started": time.time(),
                          "python": sys.version.split()[0], "free_bytes": usage.free}
    print(f"# store_scale {' '.join(cases)}: commit {report.raw['meta']['commit']}, store fingerprint "
          f"{report.raw['meta']['fingerprint']}, {fmt_bytes(usage.free)} free in {cfg.root}, gateway on core "
          f"{cfg.core}, warm page cache{' (+ cold runs)' if cfg.cold else ''}", flush=True)
    for case in cases:
        RUNNERS[case](cfg, report)
    return report


def parse_args(argv: Sequence[str] | None) -> tuple[list[str], Config, Path | None]:
    ap = argparse.ArgumentParser(prog="python -m loadtest.store_scale", description=__doc__.splitlines()[0])
    ap.add_argument("case", choices=[*CASES, "all"])
    ap.add_argument("--messages", default="5M,50M", help="log sizes of `restart`, comma-separated")
    ap.add_argument("--topics", type=parse_count, default=1000, help="topics of the `restart` logs")
    ap.add_argument("--queues", type=parse_count, default=1_000_000, help="distinct topics (1 message each)")
    ap.add_argument("--sessions", type=parse_count, default=1_000_000, help="stored sessions (10M extrapolated)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/store_scale"), help="where data sets are cached")
    ap.add_argument("--cold", action="store_true", help="also runs with the page cache dropped (root)")
    ap.add_argument("--rebuild", action="store_true", help="build the data sets anew")
    ap.add_argument("--reuse-stale", action="store_true",
                    help="use a cached data set built by other store code (e.g. to time an upgrade's first open)")
    ap.add_argument("--no-pin", action="store_true", help="do not pin the measured processes to core 0")
    ap.add_argument("--json", type=Path, help="also write every raw measurement here")
    a = ap.parse_args(argv)
    if a.runs < 1:
        ap.error("--runs must be at least 1")
    cfg = Config(root=a.dir, messages=[parse_count(x) for x in a.messages.split(",") if x.strip()],
                 topics=a.topics, queues=a.queues, sessions=a.sessions, runs=a.runs, cold=a.cold,
                 rebuild=a.rebuild, reuse_stale=a.reuse_stale, core=None if a.no_pin else servers.SERVER_CORE)
    return (list(CASES) if a.case == "all" else [a.case]), cfg, a.json


def main(argv: Sequence[str] | None = None) -> Report:
    cases, cfg, json_path = parse_args(argv)
    report = run(cases, cfg)
    print("\n" + table(report.rows), flush=True)
    if json_path is not None:
        json_path.write_text(json.dumps({"rows": [[r.case, r.value, r.aim] for r in report.rows],
                                         "raw": report.raw}, indent=1, default=str))
    return report


if __name__ == "__main__":
    main()
