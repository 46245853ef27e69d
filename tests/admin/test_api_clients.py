"""`/api/v1/clients`, `/subscriptions` and `/sessions` on a real node with paho (MQTT 5 and 3.1.1) and pika
(AMQP) clients: listing with filters and pages, kicks that really disconnect (5.0: DISCONNECT 0x98), subscriptions
added through the API that deliver, sessions inspected and deleted; bad input answered 400/404/409/422."""

from __future__ import annotations

import time

import httpx
import pika
import pytest
from pika.exceptions import AMQPConnectionError

from tests.admin.conftest import MqttFactory
from tests.integration.conftest import Gateway
from tests.waiting import wait_until

ADMINISTRATIVE_ACTION = 0x98


def ids(api: httpx.Client, **params: str) -> list[str]:
    r = api.get("/api/v1/clients", params=params)
    assert r.status_code == 200, r.text
    return [c["client_id"] for c in r.json()["data"]]


def test_list_find_and_page(api: httpx.Client, mqtt: MqttFactory) -> None:
    mqtt("lst-a", version=5, keepalive=30)
    mqtt("lst-b", version=4)
    mqtt("lst/c")  # a client id with a '/'
    assert ids(api, client_id="lst") == ["lst-a", "lst-b", "lst/c"]
    assert ids(api, client_id="lst-", protocol="mqtt") == ["lst-a", "lst-b"]
    assert ids(api, client_id="lst", protocol="amqp") == []
    assert ids(api, client_id="lst", username="nobody") == []
    assert ids(api, client_id="lst", peer="127.0.0.1") == ["lst-a", "lst-b", "lst/c"]
    page = api.get("/api/v1/clients", params={"client_id": "lst", "page": 2, "limit": 2}).json()
    assert [c["client_id"] for c in page["data"]] == ["lst/c"]
    assert page["meta"] == {"page": 2, "limit": 2, "count": 3}
    a = api.get("/api/v1/clients/lst-a").json()
    assert a["proto_ver"] == 5 and a["clean_start"] is True and a["keepalive"] == 30
    assert a["protocol"] == "mqtt" and a["listener"] == "mqtt"
    assert a["username"] is None and a["peer"].startswith("127.0.0.1:") and abs(a["connected_at"] - time.time()) < 30
    assert a["subscriptions"] == 0 and a["subscriptions_list"] == [] and a["inflight"] == 0 and a["node"]
    b = api.get("/api/v1/clients/lst-b").json()
    assert b["proto_ver"] == 4 and b["clean_start"] is True
    assert api.get("/api/v1/clients/lst/c").json()["client_id"] == "lst/c"


@pytest.mark.parametrize("params", [{"page": 0}, {"page": "x"}, {"limit": 0}, {"limit": 1001}, {"limit": -1}])
def test_bad_paging_is_422(api: httpx.Client, params: dict[str, int | str]) -> None:
    for path in ("/api/v1/clients", "/api/v1/subscriptions", "/api/v1/retained"):
        r = api.get(path, params=params)
        assert r.status_code == 422 and r.json()["error"].startswith("invalid query."), (path, r.text)


def test_unknown_client_is_404(api: httpx.Client) -> None:
    for method, path, body in (("GET", "/api/v1/clients/nobody", None), ("DELETE", "/api/v1/clients/nobody", None),
                               ("GET", "/api/v1/clients/nobody/subscriptions", None),
                               ("POST", "/api/v1/clients/nobody/subscriptions", {"topic": "a"}),
                               ("DELETE", "/api/v1/clients/nobody/subscriptions?topic=a", None),
                               ("GET", "/api/v1/sessions/nobody", None), ("DELETE", "/api/v1/sessions/nobody", None)):
        r = api.request(method, path, json=body)
        assert r.status_code == 404 and set(r.json()) == {"error"}, (method, path, r.text)


def test_kick_disconnects_with_administrative_action(api: httpx.Client, mqtt: MqttFactory) -> None:
    v5 = mqtt("kick-5", version=5)
    v3 = mqtt("kick-3", version=4)
    assert api.delete("/api/v1/clients/kick-5").status_code == 204
    assert v5.wait_disconnect() == ADMINISTRATIVE_ACTION
    assert api.delete("/api/v1/clients/kick-3").status_code == 204
    v3.wait_disconnect()  # 3.1.1 has no DISCONNECT from the server: the connection is closed
    wait_until(lambda: ids(api, client_id="kick-") == [], what="kicked clients gone")
    assert api.delete("/api/v1/clients/kick-5").status_code == 404


def test_subscription_added_through_the_api_delivers(api: httpx.Client, mqtt: MqttFactory) -> None:
    publisher = mqtt("sub-pub", version=4)
    publisher.publish("cmd/dev/retained", b"kept", qos=1, retain=True)
    device = mqtt("sub-dev", version=5)
    r = api.post("/api/v1/clients/sub-dev/subscriptions", json={"topic": "cmd/dev/#", "qos": 1})
    assert r.status_code == 201 and r.json()["topic"] == "cmd/dev/#" and r.json()["qos"] == 1
    retained = device.get()  # retain_handling 0: the retained message follows the new subscription
    assert (retained.topic, retained.payload, retained.retain) == ("cmd/dev/retained", b"kept", True)
    publisher.publish("cmd/dev/reboot", b"now", qos=1)
    got = device.get()
    assert (got.topic, got.payload, got.qos) == ("cmd/dev/reboot", b"now", 1)
    listed = api.get("/api/v1/clients/sub-dev/subscriptions").json()["data"]
    assert listed == [{"topic": "cmd/dev/#", "qos": 1, "no_local": False, "retain_as_published": False,
                       "retain_handling": 0}]
    assert api.get("/api/v1/clients/sub-dev").json()["subscriptions_list"] == listed
    everything = api.get("/api/v1/subscriptions", params={"client_id": "sub-dev"}).json()
    assert everything["data"] == [{"client_id": "sub-dev", "topic": "cmd/dev/#", "qos": 1}]
    assert api.get("/api/v1/subscriptions", params={"topic": "cmd/dev"}).json()["meta"]["count"] == 1
    assert api.get("/api/v1/subscriptions", params={"topic": "nothing-like-it"}).json()["meta"]["count"] == 0
    r = api.delete("/api/v1/clients/sub-dev/subscriptions", params={"topic": "cmd/dev/#"})
    assert r.status_code == 204
    publisher.publish("cmd/dev/reboot", b"again", qos=1)
    device.assert_nothing(0.5)
    assert api.delete("/api/v1/clients/sub-dev/subscriptions", params={"topic": "cmd/dev/#"}).status_code == 404
    assert api.get("/api/v1/clients/sub-dev/subscriptions").json()["data"] == []


