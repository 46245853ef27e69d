"""Aggregate throughput against the number of gateway nodes: 1, 2, 3 nodes on one Redis and on a Redis Cluster.

`python -m loadtest.cluster_scale --nodes 1,2,3`: for each store and N, a fresh store (one redis-server, or 3
cluster masters, AOF `appendfsync always`; or one node on the embedded store, fsync on, the reference for the
ratio of a Redis node to an embedded one) and N node processes; on every node
one closed-loop QoS 1 fan-in load of the C tool (`mqttload fanin`: `--publishers` publishers keeping `--window`
publishes unacknowledged), whose subscriber sits on the next node (node N's on node 1), so with N > 1 every
message crosses nodes and the cluster notify path is part of the measure. All loads run at once for
`--seconds`; the aggregate is the sum of messages/s their subscribers received, with losses, duplicates and
gaps counted. Alongside: Redis commands, script calls and round trips (read events) per message from
`INFO commandstats`/`INFO stats` (summed over the masters), and the CPU the nodes and the store used.

The nodes share core 0; the store and the loads share core 1 (two cores here). More nodes add throughput only
while the nodes wait on the store rather than on core 0: the figure that scales to more machines is the
per-message cost on the store (its commands and round trips), which this prints for every N.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from loadtest import bench, conn_bench, servers
from loadtest.cluster_procs import Cluster
from loadtest.redis_proc import RedisClusterProc, RedisCounters, RedisProc, delta

STORES = ("embedded", "redis", "redis-cluster")  # embedded: one node, the reference the others are read against
WARMUP_S = 1.0  # a first short load per node: membership formed, lookup complete, caches warm
LOAD_TIMEOUT_PAD = 60.0  # s beyond --seconds a load process may take (setup and drain)


@dataclass(slots=True)
class ScaleConfig:
    publishers: int = 10  # per node
    window: int = 100  # unacknowledged QoS 1 publishes per publisher
    seconds: float = 5.0
    payload: int = 64
    node_core: int | None = servers.SERVER_CORE
    store_core: int | None = servers.REDIS_CORE
    load_core: int | None = conn_bench.LOAD_CORE


@dataclass(slots=True)
class ScaleRun:
    store: str
    nodes: int
    msgs_per_s: float  # sum over the loads of what their subscribers received per second
    per_node: list[float]
    sent: int
    received: int
    lost: int
    dup: int
    gaps: int
    p50_ms: float  # median over the loads of each load's p50
    p99_ms: float  # the worst load's p99
    commands_per_msg: float
    scripts_per_msg: float
    round_trips_per_msg: float
    nodes_cpu: float  # CPU seconds of all node processes per wall second
    store_cpu: float
    errors: list[str] = field(default_factory=list)


def _load_command(exe: str, cfg: ScaleConfig, port: int, sub_port: int, tag: str, seconds: float) -> list[str]:
    return [*conn_bench.pin_prefix(cfg.load_core), exe, "fanin", "--port", str(port), "--sub-port", str(sub_port),
            "-n", str(cfg.publishers), "--window", str(cfg.window), "--seconds", str(seconds),
            "--payload", str(cfg.payload), "--prefix", tag, "--topic", f"bench/scale/{tag}",
            "--timeout", str(seconds + LOAD_TIMEOUT_PAD)]


def _run_loads(exe: str, cfg: ScaleConfig, cluster: Cluster, tag: str, seconds: float) -> list[dict[str, Any]]:
    """One fan-in load per node at once (publishers on node i, subscriber on node i+1); their JSON results."""
    n = cluster.n
    procs = [subprocess.Popen(_load_command(exe, cfg, cluster.node(i).port, cluster.node(i % n + 1).port,
                                            f"{tag}-n{i}", seconds), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(1, n + 1)]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=seconds + LOAD_TIMEOUT_PAD + 10)
        lines = out.strip().splitlines()
        if not lines:
            raise RuntimeError(f"a fan-in load printed nothing (exit {proc.returncode}): {err[-500:]}")
        results.append(conn_bench.parse_json_line(lines[-1], "fanin"))
    return results


def _store_pids(store: RedisProc | RedisClusterProc | None) -> list[int]:
    if store is None:
        return []
    return [s.pid for s in store.servers] if isinstance(store, RedisClusterProc) else [store.pid]


def _counters(store: RedisProc | RedisClusterProc | None) -> RedisCounters:
    return store.counters() if store is not None else RedisCounters({}, 0, 0)


def measure(store: str, n: int, cfg: ScaleConfig, exe: str) -> ScaleRun:
    with Cluster(n, store=store, node_core=cfg.node_core, redis_core=cfg.store_core) as cluster:
        redis = cluster.redis
        _run_loads(exe, cfg, cluster, "warm", WARMUP_S)
        node_pids = [node.proc.pid for node in cluster.nodes if node.proc is not None]
        store_pids = _store_pids(redis)
        before = _counters(redis)
        cpu0 = [servers.cpu_seconds(p) for p in node_pids], [servers.cpu_seconds(p) for p in store_pids]
        t0 = time.monotonic()
        results = _run_loads(exe, cfg, cluster, "run", cfg.seconds)
        wall = time.monotonic() - t0
        cpu1 = [servers.cpu_seconds(p) for p in node_pids], [servers.cpu_seconds(p) for p in store_pids]
        used = delta(before, _counters(redis))
    received = sum(int(r["received"]) for r in results)
    scripts = used.calls.get("evalsha", 0) + used.calls.get("eval", 0) + used.calls.get("fcall", 0)
    per = max(received, 1)
    errors = [f"n{i}: {r['errors']}" for i, r in enumerate(results, 1) if r.get("errors")]
    return ScaleRun(
        store, n, sum(float(r["msgs_per_s"]) for r in results), [float(r["msgs_per_s"]) for r in results],
        sum(int(r["sent"]) for r in results), received, sum(int(r["lost"]) for r in results),
        sum(int(r["dup"]) for r in results), sum(int(r["gaps"]) for r in results),
        statistics.median(float(r["p50_ms"]) for r in results), max(float(r["p99_ms"]) for r in results),
        used.commands / per, scripts / per, used.reads / per,
        (sum(cpu1[0]) - sum(cpu0[0])) / wall, (sum(cpu1[1]) - sum(cpu0[1])) / wall, errors)


def summary(runs: list[ScaleRun]) -> str:
    mid = sorted(runs, key=lambda r: r.msgs_per_s)[len(runs) // 2]
    return (f"scale        {mid.store} N={mid.nodes}: median of {len(runs)} runs {mid.msgs_per_s:,.0f} msgs/s "
            f"(runs {', '.join(f'{r.msgs_per_s:,.0f}' for r in runs)}; per node "
            f"{', '.join(f'{x:,.0f}' for x in mid.per_node)}); p50 {mid.p50_ms:.1f} ms, p99 {mid.p99_ms:.1f} ms; "
            f"lost {sum(r.lost for r in runs)}, dup {sum(r.dup for r in runs)}, gaps {sum(r.gaps for r in runs)}; "
            f"per msg: {mid.commands_per_msg:.2f} Redis commands, {mid.scripts_per_msg:.2f} scripts, "
            f"{mid.round_trips_per_msg:.2f} round trips; CPU nodes {mid.nodes_cpu:.0%}, store {mid.store_cpu:.0%}")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m loadtest.cluster_scale", description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="1,2,3")
    ap.add_argument("--stores", default=",".join(STORES))
    ap.add_argument("--runs", type=int, default=3)
    defaults = ScaleConfig()
    ap.add_argument("--publishers", type=int, default=defaults.publishers, help="per node")
    ap.add_argument("--window", type=int, default=defaults.window)
    ap.add_argument("--seconds", type=float, default=defaults.seconds)
    ap.add_argument("--no-pin", action="store_true")
    ap.add_argument("--json", type=argparse.FileType("w"), default=None, help="also write every run here")
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    stores = [s for s in args.stores.split(",") if s]
    bad = [s for s in stores if s not in STORES]
    if "embedded" in stores and args.nodes != "1":
        print("embedded: one node only; measured at N=1", file=sys.stderr)
    if bad:
        print(f"unknown store: {', '.join(bad)}", file=sys.stderr)
        return 2
    pin = not args.no_pin
    cfg = ScaleConfig(args.publishers, args.window, args.seconds, node_core=servers.SERVER_CORE if pin else None,
                      store_core=servers.REDIS_CORE if pin else None, load_core=conn_bench.LOAD_CORE if pin else None)
    bench.raise_nofile()
    exe = str(conn_bench.build_tool())
    print(f"# python -m loadtest.cluster_scale {' '.join(sys.argv[1:] if argv is None else argv)}\n"
          f"# cores {os.cpu_count()}; nodes on core {cfg.node_core}, store and loads on core {cfg.store_core}; "
          f"per node {cfg.publishers} QoS 1 publishers, window {cfg.window}, {cfg.seconds:g} s", flush=True)
    failed = False
    medians: dict[tuple[str, int], float] = {}
    for store in stores:
        for n in [1] if store == "embedded" else [int(x) for x in args.nodes.split(",")]:
            runs: list[ScaleRun] = []
            for _ in range(max(1, args.runs)):
                try:
                    run = measure(store, n, cfg, exe)
                except (RuntimeError, OSError, subprocess.SubprocessError) as e:
                    print(f"error        {store} N={n}: {str(e)[:1500]}", file=sys.stderr, flush=True)
                    failed = True
                    break
                runs.append(run)
                failed |= bool(run.errors) or run.lost > 0
                if args.json is not None:
                    args.json.write(json.dumps(dataclasses.asdict(run)) + "\n")
            if runs:
                print(summary(runs), flush=True)
                medians[(store, n)] = statistics.median(r.msgs_per_s for r in runs)
    reference = medians.get(("embedded", 1))
    for (store, n), rate in medians.items():
        if reference and store != "embedded":
            print(f"ratio        {store} N={n}: {rate / reference:.2f}x the embedded node in aggregate, "
                  f"{rate / n / reference:.2f}x per node (aim per node at N=1: >= 0.6)", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
