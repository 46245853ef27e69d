"""A cluster end to end: 3 real gateway processes on one redis-server, real paho clients on different nodes.

Delivery across nodes (exact, wildcard, shared group), kill -9 of a node with persistent clients, of a lookup
shard owner, takeover across nodes, a Redis restart mid-stream, wills of a dead node; and `tidewire cluster up`.
Every wait is bounded; a failure message carries the tail of each node's log.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections import Counter
from collections.abc import Iterable

import paho.mqtt.client as mqtt
import pytest

from tests.cluster.conftest import Cluster, ClusterFactory, ClusterNode
from tests.integration.conftest import PahoClient, PahoFactory, Received
from tests.integration.test_shared import publish_numbered, raw_drain, raw_member
from tests.waiting import wait_until
from tidewire.lookup.slots import SlotTable, route_key

EXPIRY = 300  # s, MQTT 5 session expiry of the persistent clients
Key = tuple[str, int]  # (topic, number): one published message


# --- helpers --------------------------------------------------------------------------------------------------


def connect(node: ClusterNode, paho_factory: PahoFactory, client_id: str, version: int = 5,
            persistent: bool = False, subscribe: Iterable[str] = ()) -> PahoClient:
    """A connected paho client on `node`; persistent: 3.1.1 clean_session=0 / 5.0 session expiry 300 s."""
    c = paho_factory(node.port, client_id, version=version, clean=not persistent)
    c.connect(session_expiry=EXPIRY if persistent and version == 5 else None)
    for flt in subscribe:
        assert c.subscribe(flt, 1) == [1], f"SUBACK for {flt}"
    return c


def move(c: PahoClient, node: ClusterNode) -> bool:
    """Reconnect a persistent client to another node (clean_start 0); returns session_present."""
    c.port = node.port
    res = c.connect(clean_start=False, session_expiry=EXPIRY if c.version == 5 else None)
    return res.session_present


class Stream(threading.Thread):
    """Publishes `n` QoS 1 messages round-robin over `topics`, `interval` apart, payload = the message number;
    acks are not awaited (a pipelined publisher)."""

    def __init__(self, pub: PahoClient, topics: list[str], n: int, interval: float = 0.002) -> None:
        super().__init__(daemon=True)
        self.pub, self.topics, self.n, self.interval = pub, topics, n, interval
        self.sent: dict[int, Key] = {}  # mid -> message
        self.sent_at: dict[Key, float] = {}

    def key(self, i: int) -> Key:
        return self.topics[i % len(self.topics)], i

    def run(self) -> None:
        for i in range(self.n):
            topic, _ = key = self.key(i)
            self.sent_at[key] = time.monotonic()
            self.sent[self.pub.client.publish(topic, str(i).encode(), qos=1).mid] = key
            if self.interval:
                time.sleep(self.interval)  # pacing: the stream is still running when the test breaks something

    def all_keys(self) -> list[Key]:
        return [self.key(i) for i in range(self.n)]

    def acked(self) -> set[Key]:
        """Messages the publisher got a successful PUBACK for (reason < 0x80; 3.1.1 reports 0)."""
        return {self.sent[mid] for mid, rc in self.pub.acks_snapshot().items() if mid in self.sent and rc < 0x80}

    def wait_all_acked(self, timeout: float) -> None:
        self.join(timeout)
        wait_until(lambda: len(self.acked()) >= self.n, timeout,
                   what=lambda: f"all {self.n} publishes acked (only {len(self.acked())})")


class Inbox:
    """Everything one client received, kept across reconnects (to another node too)."""

    def __init__(self, client: PahoClient, topic_filter: str = "#") -> None:
        self.client = client
        self.filter = topic_filter
        self.got: list[Received] = []

    def pull(self) -> None:
        while True:
            try:
                self.got.append(self.client.messages.get_nowait())
            except queue.Empty:
                return

    def received(self) -> list[Key]:
        self.pull()
        return [(m.topic, int(m.payload)) for m in self.got]

    def wanted(self, keys: Iterable[Key]) -> list[Key]:
        return [k for k in keys if mqtt.topic_matches_sub(self.filter, k[0])]

    def wait_for(self, want: Iterable[Key], timeout: float, cluster: Cluster) -> None:
        """Until every key in `want` has arrived (more is allowed)."""
        need = set(want)

        def missing() -> str:
            gone = sorted(need - set(self.received()), key=lambda k: k[1])
            return (f"{self.client.client._client_id!r}: {len(need)} messages, {len(gone)} missing, first "
                    f"{gone[:10]}\n{cluster.logs()}")

        wait_until(lambda: need <= set(self.received()), timeout, what=missing, interval=0.05)

    def settle(self, quiet: float = 0.5) -> list[Key]:
        """Wait until nothing more arrives for `quiet` seconds; everything received so far."""
        while True:
            before = len(self.received())
            time.sleep(quiet)  # absence: a duplicate or stray message has no event to wait on
            if len(self.received()) == before:
                return self.received()


def per_topic(keys: Iterable[Key]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for topic, i in keys:
        out.setdefault(topic, []).append(i)
    return out


def assert_exactly_in_order(inbox: Inbox, sent: list[Key], cluster: Cluster) -> None:
    """Every matching message once, in publish order per topic, as QoS 1 without DUP."""
    want = inbox.wanted(sent)
    inbox.wait_for(want, 10.0, cluster)
    got = inbox.settle()
    dups = [k for k, c in Counter(got).items() if c > 1]
    assert not dups, f"{inbox.filter}: duplicates on a clean QoS 1 path: {dups[:10]}"
    assert sorted(got) == sorted(want), f"{inbox.filter}: unexpected messages {sorted(set(got) - set(want))[:10]}"
    assert per_topic(got) == per_topic(want), f"{inbox.filter}: per-topic order broken"
    assert all(m.qos == 1 and not m.dup for m in inbox.got), f"{inbox.filter}: qos/dup wrong"


def slot_prefix(owner: str, members: list[str], forms: Iterable[str]) -> str:
    """A topic prefix `p` such that every queue `form.format(p=p)` routes to a lookup slot owned by `owner`."""
    table = SlotTable(0, members)
    for k in range(100_000):
        p = f"busy{k}"
        if all(table.owner_of(route_key(form.format(p=p))) == owner for form in forms):
            return p
    raise AssertionError("no prefix found")


# --- 1. delivery across nodes -----------------------------------------------------------------------------------


@pytest.mark.parametrize("store", ["redis", "redis-cluster"])
def test_exact_and_wildcard_subscribers_on_two_nodes_get_every_message_of_a_third_in_order(
        cluster: ClusterFactory, paho_factory: PahoFactory, store: str) -> None:
    c = cluster(store=store)
    n1, n2, n3 = c.nodes
    subs = [  # (node, client id, version, filter); the same filters on two nodes too
        (n1, "s1-exact", 5, "devices/d1/temp"),
        (n1, "s1-plus", 5, "devices/+/temp"),
        (n1, "s1-hash", 4, "devices/#"),
        (n2, "s2-exact", 4, "devices/d2/hum"),
        (n2, "s2-plus", 5, "devices/+/temp"),
        (n2, "s2-hash", 5, "devices/#"),
    ]
    inboxes = [Inbox(connect(node, paho_factory, cid, version, subscribe=[flt]), flt)
               for node, cid, version, flt in subs]
    pub = connect(n3, paho_factory, "p3")
    topics = [f"devices/d{k}/{kind}" for k in range(1, 5) for kind in ("temp", "hum")] + ["other/d1/temp"]
    stream = Stream(pub, topics, 360, interval=0)
    stream.start()
    stream.wait_all_acked(15.0)
    for inbox in inboxes:
        assert_exactly_in_order(inbox, stream.all_keys(), c)


def test_new_wildcard_subscription_sees_a_publish_on_another_node_right_after_its_suback(
        cluster: ClusterFactory, paho_factory: PahoFactory) -> None:
    """The wildcard set is cluster-wide: a filter new to the cluster, subscribed on node 1 or 2, is indexed by
    node 3's very next append."""
    c = cluster()
    n1, n2, n3 = c.nodes
    subs = {n1: connect(n1, paho_factory, "fresh-1"), n2: connect(n2, paho_factory, "fresh-2", version=4)}
    pub = connect(n3, paho_factory, "fresh-pub")
    for i in range(8):
        node = n1 if i % 2 == 0 else n2
        flt, topic = (f"fresh{i}/+/t", f"fresh{i}/a/t") if i % 4 < 2 else (f"+/fresh{i}/t", f"x/fresh{i}/t")
        assert subs[node].subscribe(flt, 1) == [1]
        assert pub.publish(topic, f"m{i}".encode(), qos=1) < 0x80  # right after the SUBACK
        try:
            msg = subs[node].get(timeout=3.0)
        except AssertionError:
            raise AssertionError(f"{flt} on {node.node_id}: nothing from n3\n{c.logs()}") from None
        assert (msg.topic, msg.payload) == (topic, f"m{i}".encode())
    for s in subs.values():
        s.assert_nothing(0.5)


