"""One `$share` group's throughput with its members on 1, 2, 3 nodes of a 3-node cluster on one redis-server.

`python -m loadtest.shared_bench`: one cluster (3 nodes, one redis-server with AOF `appendfsync always`); for k =
1, 2, 3 a fresh group `$share/b<k>/bench/<k>/t` whose `--members` QoS 1 members (acking at once) are spread over
the first k nodes, and `--publishers` closed-loop QoS 1 publishers (`--window` unacknowledged each) spread over
all 3 nodes, so the publishing side is the same for every k and only where the group is served changes. Each
step runs `--seconds` after a warm-up; it prints the rate the members received at, then stops the publishers and
counts what was lost (acknowledged to a publisher, never received) and received more than once, and what Redis
did per delivered message (scripts, round trips) and the CPU the nodes and Redis used per message: the costs that
do not depend on the machine's other load, as the rate does.

The nodes are unpinned by default (they share the machine's cores with redis-server and this load generator):
on a 2-core machine the group's rate grows with its nodes only while one node's core, not the machine, is the
bound. `--node-core 0` pins every node on one core (then more nodes spread the group's work, not the CPU).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from loadtest.client import Counters, MqttConn, Publisher
from loadtest.cluster_procs import Cluster
from loadtest.redis_proc import RedisProc, delta
from loadtest.servers import cpu_seconds

WARMUP_S = 1.0  # s of load before the measured window: members joined, group claims flowing
DRAIN_QUIET_S = 2.0  # s without a new delivery after the publishers stop: everything owed has arrived
DRAIN_LIMIT_S = 30.0


@dataclass(slots=True)
class Step:
    member_nodes: int
    msgs_per_s: float
    per_node: dict[str, int]  # messages received by each node's members during the whole step
    acked: int  # publishes acknowledged to the publishers
    received: int  # deliveries to the members
    lost: int  # acknowledged, never delivered (acked - received, if positive)
    extra: int  # delivered more than once (received - acked, if positive)
    scripts_per_msg: float  # Redis EVALSHA calls per delivered message over the step (appends, claims, settles)
    round_trips_per_msg: float  # Redis read events per delivered message: what the store's load follows
    node_cpu_us_per_msg: float  # CPU of the 3 nodes (publishing and delivering) per delivered message
    redis_cpu_us_per_msg: float


async def _member(cluster: Cluster, node: int, name: str, share: str, counters: Counters) -> MqttConn:
    conn = await cluster.node(node).endpoint().connect(name, counters)
    granted = await conn.subscribe(share, 1)
    if granted != 1:
        raise RuntimeError(f"{name}: SUBACK {granted:#x} for {share}")
    return conn


async def run_step(cluster: Cluster, k: int, members: int, publishers: int, window: int, seconds: float,
                   payload: int) -> Step:
    assert isinstance(cluster.redis, RedisProc)
    redis_before = cluster.redis.counters()
    pids = [node.proc.pid for node in cluster.nodes if node.proc is not None]
    cpu_before = sum(map(cpu_seconds, pids)), cpu_seconds(cluster.redis.pid)
    topic = f"bench/{k}/t"
    share = f"$share/b{k}/{topic}"
    node_counters = {f"n{i}": Counters() for i in range(1, k + 1)}
    subs = [await _member(cluster, 1 + i % k, f"m{k}-{i}", share, node_counters[f"n{1 + i % k}"])
            for i in range(members)]
    pub_counters = Counters()
    pubs: list[MqttConn] = []
    for i in range(publishers):
        conn = await cluster.node(1 + i % cluster.n).endpoint().connect(f"p{k}-{i}", pub_counters)
        conn.publisher = Publisher(pub_counters, topic, 1, 1000 * k + i, payload, window)
        conn.refill = True
        pubs.append(conn)
    for conn in pubs:
        conn.send(window)

    def received() -> int:
        return sum(c.received for c in node_counters.values())

    await asyncio.sleep(WARMUP_S)
    start, t0 = received(), time.monotonic()
    await asyncio.sleep(seconds)
    rate = (received() - start) / (time.monotonic() - t0)
    for conn in pubs:
        conn.refill = False
    deadline = time.monotonic() + DRAIN_LIMIT_S
    while pub_counters.acked < pub_counters.sent and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    last, quiet_since = received(), time.monotonic()
    while time.monotonic() - quiet_since < DRAIN_QUIET_S and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        if received() != last:
            last, quiet_since = received(), time.monotonic()
    for conn in [*pubs, *subs]:
        conn.close()
    got, acked = received(), pub_counters.acked
    redis = delta(redis_before, cluster.redis.counters())
    node_cpu, redis_cpu = sum(map(cpu_seconds, pids)) - cpu_before[0], cpu_seconds(cluster.redis.pid) - cpu_before[1]
    per = max(got, 1)
    return Step(k, rate, {n: c.received for n, c in node_counters.items()}, acked, got, max(0, acked - got),
                max(0, got - acked), redis.calls.get("evalsha", 0) / per, redis.reads / per, node_cpu * 1e6 / per,
                redis_cpu * 1e6 / per)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m loadtest.shared_bench", description=__doc__.splitlines()[0])
    ap.add_argument("--members", type=int, default=6, help="members of the group, spread over its nodes")
    ap.add_argument("--publishers", type=int, default=6, help="spread over all 3 nodes")
    ap.add_argument("--window", type=int, default=100, help="unacknowledged QoS 1 publishes per publisher")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--payload", type=int, default=64)
    ap.add_argument("--node-core", type=int, default=None, help="pin every node on this core (default: unpinned)")
    ap.add_argument("--redis-core", type=int, default=None, help="pin redis-server on this core")
    return ap.parse_args(argv)


def measure(members: int = 6, publishers: int = 6, window: int = 100, seconds: float = 5.0, payload: int = 64,
            node_core: int | None = None, redis_core: int | None = None) -> list[Step]:
    """A fresh 3-node cluster; the group's steps with members on 1, 2, 3 nodes."""
    async def steps(cluster: Cluster) -> list[Step]:
        return [await run_step(cluster, k, members, publishers, window, seconds, payload) for k in (1, 2, 3)]

    with Cluster(3, node_core=node_core, redis_core=redis_core) as cluster:
        return asyncio.run(steps(cluster))


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    print(f"# python -m loadtest.shared_bench {' '.join(sys.argv[1:] if argv is None else argv)}", flush=True)
    steps = measure(args.members, args.publishers, args.window, args.seconds, args.payload, args.node_core,
                    args.redis_core)
    for s in steps:
        spread = " ".join(f"{n}={c}" for n, c in s.per_node.items())
        print(f"members on {s.member_nodes} node(s): {s.msgs_per_s:8.0f} msg/s   per node {spread}   "
              f"acked {s.acked}  received {s.received}  lost {s.lost}  extra {s.extra}   Redis per message: "
              f"{s.scripts_per_msg:.2f} scripts, {s.round_trips_per_msg:.2f} round trips; CPU per message: nodes "
              f"{s.node_cpu_us_per_msg:.0f} us, Redis {s.redis_cpu_us_per_msg:.0f} us", flush=True)
    return 0 if all(s.lost == 0 for s in steps) else 1


if __name__ == "__main__":
    sys.exit(main())
