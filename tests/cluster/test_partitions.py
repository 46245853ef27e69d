"""Partitions, end to end: real gateway processes on one redis-server, with test-controlled TCP proxies
(`tests.cluster.proxy.TcpProxy`) on the links the test cuts, real paho clients; each test counts what was lost,
duplicated or refused.

- A subscription made on one node is effective cluster-wide by its SUBACK: a publish sent on another node right
  after it is delivered (plain and wildcard filters, fresh topics every time).
- A cut between two nodes' cluster ports: what is published on one still reaches subscribers on the other
  (broadcast fallback, resync), within bounded time.
- A node cut off from the store says why (log, /readyz, metric), refuses new clients (CONNACK 0x88 / 3), keeps
  nothing acked unstored, and serves again by itself once the store is back.
"""

from __future__ import annotations

from collections import Counter

from tests.cluster.conftest import Cluster, ClusterFactory
from tests.integration.conftest import PahoClient, PahoFactory, Received
from tests.waiting import wait_until

ROUNDS = 200  # subscribe-then-publish rounds
DELIVERY_WAIT = 5.0  # s for the last of those messages (several resync intervals)


def test_publish_right_after_suback_on_another_node_is_delivered(cluster: ClusterFactory,
                                                                 paho_factory: PahoFactory) -> None:
    """Subscribe on n1, and as soon as the SUBACK is in, publish on n2 to a topic nobody subscribed to before:
    every message arrives. Half the filters are wildcards (`+`, `#`), half exact topics; every topic is fresh."""
    c: Cluster = cluster(n=2)
    sub = paho_factory(c.nodes[0].port, "race-sub")
    sub.connect()
    pub = paho_factory(c.nodes[1].port, "race-pub")
    pub.connect()
    sent: list[str] = []
    for i in range(ROUNDS):
        kind = i % 4
        topic = f"race/{i}/a/b"
        flt = (topic, f"race/{i}/+/b", f"race/{i}/#", f"+/{i}/a/b")[kind]
        assert sub.subscribe(flt, 1) == [1], flt
        pub.publish(topic, str(i).encode(), qos=1, wait=False)
        sent.append(topic)
    got: list[Received] = []

    def lost() -> list[str]:
        seen = {m.topic for m in got}
        return [t for t in sent if t not in seen]

    wait_until(lambda: _drain(sub, got) >= ROUNDS, DELIVERY_WAIT, interval=0.05,
               what=lambda: f"{ROUNDS} messages: lost {len(lost())} ({lost()[:8]})\n{c.logs()}")
    duplicated = [t for t, n in Counter(m.topic for m in got).items() if n > 1]
    assert not lost() and not duplicated, f"lost {len(lost())}: {lost()[:10]}; duplicated {duplicated[:10]}"


def _drain(client: object, into: list[Received]) -> int:
    """Move what `client` received so far into `into`; returns how many there are."""
    messages = client.messages  # type: ignore[attr-defined]
    while not messages.empty():
        into.append(messages.get_nowait())
    return len(into)


CUT_MESSAGES = 60  # published on n1 while its link to n2 is cut
CUT_DELIVERY = 4.0  # s: a few resync intervals (conftest RESYNC_INTERVAL) plus a loaded machine's slack


def test_cluster_link_cut_still_delivers(cluster: ClusterFactory, paho_factory: PahoFactory) -> None:
    """n1 and n2 cannot reach each other's cluster port (both directions cut): every message published on n1
    still reaches n2's subscribers (exact and wildcard), none twice, within `CUT_DELIVERY` s of its PUBACK; and
    again after the link heals."""
    c: Cluster = cluster(n=2, proxied=True)
    n1, n2 = c.nodes
    sub = paho_factory(n2.port, "cut-sub")
    sub.connect()
    assert sub.subscribe([("cut/exact", 1), ("cut/+/w", 1)]) == [1, 1]
    pub = paho_factory(n1.port, "cut-pub")
    pub.connect()
    assert pub.publish("cut/exact", b"before", qos=1) == 0
    assert sub.get(timeout=CUT_DELIVERY).payload == b"before"
    for proxy in c.link_proxy.values():
        proxy.cut()
    topics = [("cut/exact" if i % 2 else f"cut/{i}/w", i) for i in range(CUT_MESSAGES)]
    _publish_and_count(pub, sub, topics, c)
    for proxy in c.link_proxy.values():
        proxy.heal()
    _publish_and_count(pub, sub, [("cut/exact" if i % 2 else f"cut/{i}/w", i)
                                  for i in range(CUT_MESSAGES, CUT_MESSAGES + 10)], c)
    assert sum(p.refused for p in c.link_proxy.values()) > 0, "the nodes never tried the cut link"


def _publish_and_count(pub: PahoClient, sub: PahoClient, topics: list[tuple[str, int]], c: Cluster) -> None:
    """Publish (QoS 1, acks awaited), then wait for every message on `sub`: none lost, none twice."""
    for topic, i in topics:
        assert pub.publish(topic, str(i).encode(), qos=1) == 0
    want = {str(i).encode() for _, i in topics}
    got: list[Received] = []

    def lost() -> set[bytes]:
        return want - {m.payload for m in got}

    wait_until(lambda: _drain(sub, got) >= len(want) and not lost(), CUT_DELIVERY, interval=0.05,
               what=lambda: f"{len(want)} messages: lost {len(lost())} ({sorted(lost())[:8]})\n{c.logs()}")
    duplicated = [p for p, n in Counter(m.payload for m in got).items() if n > 1]
    assert not duplicated, f"duplicated {len(duplicated)}: {duplicated[:10]}"
