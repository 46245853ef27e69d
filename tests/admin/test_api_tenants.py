"""`/api/v1/tenants` and the `tidewire_tenant_*` metrics against a real node with paho clients of two tenants
(named by a JWT claim): the counts follow what the clients did; a tenant's message rate and its retained bytes
refuse only its own publishes (PUBACK 0x97), and the retained bytes are measured again from the store (a delete
frees room)."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator

import jwt
import pytest

from tests.admin.conftest import http
from tests.integration.conftest import Gateway, PahoClient
from tests.waiting import wait_until

SECRET = "tidewire-integration-test-secret-0123456789"
QUOTA_EXCEEDED = 0x97
ADMINISTRATIVE_ACTION = 0x98
BANNED = 0x8A


def tenant_client(gw: Gateway, name: str, tenant: str) -> PahoClient:
    password = jwt.encode({"sub": name, "tenant": tenant, "exp": math.ceil(time.time() + 120)}, SECRET,
                          algorithm="HS256")
    return PahoClient(gw.port, name, username=name, password=password)


@pytest.fixture
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    env = {"TIDEWIRE_JWT_SECRET": SECRET, "TIDEWIRE_TENANT_JWT_CLAIM": "tenant",
           "TIDEWIRE_TENANTS": json.dumps({"acme": {"max_connections": 5, "max_message_rate": 1},
                                             "globex": {"max_retained_bytes": 10}}),
           "TIDEWIRE_TENANT_MEASURE_INTERVAL": "0.1"}
    with Gateway(tmp_path_factory.mktemp("tenants"), admin=True, env=env) as gw:
        yield gw


def test_tenants_api_and_metrics(node: Gateway) -> None:
    clients = [tenant_client(node, "a1", "acme"), tenant_client(node, "g1", "globex")]
    try:
        for c in clients:
            c.connect()
        acme, globex = clients
        assert acme.subscribe("t/#", 1) == [1]
        assert acme.publish("t/1", b"x", qos=1) == 0
        assert acme.publish("t/2", b"y", qos=1) == QUOTA_EXCEEDED  # 1/s, a burst of one: refused, dropped
        assert acme.get().topic == "t/1"
        for _ in range(3):  # globex has no rate limit: acme's does not touch it
            assert globex.publish("t/1", b"z", qos=1) == 0
        # globex may keep 10 bytes of retained payloads; acme has no such cap.
        assert globex.publish("r/1", b"12345678", qos=1, retain=True) == 0
        assert globex.publish("r/2", b"12345", qos=1, retain=True) == QUOTA_EXCEEDED
        assert acme.publish("r/2", b"12345", qos=1, retain=True) == QUOTA_EXCEEDED  # acme's rate: 1/s (used)
        assert globex.publish("r/1", b"", qos=1, retain=True) == 0  # a delete always passes
        with http(node) as api:
            listing = api.get("/api/v1/tenants").json()
            by_name = {t["name"]: t for t in listing["data"]}
            assert sorted(by_name) == ["acme", "globex"]
            assert by_name["acme"]["mount"] == "$tenant/acme/"
            assert by_name["acme"]["configured"] and by_name["globex"]["configured"]
            assert (by_name["acme"]["connections"], by_name["acme"]["messages_in"]) == (1, 1)
            assert by_name["acme"]["messages_out"] == 1
            assert by_name["acme"]["refused"]["message_rate"] == 2
            assert by_name["acme"]["limits"]["max_connections"] == 5
            assert (by_name["globex"]["messages_in"], by_name["globex"]["refused"]["message_rate"]) == (5, 0)
            assert by_name["globex"]["refused"]["retained_bytes"] == 1 and by_name["acme"]["retained_bytes"] is None
            # Measured again from the store: the deleted topic's bytes are free once more.
            wait_until(lambda: api.get("/api/v1/tenants/globex").json()["retained_bytes"] == 0, timeout=5,
                       what="globex's retained bytes measured as 0")
            assert globex.publish("r/2", b"12345", qos=1, retain=True) == 0
            assert api.get("/api/v1/tenants/globex").json()["connections"] == 1
            assert api.get("/api/v1/tenants/nobody").status_code == 404
            assert http(node, "").get("/api/v1/tenants").status_code == 401
            metrics = api.get("/metrics").text
            # Operators see (and ban) a tenant's client by its scoped id; `a1` of another tenant is not touched.
            listed = [c["client_id"] for c in api.get("/api/v1/clients").json()["data"]]
            assert sorted(listed) == ["$tenant/acme/a1", "$tenant/globex/g1"]
            assert api.post("/api/v1/banned", json={"as": "clientid", "who": "$tenant/acme/a1"}).status_code == 201
        assert acme.wait_disconnect(timeout=5) == ADMINISTRATIVE_ACTION
        again = tenant_client(node, "a1", "acme")
        clients.append(again)
        assert again.connect(check=False).reason_code == BANNED
        other = tenant_client(node, "a1", "globex")
        clients.append(other)
        other.connect()
        assert 'tidewire_tenant_connections{tenant="acme"} 1.0' in metrics
        assert 'tidewire_tenant_messages_received_total{tenant="globex"} 6.0' in metrics
        assert 'tidewire_tenant_retained_bytes{tenant="globex"} 5.0' in metrics
        assert 'tidewire_tenant_refused_total{reason="message_rate",tenant="acme"} 2.0' in metrics
    finally:
        for c in clients:
            c.close()
