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

import time
from collections import Counter
from typing import Any

import httpx
import pytest

from tests.cluster.conftest import MEMBER_TTL, Cluster, ClusterFactory, ClusterNode
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


@pytest.mark.parametrize("how", ["cut", "stall"])
def test_cluster_link_cut_still_delivers(cluster: ClusterFactory, paho_factory: PahoFactory, how: str) -> None:
    """n1 and n2 cannot reach each other's cluster port (both directions; reset, or silent): every message
    published on n1 still reaches n2's subscribers (exact and wildcard), none twice, within `CUT_DELIVERY` s of
    its PUBACK; and again after the link heals."""
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
        getattr(proxy, how)()
    topics = [("cut/exact" if i % 2 else f"cut/{i}/w", i) for i in range(CUT_MESSAGES)]
    _publish_and_count(pub, sub, topics, c)
    for proxy in c.link_proxy.values():
        proxy.heal()
    _publish_and_count(pub, sub, [("cut/exact" if i % 2 else f"cut/{i}/w", i)
                                  for i in range(CUT_MESSAGES, CUT_MESSAGES + 10)], c)
    assert sum(p.accepted for p in c.link_proxy.values()) >= 2, "the nodes never used the proxied link"


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


STORE_CUT_TTL = 8.0  # s member TTL of the short-cut test: the cut node is not declared dead meanwhile
STORE_TIMEOUT = 1.0  # s a store call may wait for an answer (store_timeout): how a silent store is noticed
DETECT = 3.0  # s for a cut-off node to notice: a heartbeat (conftest HEARTBEAT s apart) or housekeeping call
# (about every second) fails at once on a reset link, after STORE_TIMEOUT on a silent one
RESUME = 5.0  # s for it to serve again once the store is back


def _ready(node: ClusterNode) -> tuple[int, dict[str, Any]]:
    answer = httpx.get(f"http://127.0.0.1:{node.admin_port}/readyz", timeout=5.0)
    return answer.status_code, answer.json()


def _metric(node: ClusterNode, name: str) -> float | None:
    text = httpx.get(f"http://127.0.0.1:{node.admin_port}/metrics", timeout=5.0).text
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


@pytest.mark.parametrize("how", ["cut", "stall"])
def test_node_cut_off_the_store_refuses_new_clients_and_resumes(cluster: ClusterFactory, paho_factory: PahoFactory,
                                                                how: str) -> None:
    """n1 loses Redis for less than the member TTL, by a reset of every connection (`cut`) or by silence
    (`stall`: nothing crosses, noticed only by the `store_timeout` of its calls and heartbeats): within `DETECT`
    s its /readyz answers 503 naming the store, the store gauge reads 0, and a new client gets
    CONNACK 0x88 (5.0) / 3 (3.1.1). Its connected publisher's QoS 1 messages are not acked while the store is
    down. Once the store is back n1 serves again by itself (readyz 200, CONNACK 0) within `RESUME` s, and every
    acked message reaches a subscriber on n2: none lost, none twice."""
    c: Cluster = cluster(n=2, proxied=True, env={"TIDEWIRE_CLUSTER_MEMBER_TTL": str(STORE_CUT_TTL),
                                                 "TIDEWIRE_STORE_TIMEOUT": str(STORE_TIMEOUT)})
    n1, n2 = c.nodes
    sub = paho_factory(n2.port, "store-sub")
    sub.connect()
    assert sub.subscribe("store/+", 1) == [1]
    pub = paho_factory(n1.port, "store-pub")
    pub.connect()
    assert pub.publish("store/0", b"0", qos=1) == 0
    assert _ready(n1)[0] == 200 and _metric(n1, "tidewire_store_up") == 1

    getattr(c.store_proxy["n1"], how)()
    wait_until(lambda: _ready(n1)[0] == 503, DETECT, what=lambda: f"n1 not ready: {_ready(n1)}\n{c.logs()}")
    body = _ready(n1)[1]
    assert any("store" in reason for reason in body["reasons"]), body
    assert _metric(n1, "tidewire_store_up") == 0
    assert "event=store.unreachable" in n1.stderr
    refused = 0
    for version in (5, 4):  # paho 2 reports 3.1.1's return code 3 (server unavailable) as 0x88 too
        fresh = paho_factory(n1.port, f"store-new-{version}", version=version)
        assert fresh.connect(check=False, timeout=5.0).reason_code == 0x88, f"MQTT {version}"
        refused += 1
    during = [pub.publish(f"store/{i}", str(i).encode(), qos=1, wait=False) for i in range(1, 21)]
    time.sleep(0.5)  # no PUBACK may come while n1 cannot store: a wait for nothing to happen
    unacked_while_cut = [mid for mid in during if mid not in pub.acks_snapshot()]
    assert unacked_while_cut == during, "a PUBACK while the store was unreachable"

    c.store_proxy["n1"].heal()
    wait_until(lambda: _ready(n1)[0] == 200, RESUME, what=lambda: f"n1 ready again: {_ready(n1)}\n{c.logs()}")
    later = paho_factory(n1.port, "store-later")
    assert later.connect(timeout=5.0).reason_code == 0
    assert _metric(n1, "tidewire_store_up") == 1 and "event=store.reachable" in n1.stderr
    wait_until(lambda: all(mid in pub.acks_snapshot() for mid in during), RESUME,
               what=lambda: f"every publish acked after healing\n{c.logs()}")
    want = {str(i).encode() for i in range(1, 21)}
    got: list[Received] = []
    _drain(sub, got)
    wait_until(lambda: _drain(sub, got) and want <= {m.payload for m in got}, RESUME,
               what=lambda: f"acked messages delivered: lost {sorted(want - {m.payload for m in got})}")
    duplicated = [p for p, n in Counter(m.payload for m in got).items() if n > 1]
    assert not duplicated, f"duplicated {duplicated}"
    assert refused == 2


