"""Tenants across two nodes on one Redis (slow, as every cluster scenario): the mount points and the scoped client
ids are the store's names, so a tenant's message published on one node reaches its tenant's subscriber on the other
and nobody else's, and the same client id in two tenants on two nodes is two sessions (no takeover across tenants),
while the same id in one tenant does take over across nodes."""

from __future__ import annotations

import json
import math
import time

import jwt

from tests.cluster.conftest import ClusterFactory
from tests.integration.conftest import PahoFactory
from tests.integration.paho import PahoClient

SECRET = "tidewire-integration-test-secret-0123456789"
SESSION_TAKEN_OVER = 0x8E


def token(sub: str, tenant: str | None) -> str:
    claims: dict[str, object] = {"sub": sub, "exp": math.ceil(time.time() + 120)}
    if tenant is not None:
        claims["tenant"] = tenant
    return jwt.encode(claims, SECRET, algorithm="HS256")


def test_tenants_across_nodes(cluster: ClusterFactory, paho_factory: PahoFactory) -> None:
    c = cluster(2, env={"TIDEWIRE_JWT_SECRET": SECRET, "TIDEWIRE_TENANT_JWT_CLAIM": "tenant",
                        "TIDEWIRE_TENANT_SUPERUSERS": json.dumps(["root"])})
    n1, n2 = c.nodes

    def client(port: int, name: str, tenant: str | None, client_id: str) -> PahoClient:
        made = paho_factory(port, client_id, username=name, password=token(name, tenant))
        made.connect()
        return made

    subs = {tenant: client(n2.port, f"sub-{tenant}", tenant, "sub") for tenant in ("acme", "globex", None)}
    for sub in subs.values():
        assert sub.subscribe("#", 1) == [1]
    devs = {tenant: client(n1.port, f"dev-{tenant}", tenant, "dev") for tenant in ("acme", "globex", None)}
    for tenant, dev in devs.items():
        assert dev.publish("s/1", str(tenant).encode(), qos=1) == 0
    for dev in devs.values():
        assert dev.publish("s/end", b"end", qos=1) == 0
    for tenant, sub in subs.items():
        got = []
        while (m := sub.get(timeout=10)).payload != b"end":
            got.append((m.topic, m.payload))
        assert got == [("s/1", str(tenant).encode())], tenant

    # `dev` of acme again, on the other node: it takes over acme's `dev` only.
    again = client(n2.port, "dev-acme", "acme", "dev")
    assert devs["acme"].wait_disconnect(timeout=10) == SESSION_TAKEN_OVER
    assert devs["globex"].client.is_connected() and devs[None].client.is_connected()
    assert again.publish("s/2", b"again", qos=1) == 0
    m = subs["acme"].get(timeout=10)
    assert (m.topic, m.payload) == ("s/2", b"again")
