"""RocketMQ consumer groups across nodes of a cluster (one shared Redis store): SimpleConsumers of one group on
two nodes compete (each message once), and what a dying node had handed out goes to the other node."""

from __future__ import annotations

import time

import pytest

from tests.cluster.conftest import ClusterFactory, cluster  # noqa: F401 - `cluster` is a fixture
from tests.integration.conftest import PahoFactory
from tests.store import redis_server

from .conftest import Clients, wait_port

pytestmark = pytest.mark.skipif(not redis_server.available(), reason="a cluster needs redis-server")


def test_a_group_is_shared_across_nodes(cluster: ClusterFactory, clients: Clients,  # noqa: F811
                                        paho_factory: PahoFactory) -> None:
    c = cluster(2)
    n1, n2 = c.nodes
    for node in c.nodes:
        wait_port(node.rocketmq_port)
    first = clients.consumer(n1, "workers", "a")
    second = clients.consumer(n2, "workers", "a")
    device = paho_factory(n2.port, "device-1")
    device.connect()
    for i in range(40):
        device.publish(f"a/{i}", b"%d" % i, qos=1)
    seen: dict[str, list[bytes]] = {"n1": [], "n2": []}
    held: list[bytes] = []  # received on n1 and never acked
    deadline = time.monotonic() + 20
    while len(seen["n1"]) + len(seen["n2"]) < 40 and time.monotonic() < deadline:
        for name, consumer in (("n1", first), ("n2", second)):
            for m in consumer.receive(4, 60):
                seen[name].append(m.body)
                if name == "n1" and len(held) < 3:
                    held.append(m.body)
                else:
                    consumer.ack(m)
    everything = seen["n1"] + seen["n2"]
    assert sorted(everything) == sorted(b"%d" % i for i in range(40)), c.logs()  # once each
    assert seen["n1"] and seen["n2"]
    assert len(held) == 3
    clients.shutdown(first)
    c.kill9(n1)  # its claims are released when the survivor declares it dead, not after their 60 s
    second.await_duration = 2
    back: list[bytes] = []
    deadline = time.monotonic() + 15
    while len(back) < 3 and time.monotonic() < deadline:
        for m in second.receive(4, 60):
            assert m.delivery_attempt == 2
            back.append(m.body)
            second.ack(m)
    assert sorted(back) == sorted(held), c.logs()