LONG_MESSAGES = 20  # published on n2 while n1 is cut off the store and declared dead
FENCE = MEMBER_TTL + 3.0  # s: n1 closes its clients once a member TTL passed without a heartbeat (plus slack)


def test_node_cut_off_the_store_past_the_ttl_hands_its_clients_over_and_rejoins(
        cluster: ClusterFactory, paho_factory: PahoFactory) -> None:
    """n1 loses Redis for longer than the member TTL: n2 declares it dead; n1 closes its persistent client
    (DISCONNECT 0x9C Use another server) by then, so the session is never served by both; the client resumes on
    n2 and gets every message acked meanwhile (none lost, none twice). When Redis is back n1 joins again by
    itself (a member, /readyz 200, new clients accepted) instead of exiting."""
    c: Cluster = cluster(n=2, proxied=True)
    n1, n2 = c.nodes
    dev = paho_factory(n1.port, "long-dev", clean=False)
    dev.connect(session_expiry=300)
    assert dev.subscribe("long/+", 1) == [1]
    pub = paho_factory(n2.port, "long-pub")
    pub.connect()
    assert pub.publish("long/0", b"0", qos=1) == 0
    assert dev.get(timeout=CUT_DELIVERY).payload == b"0"

    c.store_proxy["n1"].cut()
    c.wait_gone("n1")
    assert dev.wait_disconnect(timeout=FENCE) == 0x9C, "n1 kept serving a session the others may hand over"
    assert n1.alive
    for i in range(1, LONG_MESSAGES + 1):
        assert pub.publish("long/x", str(i).encode(), qos=1) == 0
    dev.port = n2.port
    assert dev.connect(clean_start=False, session_expiry=300).session_present
    want = {str(i).encode() for i in range(1, LONG_MESSAGES + 1)}
    got: list[Received] = []
    wait_until(lambda: _drain(dev, got) and want <= {m.payload for m in got}, CUT_DELIVERY,
               what=lambda: f"acked messages after the move: lost {sorted(want - {m.payload for m in got})}")
    duplicated = [p for p, n in Counter(m.payload for m in got).items() if n > 1]
    assert not duplicated, f"duplicated {duplicated}"

    c.store_proxy["n1"].heal()
    c.wait_members(["n1", "n2"])
    wait_until(lambda: _ready(n1)[0] == 200, RESUME, what=lambda: f"n1 ready again: {_ready(n1)}\n{c.logs()}")
    assert n1.alive and "event=cluster.rejoined" in n1.stderr
    fresh = paho_factory(n1.port, "long-fresh")
    assert fresh.connect(timeout=5.0).reason_code == 0
    assert fresh.subscribe("long/+", 1) == [1]
    assert pub.publish("long/y", b"after", qos=1) == 0
    assert fresh.get(timeout=CUT_DELIVERY).payload == b"after"
    assert dev.get(timeout=CUT_DELIVERY).payload == b"after"
