"""Tenants as AMQP virtual hosts, with pika and paho (Tidewire only): a tenant's vhost (named as the tenant) sees
only its tenant's devices under the same topic names, the default vhost `/` only the default tenant's; a user opens
only its tenant's vhost, a superuser any; what a tenant's AMQP backend publishes reaches only its devices."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable

import jwt
import pika
import pytest

from tests.gateway.protocols.amqp.conftest import AmqpGateway, PikaFactory
from tests.gateway.protocols.amqp.helpers import drain
from tests.integration.conftest import PahoFactory
from tests.waiting import wait_until

pytestmark = pytest.mark.slow  # pika on three vhosts and paho: over a second

SECRET = "tidewire-integration-test-secret-0123456789"
TENANTS = ("acme", "globex", None)  # None: the default tenant


def token(sub: str, tenant: str | None) -> str:
    claims: dict[str, object] = {"sub": sub, "exp": math.ceil(time.time() + 120)}
    if tenant is not None:
        claims["tenant"] = tenant
    return jwt.encode(claims, SECRET, algorithm="HS256")


def marked(into: list[tuple[str, bytes]]) -> Callable[[], bool]:
    """Has the end marker arrived in `into`?"""
    return lambda: any(body == b"end" for _, body in into)


def test_tenant_vhosts_see_only_their_devices(amqp_gateway: AmqpGateway, pika_factory: PikaFactory,
                                              paho_factory: PahoFactory) -> None:
    gw = amqp_gateway(env={"TIDEWIRE_JWT_SECRET": SECRET, "TIDEWIRE_TENANT_JWT_CLAIM": "tenant",
                           "TIDEWIRE_TENANT_SUPERUSERS": json.dumps(["root"]),
                           "TIDEWIRE_TENANTS": json.dumps({"globex": {"max_connections": 2}})})
    assert gw.amqp_port is not None
    got: dict[str | None, list[tuple[str, bytes]]] = {}
    conns: dict[str | None, pika.BlockingConnection] = {}
    channels = {}
    for tenant in TENANTS:
        user = f"backend-{tenant or 'default'}"
        conn = conns[tenant] = pika_factory(gw.amqp_port, user, token(user, tenant), virtual_host=tenant or "/")
        channel = channels[tenant] = conn.channel()
        channel.queue_declare("q")  # the same queue name in every vhost
        channel.queue_bind("q", "amq.topic", "sensors.#")
        into = got[tenant] = []
        channel.basic_consume("q", lambda ch, method, _p, body, into=into: (
            into.append((method.routing_key, body)), ch.basic_ack(method.delivery_tag)))

    devices = {}
    for tenant in TENANTS:
        name = f"dev-{tenant or 'default'}"
        device = devices[tenant] = paho_factory(gw.port, "dev", username=name, password=token(name, tenant))
        device.connect()
        assert device.subscribe("commands/#", 1) == [1]
    for tenant, device in devices.items():
        assert device.publish("sensors/1", (tenant or "-").encode(), qos=1) == 0
    for device in devices.values():
        assert device.publish("sensors/end", b"end", qos=1) == 0
    for tenant in TENANTS:
        drain(conns[tenant], marked(got[tenant]), what=f"{tenant} marker")
        assert got[tenant] == [("sensors.1", (tenant or "-").encode()), ("sensors.end", b"end")], (tenant, got)

    # A tenant's backend commands only its own devices (the same topic in every tenant). Confirmed publishes:
    # every command is stored before the markers, so a device holding its marker has had all it would get.
    for channel in channels.values():
        channel.confirm_delivery()
    channels["acme"].basic_publish("amq.topic", "commands.1", b"for acme")
    channels[None].basic_publish("amq.topic", "commands.1", b"for default")
    for channel in channels.values():
        channel.basic_publish("amq.topic", "commands.end", b"end")
    expected = {"acme": [("commands/1", b"for acme")], "globex": [], None: [("commands/1", b"for default")]}
    for tenant, device in devices.items():
        received = []
        while (message := device.get()).payload != b"end":
            received.append((message.topic, message.payload))
        assert received == expected[tenant], tenant

    # A user opens only its tenant's vhost; a superuser any, and sees every tenant from `/` under `$tenant.`.
    for user, tenant, vhost in (("backend-acme", "acme", "globex"), ("backend-acme", "acme", "/"),
                                ("backend-default", None, "acme")):
        with pytest.raises(pika.exceptions.AMQPConnectionError):
            pika_factory(gw.amqp_port, user, token(user, tenant), virtual_host=vhost)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker, match="refused"):
        channels[None].queue_bind("q", "amq.topic", "$tenant.#")  # the default tenant cannot read the tenants'
    root = pika_factory(gw.amqp_port, "root", token("root", None))
    root_channel = root.channel()
    root_channel.queue_declare("all")
    root_channel.queue_bind("all", "amq.topic", "$tenant.*.sensors.#")
    in_acme = pika_factory(gw.amqp_port, "root", token("root", None), virtual_host="acme").channel()
    assert in_acme.queue_declare("q", passive=True).method.message_count == 0  # acme's own queue, drained above
    every: list[tuple[str, bytes]] = []
    root_channel.basic_consume("all", lambda ch, method, _p, body: every.append((method.routing_key, body)),
                               auto_ack=True)
    for tenant, device in devices.items():
        assert device.publish("sensors/2", (tenant or "-").encode(), qos=1) == 0
    drain(root, lambda: len(every) == 2, what="both tenants' sensors/2")
    assert sorted(every) == [("$tenant.acme.sensors.2", b"acme"), ("$tenant.globex.sensors.2", b"globex")]

    # globex's limit counts its AMQP backend and its MQTT device: its next AMQP connection is refused, acme's not.
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika_factory(gw.amqp_port, "backend-globex", token("backend-globex", "globex"), virtual_host="globex")
    pika_factory(gw.amqp_port, "backend-acme", token("backend-acme", "acme"), virtual_host="acme")
    conns["globex"].close()  # one connection less: room again, once the node has seen it go

    def opens() -> bool:
        try:
            pika_factory(gw.amqp_port, "backend-globex", token("backend-globex", "globex"), virtual_host="globex")
        except pika.exceptions.AMQPConnectionError:
            return False
        return True

    wait_until(opens, timeout=5, what="globex's closed connection no longer counted")
