"""Sparkplug Aware across a cluster: the births an edge node publishes on one node are the certificates a host
application reads on another, live while it is subscribed, retained when it subscribes later, and still after
the node the edge node used is killed (the retained entries live in the shared store)."""

from __future__ import annotations

from tests.cluster.conftest import Cluster, ClusterFactory
from tests.integration.conftest import PahoFactory
from tests.integration.test_sparkplug import CERTS, dbirth, nbirth, publish_edge_node


def test_births_published_on_one_node_are_read_on_another(cluster: ClusterFactory,
                                                          paho_factory: PahoFactory) -> None:
    c: Cluster = cluster(n=2)
    first, second = c.nodes
    live = paho_factory(second.port, "live-host", version=5)
    live.connect()
    assert live.subscribe(f"{CERTS}/#", qos=1) == [1]

    publish_edge_node(paho_factory, first.port, "plant")
    got = {m.topic: m.payload for m in live.expect(2, timeout=10)}
    assert got == {f"{CERTS}/plant/NBIRTH/edge1": nbirth(), f"{CERTS}/plant/DBIRTH/edge1/pump": dbirth()}

    c.kill9(first)  # the node that took the births is gone; the store kept them
    late = paho_factory(second.port, "late-host", version=5)
    late.connect()
    assert late.subscribe(f"{CERTS}/plant/+/edge1/#", qos=1) == [1]
    retained = late.expect(2, timeout=10)
    assert {m.topic for m in retained} == set(got) and all(m.retain for m in retained)
    late.assert_nothing(0.3)
