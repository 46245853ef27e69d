"""The admin API of two real nodes sharing one redis-server: status and nodes show the cluster, each node is
ready once its lookup is complete, listeners include the backends (RocketMQ without a connection count), and a
kick or session delete made on one node acts on the node that holds the client."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.admin.conftest import http
from tests.cluster.conftest import Cluster, ClusterNode
from tests.integration.conftest import PahoClient, free_port
from tests.waiting import wait_until


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    made = Cluster(tmp_path_factory.mktemp("admin-cluster"), 2)
    for node in made.nodes:  # ClusterNode has no admin port of its own: turned on here
        node.admin_port = free_port()
        node.env["TIDEWIRE_API_TOKEN"] = node.api_token
    try:
        made.start()
        yield made
    finally:
        made.close()


def _ready(node: ClusterNode) -> bool:
    with http(node, "") as client:
        return client.get("/readyz").status_code == 200


@pytest.mark.slow  # several seconds (a real node, a build or a long model run): make test-slow
def test_status_nodes_and_readiness(two_nodes: Cluster) -> None:
    n1, n2 = two_nodes.nodes
    for node in (n1, n2):
        wait_until(lambda node=node: _ready(node), timeout=10, what=f"{node.node_id} ready")  # type: ignore[misc]
    with http(n1) as api:
        status = api.get("/api/v1/status").json()
        assert status["node_id"] == "n1" and status["store"] == "redis"
        cluster = status["cluster"]
        assert sorted(m["node_id"] for m in cluster["members"]) == ["n1", "n2"]
        assert cluster["epoch"] == two_nodes.epoch()  # the membership's epoch in Redis: both joins counted
        nodes = api.get("/api/v1/nodes").json()["data"]
        assert [(n["node_id"], n["self"]) for n in nodes] == [("n1", True), ("n2", False)]
        assert all(n["address"] for n in nodes)
        listeners = {e["name"]: e for e in api.get("/api/v1/listeners").json()["data"]}
        assert set(listeners) == {"mqtt", "amqp", "rocketmq"}
        assert listeners["rocketmq"]["port"] == n1.rocketmq_port and listeners["rocketmq"]["connections"] is None
        assert api.get("/api/v1/config").json()["cluster_secret"] == "******"


def test_session_online_elsewhere_is_deleted_by_its_node(two_nodes: Cluster) -> None:
    """DELETE /sessions on n1 of a client online on n2: n2 kicks it (0x98) and the session is gone everywhere."""
    n1, n2 = two_nodes.nodes
    device = PahoClient(n2.port, "cl-dev", 5, False)
    try:
        device.connect(session_expiry=600)
        device.subscribe("cl/#", 1)
        with http(n1) as api1, http(n2) as api2:
            on_n1 = api1.get("/api/v1/sessions/cl-dev")
            assert on_n1.status_code == 200 and on_n1.json()["online"] is True and on_n1.json()["node"] == "n2"
            assert api1.get("/api/v1/clients/cl-dev").status_code == 404  # not connected to this node
            assert api1.delete("/api/v1/sessions/cl-dev").status_code == 204
            assert device.wait_disconnect() == 0x98
            for api in (api1, api2):
                assert api.get("/api/v1/sessions/cl-dev").status_code == 404
            assert api1.delete("/api/v1/sessions/cl-dev").status_code == 404
    finally:
        device.close()


def test_kick_reaches_the_node_that_holds_the_client(two_nodes: Cluster) -> None:
    """DELETE /clients on n1 of a client connected to n2: n2 disconnects it; an unknown client is 404 on both."""
    n1, n2 = two_nodes.nodes
    device = PahoClient(n2.port, "cl-kick", 5, True)
    try:
        device.connect()
        with http(n1) as api1:
            assert api1.delete("/api/v1/clients/cl-kick").status_code == 204
            assert device.wait_disconnect() == 0x98
            assert api1.delete("/api/v1/clients/cl-nobody").status_code == 404
    finally:
        device.close()


def test_each_node_has_its_own_token(two_nodes: Cluster) -> None:
    n1, n2 = two_nodes.nodes
    with httpx.Client(base_url=f"http://127.0.0.1:{n1.admin_port}", timeout=5.0,
                      headers={"Authorization": f"Bearer {n2.api_token}"}) as wrong:
        assert wrong.get("/api/v1/status").status_code == 401