# --- 2. shared group across nodes ------------------------------------------------------------------------------


def test_shared_group_over_two_nodes_delivers_each_message_to_exactly_one_member(
        cluster: ClusterFactory, paho_factory: PahoFactory) -> None:
    c = cluster()
    n1, n2, n3 = c.nodes
    share = "$share/g/devices/#"
    members = [Inbox(connect(n1, paho_factory, "g-1a", subscribe=[share]), "devices/#"),
               Inbox(connect(n1, paho_factory, "g-1b", version=4, subscribe=[share]), "devices/#"),
               Inbox(connect(n2, paho_factory, "g-2a", subscribe=[share]), "devices/#")]
    pub = connect(n3, paho_factory, "g-pub")
    stream = Stream(pub, [f"devices/d{k}/temp" for k in range(4)], 300, interval=0.001)
    stream.start()
    stream.wait_all_acked(15.0)
    wait_until(lambda: sum(len(m.received()) for m in members) >= stream.n, 10.0,
               what=lambda: f"{stream.n} messages over the members, got {sum(len(m.got) for m in members)}\n{c.logs()}")
    for m in members:
        m.settle()
    got = Counter(k for m in members for k in m.received())
    per_member = {m.client.client._client_id.decode(): len(m.got) for m in members}
    dups = sorted(k for k, n in got.items() if n > 1)
    missing = sorted(set(stream.all_keys()) - set(got))
    assert not dups and not missing, (f"shared group: {len(dups)} delivered twice {dups[:5]}, {len(missing)} "
                                      f"never {missing[:5]}; per member {per_member}\n{c.logs()}")
    assert sum(got.values()) == stream.n


