"""Failover measurement: `kill -9` a node under a QoS 1 stream and time until its persistent subscribers, which
reconnect to another node as soon as their connection drops (like a client with a reconnect loop), receive again.

Every client keeps its session (3.1.1 clean_session=0), so a resumed subscriber needs no new SUBSCRIBE; loss is
counted per subscriber against the publisher's acknowledged messages (one publisher, sequence numbers carried
across a subscriber's connections, so a redelivery after the move counts as a duplicate, not as new).
"""

from __future__ import annotations

import asyncio
import secrets
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from loadtest.client import ConnackRefused, Counters, MqttConn, Publisher, connect_packet
from loadtest.cluster_procs import Cluster, NodeProc

RETRY_S = 0.02  # pause between reconnect attempts
CONNECT_TIMEOUT = 2.0  # s per attempt (TCP + CONNACK)
ACK_WAIT_S = 10.0  # after the stream: how long outstanding PUBACKs may take


class _ResumedConn(MqttConn):
    """A connection that continues its client's duplicate detection: the sequence numbers seen so far."""

    def __init__(self, counters: Counters, seqs: dict[int, int]) -> None:
        super().__init__(counters)
        self._seqs = seqs


class Rejoining:
    """One client with a persistent session and a reconnect loop over `nodes` (first: where it starts)."""

    def __init__(self, client_id: str, nodes: list[NodeProc], counters: Counters, *,
                 publisher: Publisher | None = None) -> None:
        self.client_id = client_id
        self.nodes = nodes
        self.counters = counters
        self.publisher = publisher
        self.conn: MqttConn | None = None
        self.seqs: dict[int, int] = {}
        self.reconnected_at: float | None = None  # perf_counter of the first CONNACK after a drop
        self.resumed_at: float | None = None  # ... and of the first PUBLISH received after it
        self.attempts = 0

    async def connect(self, node: NodeProc) -> MqttConn:
        loop = asyncio.get_running_loop()
        _, conn = await asyncio.wait_for(
            loop.create_connection(lambda: _ResumedConn(self.counters, self.seqs), node.host, node.port),
            CONNECT_TIMEOUT)
        conn.write(connect_packet(self.client_id, keepalive=60, clean=False))
        try:
            rc = await asyncio.wait_for(asyncio.shield(conn.connack), CONNECT_TIMEOUT)
        except BaseException:
            conn.close()
            raise
        if rc != 0:
            conn.close()
            raise ConnackRefused(self.client_id, rc)
        if self.publisher is not None:
            self.publisher.inflight = 0  # what was unacked died with the old connection (never counted as acked)
            conn.publisher = self.publisher
        self.conn = conn
        return conn

    async def follow(self, stop: asyncio.Event) -> None:
        """Reconnect whenever the connection drops, trying nodes[1:], then nodes[0], round and round."""
        order = [*self.nodes[1:], self.nodes[0]]
        while not stop.is_set():
            conn = self.conn
            if conn is None:
                return
            waits: list[asyncio.Future[Any]] = [asyncio.shield(conn.closed), asyncio.ensure_future(stop.wait())]
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            waits[1].cancel()
            if stop.is_set():
                return
            self.conn = None
            received = self.counters.received  # nothing arrives until the next CONNACK
            i = 0
            while not stop.is_set():
                node = order[i % len(order)]
                i += 1
                self.attempts += 1
                try:
                    await self.connect(node)
                    break
                except (OSError, TimeoutError, ConnackRefused):
                    await asyncio.sleep(RETRY_S)
            if self.conn is None:
                return
            if self.reconnected_at is None:
                self.reconnected_at = time.perf_counter()
                conn = self.conn
                while self.counters.received == received and not stop.is_set() and not conn.closed.done():
                    await asyncio.sleep(0.001)  # 1 ms resolution is plenty next to a failover
                if self.counters.received != received:
                    self.resumed_at = time.perf_counter()

    def close(self) -> None:
        if self.conn is not None:
            self.conn.write(b"\xe0\x00")
            self.conn.close()


