"""`/api/v1/publish` and `/api/v1/retained` on a real node with paho clients: a publish through the API
reaches subscribers with its properties (QoS 1 answered once durable), retained messages set by an MQTT client
are listed, read and deleted; bad topics, bad base64 and bad bodies are 400/422."""

from __future__ import annotations

import base64
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from tests.admin.conftest import MqttFactory


def test_publish_reaches_a_subscriber(api: httpx.Client, mqtt: MqttFactory) -> None:
    sub = mqtt("pub-sub", version=5)
    sub.subscribe("api/#", 2)
    body = {"topic": "api/cmd", "payload": "reboot", "qos": 1,
            "properties": {"content_type": "text/plain", "message_expiry_interval": 600,
                           "user_properties": {"origin": "ops", "ticket": "42"}}}
    r = api.post("/api/v1/publish", json=body)
    assert r.status_code == 200 and r.json() == {"topic": "api/cmd"}
    got = sub.get()
    assert (got.topic, got.payload, got.qos, got.retain) == ("api/cmd", b"reboot", 1, False)
    assert got.properties["ContentType"] == "text/plain"
    assert sorted(map(tuple, got.properties["UserProperty"])) == [("origin", "ops"), ("ticket", "42")]
    assert 590 <= got.properties["MessageExpiryInterval"] <= 600
    raw = bytes(range(256))
    r = api.post("/api/v1/publish", json={"topic": "api/bin", "payload": base64.b64encode(raw).decode(),
                                          "encoding": "base64", "qos": 2})
    assert r.status_code == 200
    got = sub.get()
    assert (got.topic, got.payload, got.qos) == ("api/bin", raw, 2)
    assert api.post("/api/v1/publish", json={"topic": "api/q0", "payload": "fire"}).status_code == 200
    got = sub.get()
    assert (got.topic, got.payload, got.qos) == ("api/q0", b"fire", 0)


@pytest.mark.parametrize("body", [
    {"topic": "a/+", "payload": "x"}, {"topic": "a/#", "payload": "x"}, {"topic": "", "payload": "x"},
    {"topic": "$SYS/x", "payload": "x"}, {"topic": "$other", "payload": "x"}, {"topic": "a\u0000b", "payload": "x"},
    {"topic": "a", "payload": "not base64!", "encoding": "base64"},
    {"topic": "a", "payload": "YQ", "encoding": "base64"},  # no padding
    {"topic": "a", "payload": "x" * (1024 * 1024 + 1)},
    {"topic": "a", "payload": "x", "properties": {"user_properties": {"k": "\u0000"}}},
])
def test_bad_publish_is_400(api: httpx.Client, body: dict[str, object]) -> None:
    r = api.post("/api/v1/publish", json=body)
    assert r.status_code == 400 and set(r.json()) == {"error"}, r.text


@pytest.mark.parametrize("body", [
    {"payload": "x"}, {"topic": "a", "qos": 3}, {"topic": "a", "encoding": "hex"}, {"topic": "a", "retain": "maybe"},
    {"topic": "a", "typo": 1}, {"topic": "a", "properties": {"message_expiry_interval": 0}},
    {"topic": "a", "properties": {"colour": "red"}},
])
def test_malformed_publish_is_422(api: httpx.Client, body: dict[str, object]) -> None:
    r = api.post("/api/v1/publish", json=body)
    assert r.status_code == 422 and "error" in r.json(), r.text
    assert api.post("/api/v1/publish", content=b"{not json", headers={"content-type": "application/json"},
                    ).status_code == 422


def test_retained_set_by_a_client_is_listed_read_and_deleted(api: httpx.Client, mqtt: MqttFactory) -> None:
    device = mqtt("ret-dev", version=4)
    device.publish("ret/a/state", b"on", qos=1, retain=True)
    device.publish("ret/b/state", b"\x00\xff", qos=1, retain=True)
    device.publish("ret/a/level", b"7", qos=0, retain=True)
    assert api.post("/api/v1/publish", json={"topic": "ret/c/state", "payload": "api", "retain": True, "qos": 1},
                    ).status_code == 200

    def listed(topic: str = "ret/#", **params: int) -> dict[str, Any]:
        r = api.get("/api/v1/retained", params={"topic": topic, **params})
        assert r.status_code == 200, r.text
        return dict(r.json())

    everything = listed()
    assert [m["topic"] for m in everything["data"]] == ["ret/a/level", "ret/a/state", "ret/b/state", "ret/c/state"]
    state = listed("ret/+/state")["data"]
    assert [(m["topic"], base64.b64decode(m["payload"]), m["qos"], m["payload_size"]) for m in state] == [
        ("ret/a/state", b"on", 1, 2), ("ret/b/state", b"\x00\xff", 1, 2), ("ret/c/state", b"api", 1, 3)]
    paged = listed(limit=1, page=2)
    assert [m["topic"] for m in paged["data"]] == ["ret/a/state"] and paged["meta"]["count"] == 4
    one = api.get("/api/v1/retained/ret/b/state").json()
    assert base64.b64decode(one["payload"]) == b"\x00\xff" and one["topic"] == "ret/b/state"
    assert api.delete("/api/v1/retained/ret/b/state").status_code == 204
    assert api.get("/api/v1/retained/ret/b/state").status_code == 404
    assert api.delete("/api/v1/retained/ret/b/state").status_code == 404
    late = mqtt("ret-late", version=5)
    late.subscribe("ret/b/#", 1)
    late.assert_nothing(0.5)  # deleted: a new subscriber gets nothing
    late.subscribe("ret/a/state", 1)
    assert late.get().payload == b"on"


def test_bad_retained_requests(api: httpx.Client) -> None:
    for topic in ("a/#/b", "$share/g/a", "a+"):
        assert api.get("/api/v1/retained", params={"topic": topic}).status_code == 400, topic
    for topic in ("a/#", "a/+/b"):
        path = "/api/v1/retained/" + quote(topic, safe="/")
        assert api.get(path).status_code == 400, topic
        assert api.delete(path).status_code == 400, topic
    assert api.get("/api/v1/retained/never/set").status_code == 404