def test_shared_group_members_on_every_node_receive_and_a_dead_nodes_unacked_go_to_the_others(
        cluster: ClusterFactory, paho_factory: PahoFactory) -> None:
    """Members on all three nodes receive (none idles), each message once; then a node whose member holds
    messages unacknowledged is killed -9: once the cluster declares it dead, they go to the other nodes' members.
    Counts what the survivors lost and got twice."""
    c = cluster()
    nodes = c.nodes
    # 1. Two acking members per node; 600 messages published on n1.
    members = {(node.node_id, k): raw_member(node, f"ev-{node.node_id}-{k}", "$share/ev/ev/t", receive_max=10)
               for node in nodes for k in range(2)}
    publish_numbered(nodes[0], paho_factory, "ev/t", 600)
    got = {key: [int(p.payload) for p in raw_drain(raw, quiet=1.5)] for key, raw in members.items()}
    flat = Counter(x for g in got.values() for x in g)
    per_node: Counter[str] = Counter()
    for key, g in got.items():
        per_node[key[0]] += len(g)
    lost = sorted(set(range(600)) - set(flat))
    duplicated = sorted(x for x, n in flat.items() if n > 1)
    assert not lost and not duplicated, f"lost {len(lost)} {lost[:5]}, duplicated {len(duplicated)} {duplicated[:5]}"
    assert all(per_node[node.node_id] for node in nodes), f"members of a node idled: per node {dict(per_node)}"
    # 2. A member on n3 holds 5 unacknowledged (its Receive Maximum); the rest go to members on n1 and n2.
    doomed_node = nodes[2]
    doomed = raw_member(doomed_node, "kd-doomed", "$share/kd/kd/t", receive_max=5)
    publish_numbered(nodes[0], paho_factory, "kd/t", 60)
    held = [int(p.payload) for p in raw_drain(doomed, quiet=1.0, ack=False)]
    assert len(held) == 5, f"the doomed member holds {held}, its receive maximum is 5"
    alive = [raw_member(node, f"kd-{node.node_id}", "$share/kd/kd/t", receive_max=50) for node in nodes[:2]]
    first = [[int(p.payload) for p in raw_drain(a, quiet=1.0)] for a in alive]
    assert sorted(x for g in first for x in g) == sorted(set(range(60)) - set(held)), "the rest, to the others"
    c.kill9(doomed_node)
    c.wait_gone(doomed_node.node_id)
    after = [[int(p.payload) for p in raw_drain(a, quiet=2.0)] for a in alive]
    survivors = Counter(x for g in first + after for x in g)
    lost = sorted(set(range(60)) - set(survivors))
    duplicated = sorted(x for x, n in survivors.items() if n > 1)
    assert not lost and not duplicated, (f"after kill -9 of {doomed_node.node_id} (it held {held}): lost {lost}, "
                                         f"duplicated {duplicated}\n{c.logs()}")