def test_bad_subscriptions(api: httpx.Client, mqtt: MqttFactory) -> None:
    mqtt("bad-sub")
    path = "/api/v1/clients/bad-sub/subscriptions"
    for topic in ("a/#/b", "a+", "", "$share/g", "$share//a", "p2p#bad-sub"):
        r = api.post(path, json={"topic": topic})
        assert r.status_code == 400 and "error" in r.json(), (topic, r.text)
    assert api.post(path, json={"topic": "$share/g/a", "no_local": True}).status_code == 400
    for body in ({"topic": "a", "qos": 3}, {"qos": 1}, {"topic": "a", "extra": 1}, {"topic": 5}):
        assert api.post(path, json=body).status_code == 422, body
    assert api.delete(path).status_code == 422  # ?topic= is required
    shared = api.post(path, json={"topic": "$share/g/jobs/#", "qos": 2})
    assert shared.status_code == 201 and shared.json()["qos"] == 2


def test_sessions_inspect_and_delete(api: httpx.Client, mqtt: MqttFactory, admin_gateway: Gateway) -> None:
    device = mqtt("sess-1", version=4, clean=False)
    device.subscribe("sess/#", 1)
    online = api.get("/api/v1/sessions/sess-1").json()
    assert online["online"] is True and online["persistent"] is True and online["inflight"] == 0
    assert [s["topic"] for s in online["subscriptions"]] == ["sess/#"]
    device.disconnect()
    wait_until(lambda: api.get("/api/v1/sessions/sess-1").json()["online"] is False, what="session parked")
    parked = api.get("/api/v1/sessions/sess-1").json()
    assert parked["disconnected_at"] is not None and parked["inflight"] is None
    assert [s["topic"] for s in parked["subscriptions"]] == ["sess/#"]
    assert api.delete("/api/v1/sessions/sess-1").status_code == 204
    assert api.get("/api/v1/sessions/sess-1").status_code == 404
    again = mqtt("sess-1", version=4, clean=False, connect=False)
    assert again.connect().session_present is False  # the session is gone
    assert api.get("/api/v1/sessions/sess-1").json()["subscriptions"] == []
    # Online: kicked first, then deleted.
    assert api.delete("/api/v1/sessions/sess-1").status_code == 204
    again.wait_disconnect()
    assert api.get("/api/v1/sessions/sess-1").status_code == 404
    clean = mqtt("sess-clean", version=5)
    assert api.get("/api/v1/sessions/sess-clean").json()["persistent"] is False
    assert api.delete("/api/v1/sessions/sess-clean").status_code == 204  # a clean session ends with its kick
    assert clean.wait_disconnect() == ADMINISTRATIVE_ACTION


def test_session_present_after_delete(api: httpx.Client, admin_gateway: Gateway, mqtt: MqttFactory) -> None:
    def parked() -> bool:
        return bool(api.get("/api/v1/sessions/sess-2").json()["online"] is False)

    first = mqtt("sess-2", version=5, clean=False, session_expiry=3600)
    first.subscribe("x/#", 1)
    first.disconnect()
    wait_until(parked, what="session parked")
    second = mqtt("sess-2", version=5, clean=False, connect=False)
    assert second.connect(session_expiry=3600).session_present is True
    assert api.get("/api/v1/sessions/sess-2").json()["expiry_interval"] == 3600
    second.disconnect()
    wait_until(parked, what="session parked")
    assert api.delete("/api/v1/sessions/sess-2").status_code == 204
    back = mqtt("sess-2", version=5, clean=False, connect=False)
    assert back.connect(session_expiry=3600).session_present is False
    assert api.get("/api/v1/clients/sess-2").json()["subscriptions"] == 0  # a new, empty session


def test_amqp_connections_are_listed_and_kicked(api: httpx.Client, admin_gateway: Gateway) -> None:
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", admin_gateway.amqp_port,
                                                                   blocked_connection_timeout=5))
    try:
        amqp = api.get("/api/v1/clients", params={"protocol": "amqp"}).json()["data"]
        assert len(amqp) == 1 and amqp[0]["listener"] == "amqp" and amqp[0]["proto_ver"] is None
        conn_id = amqp[0]["client_id"]
        assert api.get(f"/api/v1/clients/{conn_id}").json()["protocol"] == "amqp"
        listeners = {e["name"]: e for e in api.get("/api/v1/listeners").json()["data"]}
        assert listeners["amqp"]["connections"] == 1
        assert api.delete(f"/api/v1/clients/{conn_id}").status_code == 204
        with pytest.raises(AMQPConnectionError):
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                connection.process_data_events(time_limit=0.1)
        wait_until(lambda: api.get("/api/v1/clients", params={"protocol": "amqp"}).json()["data"] == [],
                   what="AMQP connection gone")
    finally:
        if connection.is_open:
            connection.close()
