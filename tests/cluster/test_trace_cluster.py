"""A trace started on one node of a cluster follows its client to another node, and the download from the first
node holds the packets the other recorded (admin/api_trace.py over the fabric's call/serve)."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.cluster.conftest import ClusterFactory
from tests.integration.conftest import PahoClient
from tests.waiting import wait_until


@pytest.mark.slow  # a two-node cluster with Redis: seconds
def test_a_trace_started_on_one_node_covers_the_client_on_another(cluster: ClusterFactory) -> None:
    c = cluster(2, proxied=True)
    first, second = c.nodes
    auth = {"Authorization": f"Bearer {first.api_token}"}
    base = f"http://127.0.0.1:{first.admin_port}/api/v1/traces"
    started = httpx.post(base, json={"name": "roam", "client_id": "roamer", "duration": 60}, headers=auth, timeout=10)
    assert started.status_code == 201, started.text
    assert started.json()["nodes"] == {"n1": "ok", "n2": "ok"}
    client = PahoClient(second.port, "roamer")
    try:
        client.connect()
        assert client.publish("roam/t", b"x", qos=1) == 0

        def lines() -> list[dict[str, object]]:
            text = httpx.get(f"{base}/roam/download", headers=auth, timeout=10).text
            return [json.loads(line) for line in text.splitlines()]

        wait_until(lambda: ("out", "PUBACK") in [(line["dir"], line["type"]) for line in lines()], 10,
                   what="the other node's packets in the first node's download")
        got = lines()
        assert {line["node"] for line in got} == {"n2"} and got[0]["type"] == "CONNECT"
    finally:
        client.close()
    assert httpx.delete(f"{base}/roam", headers=auth, timeout=10).status_code == 204
    other = httpx.get(f"http://127.0.0.1:{second.admin_port}/api/v1/traces",
                      headers={"Authorization": f"Bearer {second.api_token}"}, timeout=10).json()
    assert other["data"] == []  # deleted on every node
