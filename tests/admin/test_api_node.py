"""`/api/v1/status|nodes|listeners|config|stats` on a real node: counters follow real MQTT traffic, listeners
show their bound ports and connections, the configuration masks secrets (also passwords inside URLs)."""

from __future__ import annotations

import time

import httpx

from tests.admin.conftest import MqttFactory
from tests.integration.conftest import Gateway
from tidewire.admin.api_node import MASK, redacted_config
from tidewire.gateway.config import Settings


def test_status_follows_traffic(api: httpx.Client, mqtt: MqttFactory) -> None:
    before = api.get("/api/v1/status").json()
    assert before["node_id"] and before["version"] and before["store"] == "embedded"
    assert before["draining"] is False and before["cluster"] is None and before["uptime_s"] > 0
    sub = mqtt("status-sub")
    sub.subscribe("status/#", 1)
    pub = mqtt("status-pub", version=4)
    for i in range(3):
        pub.publish("status/t", f"m{i}".encode(), qos=1)
    sub.expect(3)
    after = api.get("/api/v1/status").json()
    assert after["connections"] == before["connections"] + 2
    assert after["sessions_online"] == before["sessions_online"] + 2
    assert after["subscriptions"] == before["subscriptions"] + 1
    assert after["messages_in"] >= before["messages_in"] + 3 and after["bytes_in"] >= before["bytes_in"] + 6
    assert after["messages_out"] >= before["messages_out"] + 3 and after["bytes_out"] > before["bytes_out"]
    stats = api.get("/api/v1/stats").json()
    assert abs(stats["time"] - time.time()) < 5 and stats["connections"] == after["connections"]
    assert stats["messages_in"] >= after["messages_in"] and isinstance(stats["top_topics"], list)
    assert set(stats) == {"time", "connections", "messages_in", "messages_out", "bytes_in", "bytes_out",
                          "dropped", "top_topics"}


def test_nodes_and_listeners(api: httpx.Client, mqtt: MqttFactory, admin_gateway: Gateway) -> None:
    nodes = api.get("/api/v1/nodes").json()["data"]
    assert len(nodes) == 1 and nodes[0]["self"] is True
    assert nodes[0]["node_id"] == api.get("/api/v1/status").json()["node_id"]

    def listeners() -> dict[str, dict[str, object]]:
        return {entry["name"]: entry for entry in api.get("/api/v1/listeners").json()["data"]}

    before = listeners()
    assert set(before) == {"mqtt", "amqp"}
    assert before["mqtt"]["port"] == admin_gateway.port and before["amqp"]["port"] == admin_gateway.amqp_port
    assert before["mqtt"]["protocol"] == "mqtt" and before["mqtt"]["host"] == "127.0.0.1"
    assert isinstance(before["mqtt"]["max_connections"], int)
    client = mqtt("listener-count")
    assert listeners()["mqtt"]["connections"] == before["mqtt"]["connections"] + 1  # type: ignore[operator]
    client.disconnect()


def test_config_masks_secrets(api: httpx.Client, admin_gateway: Gateway) -> None:
    config = api.get("/api/v1/config").json()
    assert config["port"] == admin_gateway.port and config["admin_port"] == admin_gateway.admin_port
    assert config["cluster_secret"] == MASK and config["api_token"] == MASK  # set: masked
    assert config["jwt_secret"] is None  # not set: shown as such
    text = api.get("/api/v1/config").text
    assert "cluster-s3cret" not in text and admin_gateway.api_token not in text


def test_redaction_rules() -> None:
    settings = Settings(store="redis://admin:hunter2@10.0.0.5:6379/0", jwt_secret="k", http_auth_url="http://h/a",
                        http_auth_headers={"Authorization": "Bearer xyz"}, password_hash_threads=3)
    shown = redacted_config(settings)
    assert shown["store"] == f"redis://admin:{MASK}@10.0.0.5:6379/0"
    assert shown["jwt_secret"] == MASK and shown["http_auth_headers"] == {"Authorization": MASK}
    assert shown["http_auth_url"] == "http://h/a" and shown["password_hash_threads"] == 3
    assert shown["api_token"] is None and shown["password_file"] is None
    assert "hunter2" not in str(shown) and "xyz" not in str(shown)
