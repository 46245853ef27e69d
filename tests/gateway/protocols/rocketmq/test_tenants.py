"""Tenants as RocketMQ namespaces, with the official rocketmq python client (`ClientConfiguration(namespace=)`) and
paho (Tidewire only): two namespaces with the same topic and consumer group see only their own tenant's devices,
the default namespace only the default tenant's; a tenant's access key may use only its namespace, a superuser
any; what a tenant's producer sends reaches only that tenant's devices."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import jwt
import pytest
from rocketmq import ClientConfiguration, Credentials, FilterExpression, Producer, SimpleConsumer
from rocketmq.grpc_protocol import Code, MessagingServiceStub, QueryRouteRequest
from rocketmq.v5.exception import ForbiddenException
from rocketmq.v5.util.signature import Signature

from tests.integration.conftest import Gateway, PahoFactory
from tests.waiting import wait_until

from .conftest import Clients, message, write_credentials

pytestmark = pytest.mark.slow  # three gRPC clients' start-ups and long polls: several seconds

JWT_SECRET = "tidewire-integration-test-secret-0123456789"
KEYS = {"acme-key": "acme-secret", "globex-key": "globex-secret", "plain-key": "plain-secret",
        "root": "root-secret"}
KEY_OF = {"acme": "acme-key", "globex": "globex-key", None: "plain-key"}
TENANTS = ("acme", "globex", None)


def token(sub: str, tenant: str | None) -> str:
    claims: dict[str, object] = {"sub": sub, "exp": math.ceil(time.time() + 120)}
    if tenant is not None:
        claims["tenant"] = tenant
    return jwt.encode(claims, JWT_SECRET, algorithm="HS256")


def config(gw: Gateway, ak: str, namespace: str) -> ClientConfiguration:
    return ClientConfiguration(f"127.0.0.1:{gw.rocketmq_port}", Credentials(ak, KEYS[ak]), namespace=namespace,
                               request_timeout=3)


def route_status(gw: Gateway, ak: str, namespace: str) -> int:
    """QueryRoute signed by the client's own code, in a namespace."""
    with grpc.insecure_channel(f"127.0.0.1:{gw.rocketmq_port}") as channel:
        request = QueryRouteRequest()
        request.topic.name = "sensors"
        request.topic.resource_namespace = namespace
        answer = MessagingServiceStub(channel).QueryRoute(
            request, metadata=Signature.metadata(config(gw, ak, namespace), "c1"), timeout=5)
    return int(answer.status.code)


def test_namespaces_see_only_their_tenant(rmq_gateway: Callable[..., Gateway], clients: Clients,
                                          paho_factory: PahoFactory, tmp_path: Path) -> None:
    credentials = write_credentials(tmp_path / "rocketmq.credentials", KEYS)
    gw = rmq_gateway(env={
        "TIDEWIRE_ROCKETMQ_CREDENTIALS_FILE": str(credentials), "TIDEWIRE_JWT_SECRET": JWT_SECRET,
        "TIDEWIRE_TENANT_JWT_CLAIM": "tenant", "TIDEWIRE_TENANT_SUPERUSERS": json.dumps(["root"]),
        "TIDEWIRE_TENANT_USERS": json.dumps({"acme-key": "acme", "globex-key": "globex"})})

    assert route_status(gw, "acme-key", "acme") == Code.OK
    assert route_status(gw, "acme-key", "") == Code.OK  # a tenant's key acts in its namespace anyway
    assert route_status(gw, "acme-key", "globex") == Code.FORBIDDEN
    assert route_status(gw, "plain-key", "acme") == Code.FORBIDDEN
    assert route_status(gw, "root", "globex") == Code.OK

    snooper = SimpleConsumer(config(gw, "plain-key", ""), "S", {"$tenant": FilterExpression()}, await_duration=1)
    clients.made.append(snooper)
    snooper.startup()
    with pytest.raises(ForbiddenException, match="may not read"):  # the tenants' space: closed to the default's
        snooper.receive(16, 30)

    consumers: dict[str | None, SimpleConsumer] = {}
    for tenant in TENANTS:  # the same group and topic in every namespace
        consumer = SimpleConsumer(config(gw, KEY_OF[tenant], tenant or ""), "G", {"sensors": FilterExpression()},
                                  await_duration=1)
        consumer.startup()
        clients.made.append(consumer)
        consumers[tenant] = consumer
    wait_until(lambda: gw.stderr.count("event=rocketmq.subscription group=G topic=sensors ") == 3, timeout=5,
               what="three subscriptions")

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
    for tenant, consumer in consumers.items():
        got: list[tuple[str, str | None, bytes]] = []
        deadline = time.monotonic() + 10
        while not any(body == b"end" for _, _, body in got) and time.monotonic() < deadline:
            for m in consumer.receive(16, 30):
                got.append((m.topic, m.properties.get("mqttSecondTopic"), m.body))
                consumer.ack(m)
        assert sorted(got) == [("sensors", "/1/", (tenant or "-").encode()), ("sensors", "/end/", b"end")], tenant

    # A tenant's producer commands only its devices; the others see none of it (their own marker comes first).
    producer = Producer(config(gw, "acme-key", "acme"), topics=["commands"])
    producer.startup()
    clients.made.append(producer)
    producer.send(message("commands", b"for acme", properties={"mqttSecondTopic": "/1"}))
    for device in devices.values():
        assert device.publish("commands/end", b"end", qos=1) == 0
    expected = {"acme": [("commands/1", b"for acme")], "globex": [], None: []}
    for tenant, device in devices.items():
        received = []
        while (m := device.get()).payload != b"end":
            received.append((m.topic, m.payload))
        assert received == expected[tenant], tenant
