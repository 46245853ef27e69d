"""CLI: `python -m loadtest.bench SCENARIO [--target tidewire|mosquitto|both] [--auth] [--tls]`; runs and
prints reports.

The server runs pinned to core 0 (taskset), this load generator pins itself to core 1, one process on uvloop.
--auth and --tls start every target with the same files (one mosquitto_passwd password file with anonymous
access off; one CA-signed certificate on an extra TLS listener) and make every client use them, e.g.
`connect --auth --tls` measures full TLS handshakes plus password checks.
--store redis runs Tidewire on the Redis store: a private redis-server (AOF appendfsync always) pinned to core 1;
the load generator moves to core 2 when there is one, else shares core 1 with Redis.
`python -m loadtest.cluster_bench` compares the stores (medians, Redis commands per message) and runs a cluster.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import os
import resource
import sys
from collections.abc import Sequence

from loadtest import servers
from loadtest.scenarios import SCENARIOS, Params, Result
from loadtest.security import BENCH_USERS, Security, security_files

LOAD_CORE = 1
# `all` runs every scenario with smaller defaults so the whole suite takes about a minute per target.
ALL_DEFAULTS: dict[str, dict[str, float]] = {
    "fanout": {"seconds": 3, "subscribers": 200, "rate": 20_000},
    "fanin": {"seconds": 3},
    "pairs": {"seconds": 3, "pairs": 20},
    "latency": {"seconds": 3},
    "idle": {"connections": 2000},
    "connect": {"seconds": 3},
    "storm": {"seconds": 3},
}


def raise_nofile() -> int:
    """Lift the soft fd limit to the hard one (idle and fanout open thousands of sockets)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def load_core(store: str = "embedded") -> int:
    """Core 1, unless Redis has it and there is a third core."""
    return LOAD_CORE + 1 if store == "redis" and (os.cpu_count() or 1) > LOAD_CORE + 1 else LOAD_CORE


def pin_self(core: int = LOAD_CORE) -> bool:
    if (os.cpu_count() or 1) <= core or not hasattr(os, "sched_setaffinity"):
        return False
    os.sched_setaffinity(0, {core})
    return True


def _fmt(v: float | None, digits: int = 2) -> str:
    if v is None:
        return "-"
    return f"{v:,.{digits}f}" if isinstance(v, float) and not v.is_integer() else f"{int(v):,}"


def format_result(r: Result) -> str:
    lines = [
        f"scenario     {r.scenario}",
        f"server       {r.server}",
        f"{'delivered' if r.unit == 'msgs/s' else 'result':<12} {_fmt(r.rate, 1)} {r.unit}",
    ]
    if r.unit != "KB/conn":
        lines += [
            f"sent         {r.sent:,}",
            f"received     {r.received:,}",
            f"lost         {r.lost:,}",
            f"dup          {r.dup:,}",
            f"latency ms   p50 {_fmt(r.p50_ms, 3)}  p99 {_fmt(r.p99_ms, 3)}  p999 {_fmt(r.p999_ms, 3)}",
            f"cpu          load {r.load_cpu:.0%}  server {r.server_cpu:.0%}",
        ]
    lines.append(f"duration     {r.duration_s:.2f} s")
    lines += [f"{k:<12} {_fmt(float(v))}" for k, v in r.extra.items()]
    return "\n".join(lines)


def format_ratio(tide: Result, mosq: Result) -> str:
    if not mosq.rate:
        return f"ratio        {tide.scenario}: mosquitto result is 0, no ratio"
    better = "lower is better" if tide.unit == "KB/conn" else "higher is better"
    return f"ratio        {tide.scenario} tidewire/mosquitto = {tide.rate / mosq.rate:.2f} ({tide.unit}, {better})"


def params_for(scenario: str, args: argparse.Namespace, suite: bool) -> Params:
    """CLI values win; then the `all` suite's smaller defaults; then Params defaults."""
    p = Params()
    values: dict[str, float] = dict(ALL_DEFAULTS.get(scenario, {})) if suite else {}
    for f in dataclasses.fields(Params):
        given = getattr(args, f.name, None)
        if given is not None:
            values[f.name] = given
    for k, v in values.items():
        setattr(p, k, type(getattr(p, k))(v) if getattr(p, k) is not None else v)
    return p


