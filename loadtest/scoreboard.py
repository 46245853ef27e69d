"""One table of every single-node measure, Tidewire beside Mosquitto, in the same run, medians of N runs.

`python -m loadtest.scoreboard [--runs 3] [--targets tidewire,tidewire-py,mosquitto,bare] [--only ROW,...]`

Each broker runs on core 0 (taskset), the load on core 1: the C tool (`loadtest/mqttload.c`) for connects, idle
memory, latency and fan-in, this process (uvloop, pinned to core 1) for fan-out (its ramp). Every (measure, run) gets a
fresh broker, and the targets alternate run by run, so background load spreads over all of them.

Targets: `tidewire` (the hot path as the build made it: compiled when a C compiler was there), `tidewire-py`
(the same with TIDEWIRE_PURE_PYTHON=1: the fallback), `mosquitto`, and `bare` (a uvloop server that only answers
CONNACK, `loadtest.bare_broker`: the floor under any asyncio connect and connection, measured on connects and
idle memory only).

Rows and their aims (checked on medians; fan-out's on every run's ratio):
  connects/s                 ≥ 1.0x Mosquitto (10,000 clean MQTT 3.1.1 connects, 100 in flight)
  broker CPU µs per connect  (what a connect costs the broker's core: steadier than connects/s)
  KB per idle connection     ≤ 1.5 KB at 10,000 connections and at 19,000 (the hard fd limit here is 20,000)
  latency p50 / p99 µs       p50 ≤ Mosquitto, p99 ≤ 1.5x Mosquitto (QoS 1 at 1,000 msgs/s, end to end)
  fan-in QoS 1 msgs/s        ≥ 1.0x Mosquitto (10 publishers → 1 subscriber, closed loop; Tidewire durable,
                             Mosquitto in memory)
  fan-out deliveries/s       ≥ 5x Mosquitto in every run (QoS 0, 1 → 1,000; the highest rate with nothing lost
                             and p99 under 50 ms, ramped by the scenario's factor)
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from loadtest import conn_bench, servers, text_table
from loadtest.bench import LOAD_CORE, pin_self, raise_nofile, run_event_loop
from loadtest.scenarios import Params

TARGETS = ("tidewire", "tidewire-py", "mosquitto", "bare")
LABELS = {"tidewire": "Tidewire", "tidewire-py": "Tidewire (pure Python)", "mosquitto": "Mosquitto",
          "bare": "bare uvloop"}
IDLE_HIGH = 19_000  # idle connections at the most a process may hold here (hard RLIMIT_NOFILE 20,000)


@dataclass(frozen=True, slots=True)
class Row:
    label: str
    measure: str  # what is run: connect, idle, idle-high, latency, fanin, fanout
    key: str  # the value taken from each run
    digits: int
    aim: str
    # (Tidewire median, Mosquitto median, per-run Tidewire/Mosquitto ratios) -> met; None: no aim
    check: Callable[[float, float | None, list[float]], bool] | None = None
    targets: tuple[str, ...] = TARGETS
    scale: float = 1.0


ROWS = (
    Row("connects/s", "connect", "connects_per_s", 0, "≥ 1.0x Mosquitto", lambda t, m, _: m is None or t >= m),
    Row("broker CPU µs per connect", "connect", "server_us_per_connect", 1, ""),
    Row("KB per idle connection (10k)", "idle", "bytes_per_conn", 2, "≤ 1.5 KB", lambda t, m, _: t <= 1.5,
        scale=1024.0),
    Row(f"KB per idle connection ({IDLE_HIGH // 1000}k)", "idle-high", "bytes_per_conn", 2, "≤ 1.5 KB",
        lambda t, m, _: t <= 1.5, ("tidewire", "mosquitto", "bare"), 1024.0),
    Row("latency p50 µs (QoS 1, 1k/s)", "latency", "p50_us", 0, "≤ Mosquitto", lambda t, m, _: m is None or t <= m,
        ("tidewire", "tidewire-py", "mosquitto")),
    Row("latency p99 µs", "latency", "p99_us", 0, "≤ 1.5x Mosquitto", lambda t, m, _: m is None or t <= 1.5 * m,
        ("tidewire", "tidewire-py", "mosquitto")),
    Row("fan-in QoS 1 msgs/s (10 → 1)", "fanin", "msgs_per_s", 0, "≥ 1.0x Mosquitto",
        lambda t, m, _: m is None or t >= m, ("tidewire", "tidewire-py", "mosquitto")),
    Row("fan-out deliveries/s (1 → 1,000)", "fanout", "rate", 0, "≥ 5x Mosquitto, every run",
        lambda t, m, ratios: bool(ratios) and min(ratios) >= 5.0, ("tidewire", "mosquitto")),
)
MEASURES = tuple(dict.fromkeys(row.measure for row in ROWS))


@dataclass(slots=True)
class Board:
    runs: int
    targets: Sequence[str]
    measures: Sequence[str]
    cfg: conn_bench.Config
    exe: Path
    fanout_ramp_start: float = 100_000.0
    results: dict[str, dict[str, list[dict[str, Any]]]] = field(default_factory=dict)  # measure -> target -> runs
    failures: list[str] = field(default_factory=list)

    def run(self, log: Callable[[str], None]) -> None:
        for measure in self.measures:
            targets = [t for t in self.targets if any(t in row.targets for row in ROWS if row.measure == measure)]
            for i in range(self.runs):
                for target in targets:
                    try:
                        r = self.one(measure, target)
                    except Exception as e:  # one broken run must not hide the others' numbers
                        self.failures.append(f"{measure} {target} run {i + 1}: {e}")
                        log(f"{measure:<9} {target:<11} run {i + 1}: FAILED {e}")
                        continue
                    r["run"] = i + 1
                    self.results.setdefault(measure, {}).setdefault(target, []).append(r)
                    log(f"{measure:<9} {target:<11} run {i + 1}: {_summary(measure, r)}")

    def one(self, measure: str, target: str) -> dict[str, Any]:
        if measure in ("connect", "idle", "latency", "fanin"):
            return conn_bench.measure(target, measure, self.exe, self.cfg)
        if measure == "idle-high":
            cfg = conn_bench.Config(**{**asdict(self.cfg), "idle_connections": IDLE_HIGH})
            return conn_bench.measure(target, "idle", self.exe, cfg)
        p = Params(qos=0, subscribers=1000, rate=math.inf, ramp_start=self.fanout_ramp_start, step_seconds=3.0)
        with conn_bench.start_target(target, self.cfg) as server:
            result = run_event_loop(measure, server, p)
        r = asdict(result)
        if r.get("lost"):
            r["note"] = f"lost {r['lost']}"
        return r

    def medians(self, row: Row) -> dict[str, float | None]:
        runs = self.results.get(row.measure, {})
        out: dict[str, float | None] = {}
        for target in row.targets:
            values = [float(r[row.key]) for r in runs.get(target, []) if isinstance(r.get(row.key), (int, float))]
            out[target] = statistics.median(values) / row.scale if values else None
        return out

    def ratios(self, row: Row) -> list[float]:
        """Tidewire/Mosquitto of each run index both completed."""
        runs = self.results.get(row.measure, {})
        by_run = {t: {r["run"]: r.get(row.key) for r in runs.get(t, [])} for t in ("tidewire", "mosquitto")}
        return [float(t) / float(m) for i, t in by_run["tidewire"].items()
                if isinstance(t, (int, float)) and isinstance(m := by_run["mosquitto"].get(i), (int, float)) and m]


def _summary(measure: str, r: dict[str, Any]) -> str:
    if measure == "connect":
        return f"{r['connects_per_s']:,.0f} conn/s, {r.get('server_us_per_connect', '-')} µs/connect"
    if measure.startswith("idle"):
        return f"{r.get('bytes_per_conn')} B/conn ({r.get('ok')} held)"
    if measure == "latency":
        return f"p50 {r['p50_us']:.0f} µs p99 {r['p99_us']:.0f} µs lost {r['lost']}"
    if measure == "fanin":
        return f"{r['msgs_per_s']:,.0f} msgs/s lost {r['lost']} dup {r['dup']} p99 {r['p99_ms']} ms"
    extra = r.get("extra", {})
    tail = f" (target {extra['target_deliveries_per_s']:,.0f})" if "target_deliveries_per_s" in extra else ""
    return f"{r['rate']:,.0f} msgs/s lost {r['lost']} p99 {r['p99_ms']} ms{tail}"


def _fmt(v: float | None, digits: int) -> str:
    return "-" if v is None else f"{v:,.{digits}f}"


def table(board: Board) -> str:
    targets = [t for t in TARGETS if t in board.targets]
    head = ("measure", *(LABELS[t] for t in targets), "T/M", "aim", "")
    lines: list[tuple[str, ...]] = [head]
    for row in ROWS:
        if row.measure not in board.measures:
            continue
        med = board.medians(row)
        t, m = med.get("tidewire"), med.get("mosquitto")
        ratios = board.ratios(row)
        ratio = f"{t / m:.2f}" if t is not None and m else "-"
        if row.measure == "fanout" and ratios:
            ratio += f" (runs {', '.join(f'{x:.1f}' for x in ratios)})"
        met = ""
        if row.check is not None and t is not None and (m is not None or "Mosquitto" not in row.aim):
            met = "met" if row.check(t, m, ratios) else "NOT met"
        lines.append((row.label, *(_fmt(med.get(x), row.digits) if x in row.targets else "" for x in targets),
                      ratio, row.aim, met))
    return text_table.render(lines, left=(0, len(head) - 2, len(head) - 1))


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m loadtest.scoreboard", description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--targets", default=",".join(TARGETS), help="comma-separated subset of " + ",".join(TARGETS))
    ap.add_argument("--only", default="", help="comma-separated subset of the measures " + ",".join(MEASURES))
    ap.add_argument("--connections", type=int, default=10_000, help="connects per connect run, idle connections")
    ap.add_argument("--fanout-ramp-start", type=float, default=100_000.0, help="first fan-out step, deliveries/s")
    ap.add_argument("--json", type=Path, default=None, help="also write every raw run to this file")
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    targets = [t for t in args.targets.split(",") if t]
    measures = [m for m in args.only.split(",") if m] or list(MEASURES)
    bad = [t for t in targets if t not in TARGETS] + [m for m in measures if m not in MEASURES]
    if bad:
        print(f"unknown target/measure: {', '.join(bad)}", file=sys.stderr)
        return 2
    if "mosquitto" in targets and servers.mosquitto_path() is None:
        print("mosquitto not installed: no comparison", file=sys.stderr)
        targets.remove("mosquitto")
    if raise_nofile() < IDLE_HIGH + 64 and "idle-high" in measures:
        measures.remove("idle-high")
        print(f"fd limit below {IDLE_HIGH + 64}: no {IDLE_HIGH:,}-connection idle run", file=sys.stderr)
    pin_self(LOAD_CORE)
    cfg = conn_bench.Config(connections=args.connections, idle_connections=args.connections)
    board = Board(max(1, args.runs), targets, measures, cfg, conn_bench.build_tool(), args.fanout_ramp_start)
    board.run(lambda s: print(s, file=sys.stderr, flush=True))
    print(f"\nmedians of {board.runs} run(s), each on a fresh broker; broker on core {cfg.server_core}, load on core "
          f"{cfg.load_core}")
    print(table(board))
    if args.json is not None:
        args.json.write_text("".join(json.dumps({"measure": m, "target": t, **r}, sort_keys=True, default=str) + "\n"
                                     for m, per in board.results.items() for t, rs in per.items() for r in rs))
    for failure in board.failures:
        print(f"FAILED {failure}", file=sys.stderr)
    return 1 if board.failures else 0


if __name__ == "__main__":
    sys.exit(main())
