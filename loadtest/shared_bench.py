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

`--process-ms T --members-per-node M` models what a shared group is for: workers that each take T ms per message
(acking one message every T ms, in order, whatever the server sends them meanwhile), M of them on each of the k
nodes. The group's rate is then bound by its members, not the machine's CPU: it grows with k only if the members
on every node are served. Once the window is measured the workers stop taking time, so the backlog drains fast
before lost and duplicated are counted.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from loadtest.client import Counters, MqttConn, Publisher, connect_packet, packet_at, subscribe_packet
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


class Worker(asyncio.Protocol):
    """A QoS 1 member that takes `process_s` per message: it acks the messages it was sent one every
    `process_s`, oldest first (the clock decides how many are due, so a late timer does not slow it down).
    `process_s = 0` acks at once. Counts what it acked into `counters.received`."""

    def __init__(self, counters: Counters, process_s: float) -> None:
        loop = asyncio.get_running_loop()
        self.counters = counters
        self.process_s = process_s
        self.connack: asyncio.Future[int] = loop.create_future()
        self.suback: asyncio.Future[int] = loop.create_future()
        self.transport: asyncio.Transport | None = None
        self._buf = b""
        self._todo: deque[bytes] = deque()  # packet ids received and not yet acked, oldest first
        self._timer: asyncio.TimerHandle | None = None
        self._due_from = 0.0  # when the head of _todo started being processed

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        for fut in (self.connack, self.suback):
            if not fut.done():
                fut.set_exception(exc or ConnectionError("connection closed"))
        if self._timer is not None:
            self._timer.cancel()

    def data_received(self, data: bytes) -> None:
        data, i = self._buf + data, 0
        while (parsed := packet_at(data, i)) is not None:
            first, j, i = parsed
            kind = first >> 4
            if kind == 3 and (first >> 1) & 3:
                p = j + 2 + ((data[j] << 8) | data[j + 1])
                if not self._todo:
                    self._due_from = time.monotonic()
                self._todo.append(data[p:p + 2])
            elif kind == 2 and not self.connack.done():
                self.connack.set_result(data[j + 1])
            elif kind == 9 and not self.suback.done():
                self.suback.set_result(data[j + 2])
        self._buf = data[i:]
        self._work()

    def drain(self) -> None:
        """Stop taking time: everything received and owed is acked as it comes."""
        self.process_s = 0.0
        self._work()

    def _work(self) -> None:
        if not self._todo or self.transport is None or self.transport.is_closing():
            return
        now = time.monotonic()
        due = len(self._todo) if self.process_s == 0 else int((now - self._due_from) / self.process_s)
        if due:
            due = min(due, len(self._todo))
            self.transport.write(b"".join(b"\x40\x02" + self._todo.popleft() for _ in range(due)))
            self.counters.received += due
            self._due_from = now if self.process_s == 0 else self._due_from + due * self.process_s
        if self._todo and (self._timer is None or self._timer.cancelled() or self._timer.when() <= now):
            self._timer = asyncio.get_running_loop().call_later(
                max(self.process_s - (now - self._due_from), 0.0005), self._work)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


async def _member(cluster: Cluster, node: int, name: str, share: str, counters: Counters,
                  process_s: float) -> Worker | MqttConn:
    ep = cluster.node(node).endpoint()
    conn: Worker | MqttConn
    if process_s == 0:
        conn = await ep.connect(name, counters)
        granted = await conn.subscribe(share, 1)
    else:
        transport, worker = await asyncio.get_running_loop().create_connection(
            lambda: Worker(counters, process_s), ep.host, ep.port)
        transport.write(connect_packet(name))
        if await asyncio.wait_for(worker.connack, 10) != 0:
            raise RuntimeError(f"{name}: CONNACK refused")
        transport.write(subscribe_packet(1, share, 1))
        granted = await asyncio.wait_for(worker.suback, 10)
        conn = worker
    if granted != 1:
        raise RuntimeError(f"{name}: SUBACK {granted:#x} for {share}")
    return conn


async def run_step(cluster: Cluster, k: int, members: int, publishers: int, window: int, seconds: float,
                   payload: int, process_s: float = 0.0, members_per_node: int = 0) -> Step:
    assert isinstance(cluster.redis, RedisProc)
    redis_before = cluster.redis.counters()
    pids = [node.proc.pid for node in cluster.nodes if node.proc is not None]
    cpu_before = sum(map(cpu_seconds, pids)), cpu_seconds(cluster.redis.pid)
    topic = f"bench/{k}/t"
    share = f"$share/b{k}/{topic}"
    node_counters = {f"n{i}": Counters() for i in range(1, k + 1)}
    if members_per_node:
        members = members_per_node * k
    subs = [await _member(cluster, 1 + i % k, f"m{k}-{i}", share, node_counters[f"n{1 + i % k}"], process_s)
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
    for sub in subs:
        if isinstance(sub, Worker):
            sub.drain()
    deadline = time.monotonic() + DRAIN_LIMIT_S
    while pub_counters.acked < pub_counters.sent and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    last, quiet_since = received(), time.monotonic()
    while time.monotonic() - quiet_since < DRAIN_QUIET_S and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        if received() != last:
            last, quiet_since = received(), time.monotonic()
    for conn in pubs:
        conn.close()
    for sub in subs:
        sub.close()
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
    ap.add_argument("--process-ms", type=float, default=0.0,
                    help="each member takes this long per message (0: acks at once)")
    ap.add_argument("--members-per-node", type=int, default=0,
                    help="members on each of the group's nodes (instead of --members spread over them)")
    return ap.parse_args(argv)


def measure(members: int = 6, publishers: int = 6, window: int = 100, seconds: float = 5.0, payload: int = 64,
            node_core: int | None = None, redis_core: int | None = None, process_ms: float = 0.0,
            members_per_node: int = 0) -> list[Step]:
    """A fresh 3-node cluster; the group's steps with members on 1, 2, 3 nodes."""
    async def steps(cluster: Cluster) -> list[Step]:
        return [await run_step(cluster, k, members, publishers, window, seconds, payload, process_ms / 1000,
                               members_per_node) for k in (1, 2, 3)]

    with Cluster(3, node_core=node_core, redis_core=redis_core) as cluster:
        return asyncio.run(steps(cluster))


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    print(f"# python -m loadtest.shared_bench {' '.join(sys.argv[1:] if argv is None else argv)}", flush=True)
    steps = measure(args.members, args.publishers, args.window, args.seconds, args.payload, args.node_core,
                    args.redis_core, args.process_ms, args.members_per_node)
    for s in steps:
        spread = " ".join(f"{n}={c}" for n, c in s.per_node.items())
        print(f"members on {s.member_nodes} node(s): {s.msgs_per_s:8.0f} msg/s   per node {spread}   "
              f"acked {s.acked}  received {s.received}  lost {s.lost}  extra {s.extra}   Redis per message: "
              f"{s.scripts_per_msg:.2f} scripts, {s.round_trips_per_msg:.2f} round trips; CPU per message: nodes "
              f"{s.node_cpu_us_per_msg:.0f} us, Redis {s.redis_cpu_us_per_msg:.0f} us", flush=True)
    return 0 if all(s.lost == 0 for s in steps) else 1


if __name__ == "__main__":
    sys.exit(main())
