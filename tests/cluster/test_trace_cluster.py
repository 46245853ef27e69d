"""A trace started on one node of a cluster follows its client to another node, and the download from the first
node holds the packets the other recorded; the slow-subscriber ranking and a client's counters asked of one node
come from the node that holds the client (admin/api_trace.py over the fabric's call/serve)."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.admin.test_api_trace import _manual_ack_subscriber
from tests.cluster.conftest import ClusterFactory
from tests.integration.conftest import PahoClient
from tests.waiting import wait_until


@pytest.mark.slow  # a two-node cluster with Redis: seconds
def test_a_trace_started_on_one_node_covers_the_client_on_another(cluster: ClusterFactory) -> None:
    c = cluster(2, env={"TIDEWIRE_SLOW_SUBSCRIBERS_THRESHOLD_MS": "50"}, proxied=True)
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
        api = f"http://127.0.0.1:{first.admin_port}/api/v1"
        stats = httpx.get(f"{api}/clients/roamer/stats", headers=auth, timeout=10).json()
        assert (stats["node"], stats["messages_in"]) == ("n2", 1)
        late, _ = _manual_ack_subscriber(second, "late-on-n2", 0.2)  # acks each message 0.2 s late
        try:
            assert client.publish("tr/slow", b"x", qos=1) == 0
            wait_until(lambda: [r["client_id"] for r in httpx.get(f"{api}/slow-subscribers", headers=auth,
                                                                  timeout=10).json()["data"]] == ["late-on-n2"],
                       10, what="n2's late acker in n1's ranking")
        finally:
            late.disconnect()
            late.loop_stop()
    finally:
        client.close()
    assert httpx.delete(f"{base}/roam", headers=auth, timeout=10).status_code == 204
    other = httpx.get(f"http://127.0.0.1:{second.admin_port}/api/v1/traces",
                      headers={"Authorization": f"Bearer {second.api_token}"}, timeout=10).json()
    assert other["data"] == []  # deleted on every node