# --- 3. kill -9 of a node with persistent clients ---------------------------------------------------------------


def test_kill9_node_persistent_clients_resume_on_another_node_with_every_acked_message(
        cluster: ClusterFactory, paho_factory: PahoFactory) -> None:
    c = cluster()
    n1, n2, n3 = c.nodes
    movers = [Inbox(connect(n2, paho_factory, "k9-v5", 5, persistent=True, subscribe=["k9/+"]), "k9/+"),
              Inbox(connect(n2, paho_factory, "k9-v4", 4, persistent=True, subscribe=["k9/a"]), "k9/a")]
    control = Inbox(connect(n1, paho_factory, "k9-control", subscribe=["k9/#"]), "k9/#")
    pub = connect(n3, paho_factory, "k9-pub")
    stream = Stream(pub, ["k9/a", "k9/b"], 500, interval=0.003)
    stream.start()
    wait_until(lambda: all(m.received() for m in [*movers, control]), 10.0, what="the stream flowing to everyone")
    c.kill9(n2)
    assert stream.is_alive(), "the stream ended before the kill: nothing exercised"
    for m in movers:
        m.client.wait_disconnect(3.0)
        m.pull()
        assert move(m.client, n1) is True, f"{m.filter}: session not found on n1\n{c.logs()}"
    stream.wait_all_acked(10.0)  # n3's publishes do not depend on n2
    acked = stream.acked()
    for m in movers:
        m.wait_for(m.wanted(acked), 15.0, c)  # duplicates allowed, none missing
    assert_exactly_in_order(control, sorted(acked, key=lambda k: k[1]), c)


# --- 4. the lookup owner of a busy shard killed -------------------------------------------------------------


@pytest.mark.slow  # long: `make test-slow` (CI runs it after `make test`)
def test_kill9_of_the_lookup_owner_of_busy_queues_loses_nothing(
        cluster: ClusterFactory, paho_factory: PahoFactory) -> None:
    """Every queue of the stream (exact, wildcard, first level, a P2P client) has its lookup slot on n2, which
    holds no client: when it dies, notifies must go by broadcast until the new slot table is complete."""
    members = ["n1", "n2", "n3"]
    p = slot_prefix("n2", members, ["{p}/t", "{p}/+", "{p}/#", "{p}-p2p"])
    c = cluster()
    n1, n2, n3 = c.nodes
    target = f"{p}-p2p"
    inboxes = [Inbox(connect(n1, paho_factory, "busy-exact", subscribe=[f"{p}/t"]), f"{p}/t"),
               Inbox(connect(n1, paho_factory, "busy-plus", version=4, subscribe=[f"{p}/+"]), f"{p}/+"),
               Inbox(connect(n1, paho_factory, "busy-first", subscribe=[f"{p}/#"]), f"{p}/#"),
               Inbox(connect(n1, paho_factory, target), f"app/p2p/{target}")]
    pub = connect(n3, paho_factory, "busy-pub")
    stream = Stream(pub, [f"{p}/t", f"app/p2p/{target}"], 500, interval=0.003)
    stream.start()
    wait_until(lambda: all(i.received() for i in inboxes), 10.0, what="the stream flowing to every inbox")
    c.kill9(n2)
    assert stream.is_alive(), "the stream ended before the kill: nothing exercised"
    stream.wait_all_acked(10.0)
    acked = stream.acked()
    for inbox in inboxes:
        assert_exactly_in_order(inbox, sorted(acked, key=lambda k: k[1]), c)


