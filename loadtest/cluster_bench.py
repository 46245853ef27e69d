"""Benchmarks of the Redis store and of a cluster of gateway nodes (issue 7); prints a report.

`python -m loadtest.cluster_bench store`: fan-in QoS 1 and fan-out on the Redis store vs the embedded store,
median of `--runs` fresh servers each; node on core 0, redis-server (AOF `appendfsync always`) on core 1, this
load generator on core 2 if there is one, else sharing core 1 with Redis. Prints the ratio redis/embedded (aim
≥ 0.5) and, from `INFO commandstats`/`INFO stats` around each Redis run, commands, EVALSHA calls and round trips
(`total_reads_processed`: read events on client sockets) per message.

`python -m loadtest.cluster_bench cluster --nodes 3,5`: redis + N node processes (all nodes on core 0 by
default); cross-node delivery latency (publisher on n1, subscriber on n2, QoS 1); notify frames per publish
with subscribers on k = 1, 2, N nodes, read from the nodes' `$SYS/brokers/<node>/stats/...` counters (idle
traffic subtracted); and `kill -9` of n2 → time until its persistent subscribers receive again on other nodes.

Measured on the 2-core dev container (load shares core 1 with Redis, which handicaps Redis), medians of 3,
after the fix that bounds a queue refresh per dispatch round (before it, fan-in on Redis delivered nothing
until publishers stopped):
  `python -m loadtest.cluster_bench --runs 3 store` (embedded → redis, ratio):
    fanin (10 pubs, window 100)  59,407 → 27,619 msgs/s delivered, p50 10 → 45 ms: 0.46
    fanin-max (p99 ≤ 50 ms)      38,563 → 13,478 msgs/s: 0.35
    fanout-max 1→200, QoS 0      1,014,081 → 777,183 deliveries/s: 0.77
    Redis per message: fan-in at 3k msgs/s 3.44 commands, 0.36 EVALSHA, 0.36 round trips (zadd 1.54); fan-out
    1→200 at 100 msgs/s 25.6 commands (0.128 per delivery), 4.2 EVALSHA, 5.6 round trips.
  `python -m loadtest.cluster_bench --runs 3 cluster` (N = 3 / 5, nodes all on core 0):
    n1 → n2 latency at 1k msgs/s QoS 1: p50 1.56 / 2.07 ms, p99 7.97 / 11.14 ms, no loss.
    notify frames per publish at 1k msgs/s, subscribers on k = 1, 2, N nodes: N=3 0.81, 0.90, 1.29;
    N=5 1.27, 1.79, 2.07. Forced broadcast (one run, with a benchmark-only setting
    since taken out of the production settings; `--variant-env KEY=VALUE` runs a variant with any node env):
    N=3 0.55 whatever k; N=5 1.14, 1.10, 0.71 (fewer frames at this rate: one hop merging ~4 publishes per
    flush, against two hops, publisher → slot owner → interested nodes, for targeted notify).
    kill -9 n2, 20 persistent subscribers: receiving again on n1/n3 after p50 134 / 112 ms (max 180 / 168 ms);
    lost 0; ~340 duplicates per subscriber (offsets are written every 100 ms).
Issue 20 (one-hop notify on leased answers, no read-back of a node's own batches, two appends in flight):
  `python -m loadtest.cluster_bench --runs 3 cluster --nodes 3,5 --measure frames
   --variant-env TIDEWIRE_CLUSTER_NOTIFY_LEASE=0`, frames per publish at 500 msgs/s, k = 1, 2, N, leased (lease
   0 = through the slot owner): N=3 0.22, 0.42, 0.44 (0.60, 0.65, 0.72); N=5 0.25, 0.46, 0.87 (1.28, 1.48, 2.52).
  `--runs 1 store --measures fanin-cmds,fanout-cmds`: fan-in at 3k msgs/s 3.49 commands, 0.21 EVALSHA, 0.22
  round trips per message; fan-out 1→200 at 100 msgs/s 22.45 commands (0.112 per delivery), 3.12 EVALSHA, 5.16
  round trips. Fan-in per node against node count: `python -m loadtest.cluster_scale`.
Issue 22 (acknowledgements wait for replicas, `store_replicas`): `python -m loadtest.cluster_bench --runs 3 store
  --stores redis-replica-wait0,redis-replica-wait1 --measures fanin` (a primary with one replica, both AOF always
  on core 1; waits 0 / 1), on a machine whose core 0 was 83-91% busy with other processes (so far below the
  figures above): fanin 6,319 / 4,387 msgs/s delivered (ratio 0.69); again with `--stores
  redis,redis-replica-wait0,redis-replica-wait1`: 5,618 (no replica) / 8,007 / 4,720 (ratio 0.59; one wait1 run
  failed to start in time). p50 latency unchanged within the noise (~100-145 ms at this load).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import os
import secrets
import statistics
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from loadtest import bench, servers
from loadtest.client import Counters, MqttConn, Publisher
from loadtest.cluster_procs import Cluster, StatsMonitor
from loadtest.failover import FailoverResult, failover
from loadtest.scenarios import Result, _paced, _settle, close_all, percentiles, subscribe_all
from loadtest.store_bench import MEASURES, StoreConfig, compare_stores, run

T = TypeVar("T")
FRAMES_KEYS = ("notify/frames_sent", "cluster/frames_sent", "frames_sent")  # first one a node publishes wins
BROADCAST_KEYS = ("notify/broadcasts", "cluster/notify_broadcasts", "notify_broadcasts")
NOTIFY_CAST_KEYS = (("notify/route_msgs", "notify_route_msgs"), ("notify/event_msgs", "notify_event_msgs"),
                    ("notify/broadcast_msgs", "notify_broadcast_msgs"), ("notify/direct_msgs", "notify_direct_msgs"),
                    ("notify/catchup_msgs", "notify_catchup_msgs"), ("notify/lease_msgs", "notify_lease_msgs"),
                    ("notify/update_msgs", "notify_update_msgs"))
PROBE_WAIT_S = 1.0  # a cluster "works" once a QoS 1 publish on n1 reaches every other node within this


# --- cluster ---------------------------------------------------------------------------------------------------
async def cluster_works(cluster: Cluster, timeout: float = 15.0) -> str | None:
    """None once a QoS 1 publish on n1 reaches a subscriber on every other node within PROBE_WAIT_S; else why not."""
    tok = secrets.token_hex(3)
    topic = f"bench/probe/{tok}"
    subs: list[tuple[str, Counters, MqttConn]] = []
    pub: MqttConn | None = None
    try:
        for node in cluster.nodes[1:]:
            c = Counters()
            conn = await node.endpoint().connect(f"lt-probe-{tok}-{node.node_id}", c)
            subs.append((node.node_id, c, conn))
            await subscribe_all([conn], [topic], 1)
        pub_counters = Counters()
        pub = await cluster.node(1).endpoint().connect(f"lt-probe-{tok}-p", pub_counters)
        pub.publisher = Publisher(pub_counters, topic, 1, 1, 64)
        deadline = time.monotonic() + timeout
        missing = [nid for nid, _, _ in subs]
        while time.monotonic() < deadline:
            before = [c.received for _, c, _ in subs]
            pub.send(1)
            await asyncio.sleep(PROBE_WAIT_S)
            missing = [nid for (nid, c, _), b in zip(subs, before, strict=True) if c.received <= b]
            if not missing:
                return None
        return (f"a QoS 1 publish on n1 did not reach a subscriber on {', '.join(missing)} within "
                f"{PROBE_WAIT_S:.0f} s (tried for {timeout:.0f} s)")
    except (OSError, TimeoutError, RuntimeError) as e:
        return f"probe failed: {e!r}"
    finally:
        await close_all([c for _, _, c in subs] + ([pub] if pub is not None else []))


async def cross_node_latency(cluster: Cluster, *, rate: float, seconds: float, warmup: float = 0.5,
                             pub_node: int = 1, sub_node: int = 2, payload: int = 64, drain: float = 2.0) -> Result:
    """QoS 1 at `rate` msgs/s from a publisher on pub_node to one subscriber on sub_node (after a warm-up)."""
    tok = secrets.token_hex(3)
    topic = f"bench/xlat/{tok}"
    counters = Counters()
    sub = await cluster.node(sub_node).endpoint().connect(f"lt-xl-{tok}-s", counters)
    conns = [sub]
    try:
        pub = await cluster.node(pub_node).endpoint().connect(f"lt-xl-{tok}-p", counters)
        conns.append(pub)
        await subscribe_all([sub], [topic], 1)
        pub.publisher = Publisher(counters, topic, 1, 1, payload)
        await _paced([pub], rate, warmup)  # the lookup learns where the subscriber is
        await _settle(counters, [pub], 1, 1, drain)
        counters.reset()
        t0 = time.perf_counter()
        skipped = await _paced([pub], rate, seconds)
        duration = time.perf_counter() - t0
        await _settle(counters, [pub], 1, 1, drain)
        p50, p99, p999 = percentiles(counters.latencies_ns)
        return Result("xnode-latency", f"cluster of {cluster.n}", counters.received / duration, sent=counters.sent,
                      received=counters.received, lost=max(0, counters.acked - (counters.received - counters.dup)),
                      dup=counters.dup, p50_ms=p50, p99_ms=p99, p999_ms=p999, duration_s=duration,
                      extra={"acked": counters.acked, "skipped_window_full": skipped})
    finally:
        await close_all(conns)


def counter_sum(snap: dict[str, dict[str, float]], names: Sequence[str]) -> float | None:
    """Sum over nodes of the first of `names` (or a `<prefix>/<name>`) each node publishes; None if none does."""
    total, found = 0.0, False
    for values in snap.values():
        for name in names:
            hit = values.get(name)
            if hit is None:
                hit = next((v for k, v in values.items() if k.endswith("/" + name)), None)
            if hit is not None:
                total, found = total + hit, True
                break
    return total if found else None


def _per_publish(a: float | None, b: float | None, c: float | None, idle_scale: float, published: int) -> float | None:
    """(c - b) minus the idle traffic of a → b scaled to the same length, per publish."""
    if a is None or b is None or c is None or not published:
        return None
    return ((c - b) - (b - a) * idle_scale) / published


@dataclass(slots=True)
class FramesRow:
    n: int
    k: int
    published: int
    delivered: int
    frames: float | None  # RPC frames sent by all nodes, per publish
    casts: float | None  # notify route + event + broadcast casts, per publish
    broadcasts: float | None  # notify broadcasts, per publish
    segments: float | None  # TCP data segments between cluster ports (ss), per publish

    def line(self) -> str:
        def f(v: float | None) -> str:
            return "n/a" if v is None else f"{v:.2f}"

        return (f"frames       N={self.n} k={self.k}: published {self.published:,}, delivered {self.delivered:,}/"
                f"{self.published * self.k:,}; frames/publish {f(self.frames)}, notify casts/publish {f(self.casts)}, "
                f"broadcasts/publish {f(self.broadcasts)}, link segments/publish {f(self.segments)}; a forced "
                f"broadcast would send {self.n - 1} per flush")


async def notify_frames(cluster: Cluster, monitor: StatsMonitor, k: int, *, rate: float, seconds: float,
                        topics: int = 6, drain: float = 2.0) -> FramesRow:
    """`topics` publishers on n1 (one topic each, so the topics' lookup owners spread over the nodes), one QoS 1
    subscriber to all of them on each of k nodes (n2, n3, ..., then n1); counters read from $SYS (and `ss`)
    before an idle window, between it and a publishing window of the same length, and after."""
    tok = secrets.token_hex(3)
    names = [f"bench/nf/{tok}/{i}" for i in range(topics)]
    counters = Counters()
    chosen = [cluster.node(i % cluster.n + 1) for i in range(1, k + 1)]
    conns: list[MqttConn] = []
    try:
        for i, node in enumerate(chosen):
            conns.append(await node.endpoint().connect(f"lt-nf-{tok}-s{i}", counters))
        for topic in names:
            await subscribe_all(conns, [topic] * k, 1)
        pubs = [await cluster.node(1).endpoint().connect(f"lt-nf-{tok}-p{i}", counters) for i in range(topics)]
        conns += pubs
        for i, (pub, topic) in enumerate(zip(pubs, names, strict=True)):
            pub.publisher = Publisher(counters, topic, 1, i + 1, 64)
        await _paced(pubs, rate, 0.3)  # warm-up: every interested node is in the lookup
        await _settle(counters, pubs, k, 1, drain)
        ta, a = await monitor.snapshot()
        sa = cluster.link_segments()
        await asyncio.sleep(seconds)
        tb, b = await monitor.snapshot()
        sb = cluster.link_segments()
        counters.reset()
        await _paced(pubs, rate, seconds)
        await _settle(counters, pubs, k, 1, drain)
        tc, c = await monitor.snapshot()
        sc = cluster.link_segments()
        scale = (tc - tb) / max(tb - ta, 1e-9)
        published = counters.acked

        def casts(snap: dict[str, dict[str, float]]) -> float | None:
            parts = [counter_sum(snap, names) for names in NOTIFY_CAST_KEYS]
            return None if any(x is None for x in parts) else sum(x for x in parts if x is not None)

        return FramesRow(
            cluster.n, k, published, counters.received - counters.dup,
            _per_publish(counter_sum(a, FRAMES_KEYS), counter_sum(b, FRAMES_KEYS), counter_sum(c, FRAMES_KEYS),
                         scale, published),
            _per_publish(casts(a), casts(b), casts(c), scale, published),
            _per_publish(counter_sum(a, BROADCAST_KEYS), counter_sum(b, BROADCAST_KEYS),
                         counter_sum(c, BROADCAST_KEYS), scale, published),
            _per_publish(sa, sb, sc, scale, published))
    finally:
        await close_all(conns)


def _cluster(n: int, args: argparse.Namespace, env: dict[str, str]) -> Cluster:
    pin = not args.no_pin
    return Cluster(n, node_core=args.node_core if pin else None, redis_core=servers.REDIS_CORE if pin else None,
                   sys_interval=args.sys_interval, extra_env=env)


async def _latency_and_frames(cluster: Cluster, *, args: argparse.Namespace, measures: set[str], label: str) -> None:
    if "latency" in measures:
        rs = [await cross_node_latency(cluster, rate=args.latency_rate, seconds=args.latency_seconds)
              for _ in range(args.runs)]
        p50 = statistics.median(r.p50_ms or 0.0 for r in rs)
        p99 = statistics.median(r.p99_ms or 0.0 for r in rs)
        print(f"latency      N={cluster.n}{label} n1 → n2 QoS 1 at {args.latency_rate:,.0f} msgs/s: median of "
              f"{len(rs)} runs p50 {p50:.2f} ms, p99 {p99:.2f} ms (runs p99 "
              f"{', '.join(f'{r.p99_ms or 0:.2f}' for r in rs)}); lost {sum(r.lost for r in rs)}, "
              f"dup {sum(r.dup for r in rs)}", flush=True)
    if "frames" in measures:
        monitor = await StatsMonitor(cluster.sys_interval).open(cluster.nodes)
        try:
            for k in sorted({1, min(2, cluster.n), cluster.n}):
                row = await notify_frames(cluster, monitor, k, rate=args.frames_rate, seconds=args.frames_seconds)
                print(row.line() + label, flush=True)
        finally:
            monitor.close()


def _on_fresh_cluster(n: int, args: argparse.Namespace, env: dict[str, str],
                      work: Callable[[Cluster], Coroutine[Any, Any, T]]) -> T:
    """Start redis + n nodes, check that a publish crosses nodes, run `work`, stop everything."""
    with _cluster(n, args, env) as cluster:
        why = run(cluster_works(cluster))
        if why is not None:
            raise RuntimeError(f"cluster of {n} does not work: {why}")
        return run(work(cluster))


def _report_failovers(n: int, results: list[FailoverResult]) -> None:
    resumed = [statistics.median(r.resume_ms) for r in results if r.resume_ms]
    worst = [max(r.resume_ms) for r in results if r.resume_ms]
    if resumed:
        print(f"failover     N={n}: median over {len(resumed)} runs: kill -9 → receiving again p50 "
              f"{statistics.median(resumed):,.0f} ms, max {statistics.median(worst):,.0f} ms; lost "
              f"{sum(r.lost for r in results)}, dup {sum(r.dup for r in results):,}", flush=True)


def run_cluster(args: argparse.Namespace) -> bool:
    ok = True
    measures = set(args.measure.split(","))
    variants: list[tuple[str, dict[str, str]]] = [("", {})]
    for setting in args.variant_env or []:
        key, _, value = setting.partition("=")
        variants.append((f" ({key}={value})", {key: value}))
    for n in (int(x) for x in args.nodes.split(",")):
        for label, env in variants if measures & {"latency", "frames"} else []:
            try:
                _on_fresh_cluster(n, args, env, functools.partial(_latency_and_frames, args=args,
                                                                  measures=measures, label=label))
            except Exception as e:  # report and go on with the other measures
                ok = False
                print(f"error        N={n}{label} latency/frames did not run: {str(e)[:1500]}", file=sys.stderr,
                      flush=True)
        results: list[FailoverResult] = []
        for _ in range(args.runs if "failover" in measures else 0):  # a fresh cluster per run: a node dies in each
            try:
                r = _on_fresh_cluster(n, args, {}, functools.partial(
                    failover, victim=2, subscribers=args.failover_subscribers, rate=args.failover_rate,
                    after=args.failover_after))
            except Exception as e:
                ok = False
                print(f"error        N={n} failover did not run: {str(e)[:1500]}", file=sys.stderr, flush=True)
                break
            results.append(r)
            print(f"failover     {r.summary()}", flush=True)
        _report_failovers(n, results)
    return ok


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m loadtest.cluster_bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--no-pin", action="store_true", help="pin nothing")
    ap.add_argument("--runs", type=int, default=3, help="runs per measurement; the median is reported")
    modes = ap.add_subparsers(dest="mode", required=True)
    st = modes.add_parser("store", help="Redis store vs embedded store on one node (loadtest.store_bench)")
    st.add_argument("--measures", default=",".join(MEASURES))
    st.add_argument("--stores", default="embedded,redis")
    for f in dataclasses.fields(StoreConfig):
        st.add_argument("--" + f.name.replace("_", "-"), dest=f.name, type=type(f.default), default=f.default)
    cl = modes.add_parser("cluster", help="N nodes on one Redis")
    cl.add_argument("--nodes", default="3,5", help="cluster sizes")
    cl.add_argument("--measure", default="latency,frames,failover")
    cl.add_argument("--node-core", type=int, default=servers.SERVER_CORE, help="core every node is pinned to")
    cl.add_argument("--sys-interval", type=float, default=1.0, help="TIDEWIRE_SYS_INTERVAL of the nodes")
    cl.add_argument("--latency-rate", type=float, default=1000.0)
    cl.add_argument("--latency-seconds", type=float, default=3.0)
    cl.add_argument("--frames-rate", type=float, default=500.0)
    cl.add_argument("--frames-seconds", type=float, default=2.0)
    cl.add_argument("--failover-subscribers", type=int, default=20)
    cl.add_argument("--failover-rate", type=float, default=500.0)
    cl.add_argument("--failover-after", type=float, default=5.0, help="s of streaming after the kill")
    cl.add_argument("--variant-env", action="append", help="KEY=VALUE: latency and frames again on nodes with this "
                    "env (repeatable; e.g. TIDEWIRE_CLUSTER_NOTIFY_LEASE=0: notify always through slot owners)")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    bench.raise_nofile()
    core = bench.load_core("redis")
    pinned = not args.no_pin and bench.pin_self(core)
    print(f"# python -m loadtest.cluster_bench {' '.join(sys.argv[1:] if argv is None else argv)}\n"
          f"# cores {os.cpu_count()}; node core {servers.SERVER_CORE}, redis core {servers.REDIS_CORE}, "
          f"load core {core if pinned else 'unpinned'}", flush=True)
    if args.mode == "store":
        cfg = StoreConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(StoreConfig)})
        ok = compare_stores(args.stores.split(","), args.measures.split(","), cfg, args.runs, not args.no_pin)
    else:
        ok = run_cluster(args)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
