"""A rolling restart under QoS 1 load: 3 real nodes on one Redis, restarted one by one with SIGTERM (graceful
drain), while persistent subscribers and publishers spread over the nodes move to the next node whenever theirs
goes. Nothing a publisher got a PUBACK for may be lost: every such message reaches every subscriber at least once
(QoS 1: duplicates are allowed, and counted).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter

import pytest

from tests.cluster.conftest import Cluster, ClusterFactory
from tests.integration.conftest import PahoClient, PahoFactory
from tests.waiting import wait_until

EXPIRY = 300  # s: session expiry of the persistent subscribers
DRAIN_TIMEOUT = 5.0  # s: each node's drain_timeout
RATE = 100  # msgs/s per publisher
SUBSCRIBERS = 3
PUBLISHERS = 3
Key = tuple[int, int]  # (publisher, number)


class Mover(threading.Thread):
    """Keeps every client connected: a client whose node went away reconnects to the next node (round-robin over
    the node ports), a subscriber with clean_start 0 to resume its session, a publisher so that paho resends what
    was not acknowledged."""

    def __init__(self, clients: list[PahoClient], ports: list[int]) -> None:
        super().__init__(daemon=True)
        self.clients, self.ports = clients, ports
        self.at = {id(c): ports.index(c.port) for c in clients}
        self.moves = 0
        self.running = True

    def run(self) -> None:
        while self.running:
            for c in self.clients:
                # (paho leaves its state "connected" after a server DISCONNECT; its socket is gone then)
                if self.running and (c.client.socket() is None or not c.client.is_connected()):
                    self._move(c)
            time.sleep(0.02)  # the watcher's poll interval

    def _move(self, c: PahoClient) -> None:
        at = self.at[id(c)]
        for step in range(1, len(self.ports) + 1):
            port = self.ports[(at + step) % len(self.ports)]
            c.port = port
            try:
                res = c.connect(clean_start=False, session_expiry=EXPIRY if not c.clean else None, timeout=2.0,
                                check=False)
            except (OSError, AssertionError):  # refused (that node is restarting) or no CONNACK in time
                continue
            if res.reason_code == 0:
                self.at[id(c)] = self.ports.index(port)
                self.moves += 1
                return


class Publisher(threading.Thread):
    """QoS 1 publishes at RATE msgs/s, pipelined; paho queues them while disconnected and resends unacked ones."""

    def __init__(self, index: int, c: PahoClient) -> None:
        super().__init__(daemon=True)
        self.index, self.c = index, c
        self.sent: dict[int, Key] = {}  # mid -> message
        self.running = True

    def run(self) -> None:
        i = 0
        next_at = time.monotonic()
        while self.running:
            key = (self.index, i)
            info = self.c.client.publish(f"roll/p{self.index}/{i % 4}", f"{self.index}:{i}".encode(), qos=1)
            self.sent[info.mid] = key
            i += 1
            next_at += 1 / RATE
            time.sleep(max(0.0, next_at - time.monotonic()))  # pacing: RATE msgs/s

    def acked(self) -> set[Key]:
        return {self.sent[mid] for mid, rc in self.c.acks_snapshot().items() if mid in self.sent and rc < 0x80}


def _received(sub: PahoClient, into: list[Key]) -> None:
    while not sub.messages.empty():
        m = sub.messages.get_nowait()
        p, i = m.payload.decode().split(":")
        into.append((int(p), int(i)))


@pytest.mark.slow  # long: `make test-slow` (CI runs it after `make test`)
def test_rolling_restart_loses_no_acknowledged_message(cluster: ClusterFactory, paho_factory: PahoFactory) -> None:
    c: Cluster = cluster(env={"TIDEWIRE_DRAIN_TIMEOUT": str(DRAIN_TIMEOUT)})
    ports = [node.port for node in c.nodes]
    subs = []
    for k in range(SUBSCRIBERS):
        sub = paho_factory(ports[k % 3], f"roll-sub{k}", clean=False)
        sub.connect(session_expiry=EXPIRY)
        assert sub.subscribe("roll/#", 1) == [1]
        subs.append(sub)
    pubs = []
    for k in range(PUBLISHERS):
        pub = paho_factory(ports[(k + 1) % 3], f"roll-pub{k}")
        pub.connect()
        pubs.append(Publisher(k, pub))
    mover = Mover(subs + [p.c for p in pubs], ports)
    mover.start()
    for p in pubs:
        p.start()
    clients = subs + [p.c for p in pubs]
    drains: list[float] = []

    def serving(since: list[int], more: int) -> bool:
        """Every publisher has `more` acks beyond `since`, every subscriber has messages waiting."""
        return (all(len(p.acked()) >= n + more for p, n in zip(pubs, since, strict=True))
                and all(not s.messages.empty() for s in subs))

    try:
        wait_until(lambda: serving([0] * PUBLISHERS, RATE // 2), 10, what=f"the load flowing\n{c.logs()}")
        for node in c.nodes:
            t0 = time.monotonic()
            c.stop(node)  # SIGTERM; fails the test if the node ignores it
            drains.append(time.monotonic() - t0)
            assert node.proc is not None and node.proc.returncode == 0, f"{node} exited with {node.proc}\n{c.logs()}"
            c.restart(node)  # accepts on every port and is a member again before the next one goes
            # every client of the stopped node has moved to another before the next one goes
            wait_until(lambda: all(x.client.socket() is not None and x.client.is_connected() for x in clients), 10,
                       what=f"every client connected after restarting {node.node_id}\n{c.logs()}")
        # the load goes on after the last restart: enough acked that the run exercised something
        done = [len(p.acked()) for p in pubs]
        wait_until(lambda: serving(done, RATE) and sum(len(p.acked()) for p in pubs) > RATE * PUBLISHERS * 5, 30,
                   what=f"the load flowing after the last restart\n{c.logs()}")
    finally:
        for p in pubs:
            p.running = False
        for p in pubs:
            p.join(5)
    # What was sent last (and resent after a move) gets acknowledged; not a check: one still unacked is not in
    # `acked`, so nothing is required of it.
    with contextlib.suppress(AssertionError):
        wait_until(lambda: sum(len(p.acked()) for p in pubs) >= sum(len(p.sent) for p in pubs), 15, interval=0.1)
    acked = set().union(*(p.acked() for p in pubs))
    assert len(acked) > RATE * PUBLISHERS * 5, f"only {len(acked)} messages acknowledged\n{c.logs()}"
    got: list[list[Key]] = [[] for _ in subs]

    def all_received() -> bool:
        for sub, into in zip(subs, got, strict=True):
            _received(sub, into)
        return all(acked <= set(into) for into in got)

    with contextlib.suppress(AssertionError):  # the assertions below say what is missing
        wait_until(all_received, 15, interval=0.1)
    mover.running = False
    mover.join(5)
    assert all(d < DRAIN_TIMEOUT for d in drains), f"drain times {drains}"
    for k, into in enumerate(got):
        missing = sorted(acked - set(into))
        assert not missing, (f"roll-sub{k}: {len(missing)} of {len(acked)} acknowledged messages lost, first "
                             f"{missing[:10]}\n{c.logs()}")
    dups = [sum(n - 1 for n in Counter(into).values() if n > 1) for into in got]
    print(f"rolling restart: {len(acked)} acknowledged messages x {len(subs)} subscribers, duplicates {dups}, "
          f"client moves {mover.moves}, drain s {[round(d, 2) for d in drains]}")