def _rate(text: str) -> float:
    return math.inf if text == "max" else float(text)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m loadtest.bench", description=__doc__)
    ap.add_argument("scenario", choices=[*SCENARIOS, "all"])
    default_target = "both" if servers.mosquitto_path() else "tidewire"
    ap.add_argument("--target", choices=["tidewire", "mosquitto", "both"], default=default_target)
    ap.add_argument("--seconds", type=float)
    ap.add_argument("--qos", type=int, choices=[0, 1, 2])
    ap.add_argument("--rate", type=_rate, help="fanout: deliveries/s or 'max'; latency: msgs/s")
    ap.add_argument("--subscribers", type=int, help="fanout subscribers")
    ap.add_argument("--publishers", type=int, help="fanin publishers")
    ap.add_argument("--pairs", type=int)
    ap.add_argument("--connections", type=int, help="idle connections")
    ap.add_argument("--concurrency", type=int, help="connect: concurrent loops")
    ap.add_argument("--window", type=int, help="unacked publishes per publisher (fanin, pairs)")
    ap.add_argument("--payload", type=int, help="payload bytes (>= 20)")
    ap.add_argument("--drain", type=float, help="max seconds to wait for late deliveries")
    ap.add_argument("--max-p99-ms", dest="max_p99_ms", type=float, help="fanout --rate max: p99 limit")
    ap.add_argument("--ramp-start", dest="ramp_start", type=float, help="fanout --rate max: first rate")
    ap.add_argument("--step-seconds", dest="step_seconds", type=float, help="fanout --rate max: step length")
    ap.add_argument("--auth", action="store_true", default=None,
                    help=f"targets read one password file (bench0..bench{BENCH_USERS - 1}, made by mosquitto_passwd),"
                         " anonymous off; clients CONNECT with user name/password")
    ap.add_argument("--tls", action="store_true", default=None,
                    help="targets add a TLS listener (one generated CA + certificate, TLS 1.2+); clients connect "
                         "over TLS, verifying it (connect: full handshake per connection)")
    ap.add_argument("--fsync", choices=["batch", "interval", "never"], help="TIDEWIRE_FSYNC for tidewire")
    ap.add_argument("--store", choices=["embedded", "redis"], default="embedded",
                    help="tidewire's store; redis: a private redis-server (AOF always) pinned to core 1")
    ap.add_argument("--no-pin", action="store_true", help="do not pin server/load to cores 0/1")
    ap.add_argument("--json", action="store_true", help="one JSON object per result instead of text")
    return ap


async def _run_one(scenario: str, server: servers.Server, p: Params) -> Result:
    return await SCENARIOS[scenario](server, p)


def run_event_loop(scenario: str, server: servers.Server, p: Params) -> Result:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return asyncio.run(_run_one(scenario, server, p))
    return uvloop.run(_run_one(scenario, server, p))


def run_target(target: str, scenario: str, p: Params, args: argparse.Namespace,
               security: Security | None = None) -> Result:
    core = None if args.no_pin else servers.SERVER_CORE
    with servers.start(target, core=core, fsync=args.fsync, security=security,
                       store=getattr(args, "store", "embedded")) as server:
        return run_event_loop(scenario, server, p)


def refusals(r: Result) -> str | None:
    """Why a result must not count as a measurement: CONNACKs were refused (e.g. a wrong password setup)."""
    n = int(r.extra.get("refused", 0))
    if not n:
        return None
    return f"{n:,} CONNACKs refused (first return code {int(r.extra.get('first_refused_code', 0))})"


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    raise_nofile()
    if not args.no_pin:
        pin_self(load_core(args.store))
    targets = ["tidewire", "mosquitto"] if args.target == "both" else [args.target]
    suite = args.scenario == "all"
    scenarios = list(SCENARIOS) if suite else [args.scenario]
    failed = False
    # Made once, so both targets read the identical password file and certificate.
    with security_files(auth=bool(args.auth), tls=bool(args.tls)) as security:
        for scenario in scenarios:
            p = params_for(scenario, args, suite)
            results: dict[str, Result] = {}
            for target in targets:
                try:
                    results[target] = r = run_target(target, scenario, p, args, security)
                except Exception as e:  # one broken target must not hide the other's numbers
                    failed = True
                    print(f"scenario     {scenario}\nserver       {target}\nerror        {e}\n", file=sys.stderr)
                    continue
                print(json.dumps(dataclasses.asdict(r)) if args.json else format_result(r) + "\n", flush=True)
                refused = refusals(r)
                if refused:
                    failed = True
                    print(f"scenario     {scenario}\nserver       {r.server}\nerror        {refused}\n",
                          file=sys.stderr)
            if len(results) == 2 and not args.json:
                print(format_ratio(results["tidewire"], results["mosquitto"]) + "\n", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
