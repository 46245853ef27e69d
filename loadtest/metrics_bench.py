"""CLI: `python -m loadtest.metrics_bench [--runs 3] [--subscribers 200] [--rate 600000|max] [--seconds 3]`:
what the node's metrics cost fan-out (1 publisher -> N subscribers), metrics on vs off (TIDEWIRE_METRICS=false).

The `fanout` scenario of `loadtest.bench` on a fresh Tidewire per run (pinned to core 0, this generator to core
1); runs alternate on/off so drift (other work on the machine) hits both alike. At a fixed offered rate the node
keeps up either way and the cost shows as server CPU per delivery; `--rate max` searches the highest rate
sustained (the bench's ramp: no loss, p99 under its limit), in steps of 1.3x. Prints each run, then per mode the
medians of deliveries/s and of server CPU microseconds per delivery, and the ratios on/off.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections.abc import Sequence

from loadtest import servers
from loadtest.bench import load_core, pin_self, raise_nofile, run_event_loop
from loadtest.scenarios import Params, Result

MODES = ("on", "off")


def _rate(text: str) -> float:
    return math.inf if text == "max" else float(text)


def run_once(metrics: bool, p: Params, pin: bool) -> Result:
    env = {} if metrics else {"TIDEWIRE_METRICS": "false"}
    with servers.start_tidewire(core=servers.SERVER_CORE if pin else None, extra_env=env) as server:
        return run_event_loop("fanout", server, p)


def cpu_us_per_delivery(r: Result) -> float:
    return r.server_cpu / r.rate * 1e6 if r.rate else float("nan")


def summary(results: dict[str, list[Result]]) -> list[str]:
    rates = {mode: statistics.median(r.rate for r in rs) for mode, rs in results.items()}
    costs = {mode: statistics.median(cpu_us_per_delivery(r) for r in rs) for mode, rs in results.items()}
    lines = [f"metrics {mode:<3}  deliveries/s median {rates[mode]:>12,.0f}   server CPU/delivery median "
             f"{costs[mode]:.3f} us   (runs: {', '.join(f'{r.rate:,.0f}' for r in results[mode])})"
             for mode in MODES]
    if rates["off"] and costs["off"]:
        lines.append(f"ratio on/off  deliveries/s {rates['on'] / rates['off']:.3f}   "
                     f"CPU/delivery {costs['on'] / costs['off']:.3f}")
    return lines


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m loadtest.metrics_bench", description=__doc__)
    ap.add_argument("--runs", type=int, default=3, help="runs per mode (medians)")
    ap.add_argument("--subscribers", type=int, default=200)
    ap.add_argument("--rate", type=_rate, default=600_000.0, help="offered deliveries/s, or 'max' (ramp)")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--qos", type=int, choices=[0, 1, 2], default=0)
    ap.add_argument("--payload", type=int, default=64)
    ap.add_argument("--no-pin", action="store_true", help="do not pin server/load to cores 0/1")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    raise_nofile()
    pin = not args.no_pin
    if pin:
        pin_self(load_core())
    p = Params(seconds=args.seconds, qos=args.qos, rate=args.rate, subscribers=args.subscribers, payload=args.payload,
               drain=2.0)
    results: dict[str, list[Result]] = {mode: [] for mode in MODES}
    for i in range(args.runs):
        for mode in MODES if i % 2 == 0 else MODES[::-1]:
            r = run_once(mode == "on", p, pin)
            results[mode].append(r)
            print(f"run {i + 1} metrics {mode:<3}  deliveries/s {r.rate:>12,.0f}  server CPU {r.server_cpu:.0%}  "
                  f"{cpu_us_per_delivery(r):.3f} us/delivery  lost {r.lost:,}  p99 {r.p99_ms or 0:.1f} ms  "
                  f"core0 other {r.extra.get('core0_other_cpu', 0):.2f}", flush=True)
    print("\n".join(summary(results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
