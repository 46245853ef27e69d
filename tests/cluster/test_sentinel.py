"""Redis behind Sentinel: a primary with one replica, 3 sentinels, gateways on the `redis-sentinel://` URL with
`store_replicas = 1` (an acknowledgement waits until the replica holds the message).

The primary is kill -9'd mid-stream while its replica lags (paused: asynchronous replication's window, made
wide), the sentinels promote the replica, and every message a publisher got a PUBACK for must reach a
persistent subscriber that was offline meanwhile (so it reads them from the store, the new primary): the nodes
find the new primary without a restart and append again what the old one took alone. With
`store_replicas = 0` the acknowledgements of the lag are lost.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter

from tests.cluster.conftest import ClusterFactory
from tests.cluster.test_cluster import Inbox, Stream, connect, move
from tests.integration.conftest import PahoFactory
from tests.store.redis_server import command
from tests.waiting import wait_until

LAG_S = 0.5  # how long the replica is paused before the primary dies: acks of that time would be lost without WAIT


def test_primary_kill9_mid_stream_failover_loses_no_acked_message(
        cluster: ClusterFactory, paho_factory: PahoFactory) -> None:
    # A member TTL longer than the failover, as docs/cluster.md asks: a node that cannot reach the store for a whole
    # TTL closes its clients (the others may declare it dead), and this test counts a stream that goes on.
    c = cluster(n=2, store="redis-sentinel",
                env={"TIDEWIRE_STORE_REPLICAS": "1", "TIDEWIRE_CLUSTER_MEMBER_TTL": "20"})
    n1, n2 = c.nodes
    redis = c.sentinel_redis
    sub = Inbox(connect(n1, paho_factory, "ha-sub", 5, persistent=True, subscribe=["ha/#"]), "ha/#")
    sub.client.disconnect()  # back after the failover: what it gets is what the store kept
    pub = connect(n2, paho_factory, "ha-pub")
    stream = Stream(pub, ["ha/a", "ha/b"], 800, interval=0.004)
    stream.start()
    wait_until(lambda: len(stream.acked()) > 20, 10.0, what="the stream acknowledged")

    old = redis.primary_port()
    replica = next(s for s in redis.servers if s.port != old)
    replica.pause()  # silent: it cannot reconnect while the primary goes on taking appends
    # Cut its link (what the kernel had buffered for it before still arrives): the replica now lags for real.
    assert command(old, "CLIENT", "KILL", "TYPE", "replica").startswith(b":1")
    time.sleep(LAG_S)  # the behaviour under test: a replica behind its primary for a while
    acked_before_kill = len(stream.acked())
    redis.server(old).kill()
    replica.resume()
    assert stream.is_alive(), "the stream ended before the kill: nothing exercised"
    new = redis.wait_failover(old)
    assert new == replica.port
    redis.rejoin(old, new)  # back as a replica: acknowledgements need one again
    failed_over = time.monotonic()

    stream.join(30.0)
    with contextlib.suppress(AssertionError):  # until every publish is answered or the publisher was dropped
        wait_until(lambda: len(pub.acks_snapshot().keys() & stream.sent.keys()) >= stream.n
                   or not pub.disconnects.empty(), 30.0)
    acked = stream.acked()
    assert [k for k in acked if stream.sent_at[k] > failed_over], \
        f"no publish acked after the failover ({len(acked)} acked, {acked_before_kill} before)\n{c.logs()}"
    assert move(sub.client, n1), "the subscriber's session is gone"
    with contextlib.suppress(AssertionError):
        sub.wait_for(acked, 20.0, c)
    received = Counter(sub.received())
    lost = sorted(acked - received.keys(), key=lambda k: k[1])
    duplicated = sum(n - 1 for n in received.values())
    print(f"sentinel failover: {len(acked)} acked of {stream.n} ({stream.n - len(acked)} unanswered or refused), "
          f"lost {len(lost)}, duplicated {duplicated}, received {len(received)}")
    assert not lost, f"{len(lost)} acked messages lost (first {lost[:10]}), {duplicated} duplicated\n{c.logs()}"