# --- 5. takeover across nodes --------------------------------------------------------------------------------


@pytest.mark.parametrize("version", [5, 4])
def test_client_id_connecting_to_another_node_takes_over_the_one_session(
        cluster: ClusterFactory, paho_factory: PahoFactory, version: int) -> None:
    c = cluster()
    n1, n2, n3 = c.nodes
    cid = f"take-{version}"
    old = connect(n1, paho_factory, cid, version, persistent=True, subscribe=["take/t"])
    new = paho_factory(n2.port, cid, version=version, clean=False)
    res = new.connect(clean_start=False, session_expiry=EXPIRY if version == 5 else None)
    rc = old.wait_disconnect(4.0)
    if version == 5:
        assert rc == 0x8E, f"old connection closed with {rc:#x}, not SESSION_TAKEN_OVER"
    assert res.session_present is True, "the session's subscriptions did not follow it to n2"

    pub = connect(n3, paho_factory, f"take-pub-{version}")
    for i in range(10):
        assert pub.publish("take/t", str(i).encode(), qos=1) < 0x80
    got = Inbox(new, "take/t")
    got.wait_for([("take/t", i) for i in range(10)], 5.0, c)
    assert got.settle() == [("take/t", i) for i in range(10)], "duplicates or disorder after takeover"
    old.assert_nothing(0.2)
    assert new.disconnects.empty(), "the new connection was closed"

    # One session: back on n1, it holds exactly what was published while away, nothing replayed.
    new.disconnect()
    for i in range(10, 13):
        pub.publish("take/t", str(i).encode(), qos=1)
    assert move(new, n1) is True
    got.wait_for([("take/t", i) for i in range(10, 13)], 5.0, c)
    assert got.settle()[10:] == [("take/t", i) for i in range(10, 13)], "stale copy of the session replayed"


# --- 6. Redis restarted mid-stream ----------------------------------------------------------------------------


@pytest.mark.slow  # long: `make test-slow` (CI runs it after `make test`)
def test_redis_kill9_and_restart_mid_stream_loses_no_acked_message(
        cluster: ClusterFactory, paho_factory: PahoFactory) -> None:
    c = cluster()
    n1, n2, n3 = c.nodes
    subs = [Inbox(connect(n1, paho_factory, "rr-v5", 5, persistent=True, subscribe=["rr/#"]), "rr/#"),
            Inbox(connect(n2, paho_factory, "rr-v4", 4, persistent=True, subscribe=["rr/a"]), "rr/a")]
    homes = [n1, n2]
    pub = connect(n3, paho_factory, "rr-pub")
    stream = Stream(pub, ["rr/a", "rr/b"], 500, interval=0.004)
    stream.start()
    wait_until(lambda: all(s.received() for s in subs), 10.0, what="the stream flowing to every subscriber")
    c.single_redis.kill()  # AOF appendfsync always: every acked append is on disk
    assert stream.is_alive(), "the stream ended before the kill: nothing exercised"
    time.sleep(0.5)  # the behaviour under test: Redis stays down for a while, the stream goes on
    c.single_redis.start()
    restarted = time.monotonic()
    stream.join(10.0)
    # Until every publish is answered (acked or refused) or the publisher was dropped: not a check, the ones that
    # went unanswered are simply not acked.
    with contextlib.suppress(AssertionError):
        wait_until(lambda: len(pub.acks_snapshot().keys() & stream.sent.keys()) >= stream.n
                   or not pub.disconnects.empty(), 15.0)
    acked = stream.acked()
    after = [k for k in acked if stream.sent_at[k] > restarted]
    assert after, f"no publish acked after Redis came back ({len(acked)} acked)\n{c.logs()}"
    for sub, home in zip(subs, homes, strict=True):
        if not sub.client.client.is_connected():  # a node may drop clients while its store is away
            sub.pull()
            move(sub.client, home)
        sub.wait_for(sub.wanted(acked), 15.0, c)
