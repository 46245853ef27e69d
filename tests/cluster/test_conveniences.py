"""EMQX's conveniences across nodes, with paho and mosquitto clients: a delayed message published by another
node after the kill -9 of the node that took it, an exclusive subscription refused on a second node until the
holder leaves or its node dies, and auto-subscribe on either node."""

from __future__ import annotations

import json
import subprocess
import time

from tests.cluster.conftest import ClusterFactory
from tests.integration.conftest import PahoFactory
from tests.waiting import wait_until

DELAY_S = 4


def test_delayed_message_survives_the_kill9_of_its_node(cluster: ClusterFactory, paho_factory: PahoFactory) -> None:
    """Published to n1 with a delay, n1 killed at once: n2 publishes it at its time, not before, once."""
    c = cluster(n=2)
    n1, n2 = c.nodes
    sub = paho_factory(n2.port, "watch")
    sub.connect()
    assert sub.subscribe("later/#", 1) == [1]
    pub = paho_factory(n1.port, "dev")
    pub.connect()
    sent = time.monotonic()
    assert pub.publish(f"$delayed/{DELAY_S}/later/x", b"after the kill", qos=1) == 0  # acked: in the store
    c.kill9(n1)
    got = sub.get(timeout=DELAY_S + 15)
    assert time.monotonic() - sent >= DELAY_S - 0.05, "published before its delay"
    assert (got.topic, got.payload) == ("later/x", b"after the kill")
    sub.assert_nothing(1.5)  # once (the wait is the check: a second copy would come within the reclaim period)


def test_exclusive_subscription_across_nodes(cluster: ClusterFactory, paho_factory: PahoFactory) -> None:
    """A holder on n1: a subscriber on n2 is refused (0x97) until the holder unsubscribes; then it holds it, and
    its node's death releases it for a subscriber on n1."""
    c = cluster(n=2)
    n1, n2 = c.nodes
    first = paho_factory(n1.port, "first")
    first.connect()
    second = paho_factory(n2.port, "second")
    second.connect()
    assert first.subscribe("$exclusive/jobs/#", 1) == [1]
    assert second.subscribe("$exclusive/jobs/#", 1) == [0x97]
    assert first.unsubscribe("$exclusive/jobs/#") == [0]
    wait_until(lambda: second.subscribe("$exclusive/jobs/#", 1) == [1], what="the lock free on n2")
    assert first.subscribe("$exclusive/jobs/#", 1) == [0x97]
    c.kill9(n2)
    c.wait_gone(n2.node_id)
    wait_until(lambda: first.subscribe("$exclusive/jobs/#", 1) == [1], timeout=10, what="released by n2's death")


def test_auto_subscribe_on_either_node(cluster: ClusterFactory, paho_factory: PahoFactory) -> None:
    """`cmd/%c` is subscribed for a client of n1 and one of n2 at connect; mosquitto_pub on the other node
    reaches each on its own topic only."""
    auto = json.dumps([{"topic": "cmd/%c", "qos": 1}])
    c = cluster(n=2, env={"TIDEWIRE_AUTO_SUBSCRIBE": auto})
    n1, n2 = c.nodes
    a = paho_factory(n1.port, "dev-a")
    a.connect()
    b = paho_factory(n2.port, "dev-b")
    b.connect()
    for node, target in ((n2, "dev-a"), (n1, "dev-b")):
        subprocess.run(["/usr/bin/mosquitto_pub", "-p", str(node.port), "-i", f"tool-{target}", "-t",
                        f"cmd/{target}", "-m", f"for {target}", "-q", "1"], check=True, timeout=10)
    got_a, got_b = a.get(timeout=10), b.get(timeout=10)
    assert (got_a.topic, got_a.payload) == ("cmd/dev-a", b"for dev-a")
    assert (got_b.topic, got_b.payload) == ("cmd/dev-b", b"for dev-b")
    a.assert_nothing(0.3)
    b.assert_nothing(0.0)
