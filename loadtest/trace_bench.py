"""What a running trace costs: `python -m loadtest.trace_bench [--scenario pairs] [--seconds 5] [--runs 3]`.

Runs a scenario (`loadtest.scenarios`) against Tidewire (server pinned to core 0, this generator to core 1) with
no trace, with a client-id trace of one client that is not in the run (what every untraced connection pays while
a trace runs elsewhere), with a topic trace matching none of the run's topics (every connection tapped, what it
writes decoded, nothing recorded) and with a topic trace matching every benchmark topic (every publish decoded and
recorded in and out: the worst case), interleaved, `--runs` times; prints the medians of each.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import httpx

from loadtest import servers
from loadtest.bench import run_event_loop
from loadtest.scenarios import Params, Result

TRACES: dict[str, dict[str, object] | None] = {
    "no trace": None,
    "client trace (elsewhere)": {"name": "bench", "client_id": "not-in-the-run", "duration": 3600},
    "topic trace matching none": {"name": "bench", "topic": "elsewhere/#", "duration": 3600},
    "topic trace bench/#": {"name": "bench", "topic": "bench/#", "duration": 3600},
}


def _start(token: str) -> tuple[servers.Server, int]:
    host = "127.0.0.1"
    port, admin_port = servers.free_port(host), servers.free_port(host)
    workdir = Path(tempfile.mkdtemp(prefix="loadtest-trace-"))
    cmd = servers.tidewire_command(host, port, workdir / "data")
    cmd[cmd.index("--admin-port") + 1] = str(admin_port)
    env = {**os.environ, "TIDEWIRE_LOG_LEVEL": "warning", "TIDEWIRE_API_TOKEN": token}
    return servers._spawn("tidewire", [*servers._pin_prefix(servers.SERVER_CORE), *cmd], host, port, workdir,
                          "tidewire", env=env, timeout=30.0), admin_port


def _one(scenario: str, p: Params, trace: dict[str, object] | None) -> Result:
    token = secrets.token_hex(16)
    server, admin_port = _start(token)
    try:
        if trace is not None:
            answer = httpx.post(f"http://127.0.0.1:{admin_port}/api/v1/traces", json=trace,
                                headers={"Authorization": f"Bearer {token}"}, timeout=10)
            answer.raise_for_status()
        return run_event_loop(scenario, server, p)
    finally:
        server.stop()


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="pairs")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--pairs", type=int, default=20)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args(argv)
    if (os.cpu_count() or 1) > 1:
        os.sched_setaffinity(0, {1})
    p = Params(seconds=args.seconds, pairs=args.pairs)
    rates: dict[str, list[float]] = {name: [] for name in TRACES}
    p99: dict[str, list[float]] = {name: [] for name in TRACES}
    for _ in range(args.runs):
        for name, trace in TRACES.items():
            result = _one(args.scenario, p, trace)
            rates[name].append(result.rate)
            p99[name].append(result.p99_ms or 0.0)
            print(f"  {name}: {result.rate:,.0f} {result.unit}, p99 {result.p99_ms} ms", file=sys.stderr)
    base = statistics.median(rates["no trace"])
    for name in TRACES:
        rate = statistics.median(rates[name])
        print(f"{name:28s} median {rate:10,.0f} msgs/s ({(rate / base - 1) * 100:+.1f}%), "
              f"p99 median {statistics.median(p99[name]):.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
