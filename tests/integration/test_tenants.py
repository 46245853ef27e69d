"""Tenants end to end with paho (Tidewire only): two tenants named by a JWT claim use the same topic names and
never see each other's messages, wildcards and retained messages included, nor the default tenant's; a superuser
of the default tenant sees every tenant under `$tenant/<name>/`; a tenant's connection limit refuses only its own
next client; client ids are scoped per tenant.

Nothing is waited for by sleeping: each publisher ends with a marker, and a subscriber that has the marker has had
everything published before it in its queues (a session delivers its queues in the store's order)."""

from __future__ import annotations

import json
import math
import time

import jwt
import pytest

from tests.integration.conftest import GatewayFactory, PahoFactory
from tests.integration.paho import PahoClient, Received

pytestmark = pytest.mark.tidewire_only

SECRET = "tidewire-integration-test-secret-0123456789"
QUOTA_EXCEEDED = 0x97
NOT_AUTHORIZED = 0x87


def token(sub: str, tenant: str | None = None) -> str:
    claims: dict[str, object] = {"sub": sub, "exp": math.ceil(time.time() + 120)}
    if tenant is not None:
        claims["tenant"] = tenant
    return jwt.encode(claims, SECRET, algorithm="HS256")


def until_marker(client: PahoClient, markers: int = 1) -> list[Received]:
    """What `client` receives up to its `markers`-th marker (markers left out): one per subscription matching it."""
    got: list[Received] = []
    while markers:
        message = client.get()
        if message.payload == b"end":
            markers -= 1
        else:
            got.append(message)
    return got


def test_tenants_are_invisible_to_each_other(gateway_factory: GatewayFactory, paho_factory: PahoFactory) -> None:
    gw = gateway_factory(ws=True, env={"TIDEWIRE_JWT_SECRET": SECRET, "TIDEWIRE_TENANT_JWT_CLAIM": "tenant",
                                       "TIDEWIRE_TENANT_SUPERUSERS": json.dumps(["root"]),
                                       "TIDEWIRE_TENANT_LISTENERS": json.dumps({"ws": "globex"}),
                                       "TIDEWIRE_TENANTS": json.dumps({"acme": {"max_connections": 3}})})

    def client(name: str, tenant: str | None, client_id: str = "", version: int = 5) -> PahoClient:
        return paho_factory(gw.port, client_id or name, version, username=name, password=token(name, tenant))

    subs = {tenant: client(f"sub-{tenant}", tenant if tenant != "-" else None) for tenant in ("acme", "globex", "-")}
    for sub in subs.values():
        sub.connect()
        assert sub.subscribe([("#", 1), ("$share/g/sensors/#", 1)]) == [1, 1]
    root = client("root", None)
    root.connect()
    assert root.subscribe([("$tenant/+/sensors/1", 1), ("sensors/1", 1)]) == [1, 1]
    # The same client id in two tenants: two sessions, no takeover (3.1.1 too).
    pubs = {tenant: client("dev", tenant if tenant != "-" else None, "dev", 4) for tenant in ("acme", "globex", "-")}
    for pub in pubs.values():
        pub.connect()
    for tenant, pub in pubs.items():
        assert pub.publish("sensors/1", tenant.encode(), qos=1, retain=True) == 0
    # The tenants' space is closed to the default tenant's clients, and a tenant's own `$tenant/` is its own.
    assert pubs["-"].publish("$tenant/acme/sensors/1", b"forged", qos=1) == 0  # 3.1.1: a plain PUBACK, dropped
    assert subs["-"].subscribe("$tenant/#", 1) == [NOT_AUTHORIZED]
    assert subs["-"].subscribe("$share/h/$tenant/acme/#", 1) == [NOT_AUTHORIZED]
    for pub in pubs.values():
        assert pub.publish("sensors/end", b"end", qos=1) == 0

    for tenant, sub in subs.items():
        got = until_marker(sub, markers=2)
        # `#` and the shared subscription each deliver it once (two subscriptions, one message each)
        assert sorted((m.topic, m.payload) for m in got) == [("sensors/1", tenant.encode())] * 2, (tenant, got)
        assert pubs[tenant].client.is_connected()  # not taken over by its namesake
    seen = sorted((m.topic, m.payload) for m in root.expect(3))
    assert seen == [("$tenant/acme/sensors/1", b"acme"), ("$tenant/globex/sensors/1", b"globex"),
                    ("sensors/1", b"-")]

    # The superuser addresses one tenant; a device's will stays in its tenant; the ws listener is globex's: a client
    # there without a tenant claim is globex's, one whose token names another tenant is refused.
    acme_dev = client("acme-dev", "acme", "dev2")
    acme_dev.client.will_set("status/dev2", b"gone", qos=1)
    acme_dev.connect()
    on_ws = paho_factory(gw.ws_port, "ws-dev", username="ws-dev", password=token("ws-dev"), websocket=True)
    on_ws.connect()
    assert on_ws.subscribe("commands/#", 1) == [1]
    assert paho_factory(gw.ws_port, "ws-x", username="ws-x", password=token("ws-x", "acme"),
                        websocket=True).connect(check=False).reason_code == NOT_AUTHORIZED
    assert root.publish("$tenant/globex/commands/7", b"from root", qos=1) == 0
    command = on_ws.get()
    assert (command.topic, command.payload) == ("commands/7", b"from root")
    acme_dev.drop()  # no DISCONNECT: its will is due
    will = subs["acme"].get()
    assert (will.topic, will.payload) == ("status/dev2", b"gone")
    # Stored after the will: a subscriber holding the marker would have had the will (globex's `#` has had the
    # superuser's command to globex meanwhile, the default tenant's nothing).
    for tenant, since in (("globex", [("commands/7", b"from root")]), ("-", [])):
        assert pubs[tenant].publish("status/end", b"end", qos=1) == 0
        assert [(m.topic, m.payload) for m in until_marker(subs[tenant])] == since  # `#` alone matches status/end

    # Retained messages stay in their tenant too.
    for tenant in ("acme", "globex", "-"):
        late = client(f"late-{tenant}", tenant if tenant != "-" else None)
        late.connect()
        assert late.subscribe("#", 1) == [1]
        pubs[tenant].publish("zz/end", b"end", qos=1)
        got = until_marker(late)
        assert [(m.topic, m.payload, m.retain) for m in got] == [("sensors/1", tenant.encode(), True)], got
        late.disconnect()

    # acme allows 3 connections: sub and dev (late-acme and acme-dev are gone) → one more, then its next is
    # refused alone.
    extra = client("extra-acme", "acme")
    extra.connect()
    refused = client("over-acme", "acme")
    assert refused.connect(check=False).reason_code == QUOTA_EXCEEDED
    other = client("more-globex", "globex")
    other.connect()