@dataclass(slots=True)
class FailoverResult:
    nodes: int
    victim: str
    subscribers: int
    acked: int = 0
    reconnect_ms: list[float] = field(default_factory=list)  # kill -9 → CONNACK on another node, per subscriber
    resume_ms: list[float] = field(default_factory=list)  # kill -9 → first message received there
    not_resumed: int = 0
    lost: int = 0  # acked messages a subscriber never received (summed over subscribers)
    dup: int = 0

    def summary(self) -> str:
        def p(xs: list[float]) -> str:
            return f"p50 {statistics.median(xs):,.0f} ms, max {max(xs):,.0f} ms" if xs else "none"

        return (f"N={self.nodes} kill -9 {self.victim}: {self.subscribers} persistent subscribers, "
                f"reconnected {p(self.reconnect_ms)}; receiving again {p(self.resume_ms)}; "
                f"not resumed {self.not_resumed}; acked {self.acked:,}, lost {self.lost:,}, dup {self.dup:,}")


async def _pace(pub: Rejoining, rate: float, seconds: float) -> int:
    """rate msgs/s through the publisher's current connection; returns msgs skipped (no connection, full window)."""
    start = time.perf_counter()
    done = skipped = 0
    while True:
        elapsed = time.perf_counter() - start
        due = int(min(elapsed, seconds) * rate) - done
        if due > 0:
            conn = pub.conn
            skipped += due - (conn.send(due) if conn is not None else 0)
            done += due
        if elapsed >= seconds:
            return skipped
        await asyncio.sleep(0.001)


async def failover(cluster: Cluster, *, victim: int = 2, subscribers: int = 10, rate: float = 500.0,
                   before: float = 1.5, after: float = 4.0, drain: float = 10.0, restart: bool = False,
                   payload: int = 64) -> FailoverResult:
    """Stream `rate` QoS 1 msgs/s from a publisher on another node (restart=True, one node: the same node,
    restarted in place) to persistent subscribers on node `victim`; kill -9 it after `before` s; stream
    `after` s more; wait up to `drain` s for every acked message to arrive."""
    tok = secrets.token_hex(3)
    topic = f"bench/fo/{tok}"
    vic = cluster.node(victim)
    others = [n for n in cluster.nodes if n is not vic] if not restart else [vic]
    pub_counters = Counters()
    pub = Rejoining(f"lt-fo-{tok}-p", [others[0], *others[1:], vic] if not restart else [vic], pub_counters,
                    publisher=Publisher(pub_counters, topic, 1, 1, payload))
    subs: list[Rejoining] = []
    for i in range(subscribers):
        fallback = others[i % len(others):] + others[:i % len(others)] if not restart else []
        subs.append(Rejoining(f"lt-fo-{tok}-s{i}", [vic, *fallback], Counters()))
    stop = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []
    result = FailoverResult(cluster.n, vic.node_id, subscribers)
    try:
        for s in subs:
            conn = await s.connect(vic)
            if await asyncio.wait_for(conn.subscribe(topic, 1), CONNECT_TIMEOUT) >= 0x80:
                raise RuntimeError("subscription refused")
        await pub.connect(pub.nodes[0])
        tasks = [asyncio.get_running_loop().create_task(c.follow(stop)) for c in (*subs, pub)]
        streaming = asyncio.get_running_loop().create_task(_pace(pub, rate, before + after))
        await asyncio.sleep(before)
        t_kill = time.perf_counter()
        await asyncio.to_thread(vic.kill)
        if restart:
            await asyncio.to_thread(vic.respawn)
        await streaming
        deadline = time.perf_counter() + ACK_WAIT_S
        while pub.publisher is not None and pub.publisher.inflight > 0 and time.perf_counter() < deadline:
            await asyncio.sleep(0.01)
        acked = pub_counters.acked
        deadline = time.perf_counter() + drain
        while time.perf_counter() < deadline and any(s.counters.received - s.counters.dup < acked for s in subs):
            await asyncio.sleep(0.01)
        result.acked = acked
        for s in subs:
            if s.reconnected_at is not None:
                result.reconnect_ms.append((s.reconnected_at - t_kill) * 1000)
            if s.resumed_at is not None:
                result.resume_ms.append((s.resumed_at - t_kill) * 1000)
            else:
                result.not_resumed += 1
            result.lost += max(0, acked - (s.counters.received - s.counters.dup))
            result.dup += s.counters.dup
        return result
    finally:
        stop.set()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for c in (*subs, pub):
            c.close()
        await asyncio.sleep(0.05)
