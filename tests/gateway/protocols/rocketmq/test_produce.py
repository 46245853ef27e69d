"""RocketMQ producers (the official Python client) publish to MQTT devices through a real gateway."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from rocketmq.grpc_protocol import Code, MessagingServiceStub, definition_pb2, service_pb2
from rocketmq.v5.exception import ForbiddenException, IllegalArgumentException
from rocketmq.v5.util.signature import Signature

from tests.extensions.plugin_dist import lay_out, pythonpath
from tests.integration.conftest import Gateway, PahoClient, PahoFactory
from tests.waiting import wait_until

from .conftest import Clients, message


def subscriber(paho_factory: PahoFactory, gw: Gateway, *filters: str) -> PahoClient:
    sub = paho_factory(gw.port, "dev-" + uuid.uuid4().hex[:8])
    sub.connect()
    sub.subscribe([(f, 1) for f in filters])
    return sub


def test_send_reaches_mqtt_devices(rmq_gateway: Callable[..., Gateway], clients: Clients,
                                   paho_factory: PahoFactory) -> None:
    gw = rmq_gateway()
    sub = subscriber(paho_factory, gw, "T/#")
    producer = clients.producer(gw, ["T"])
    receipts = []
    for i, second in enumerate(["/b/c/", "/b/c", "b/c", None, "/d/e/f/"]):
        props = {"x": str(i)} | ({"mqttSecondTopic": second} if second is not None else {})
        receipts.append(producer.send(message("T", b"m%d" % i, tag="tg", keys=("k1", "k2"), properties=props)))
    got = sub.expect(5)
    assert [(r.topic, r.payload, r.qos) for r in got] == [
        ("T/b/c", b"m0", 1), ("T/b/c", b"m1", 1), ("T/b/c", b"m2", 1), ("T", b"m3", 1), ("T/d/e/f", b"m4", 1)]
    for i, received in enumerate(got):
        user = dict(received.properties["UserProperty"])
        assert sorted(user.pop("KEYS").split()) == ["k1", "k2"]
        assert user == {"x": str(i), "TAGS": "tg"}  # the second topic is in the topic
    assert len({r.message_id for r in receipts}) == 5
    assert [r.offset for r in receipts] == sorted(r.offset for r in receipts)


def test_settings_and_message_types(rmq_gateway: Callable[..., Gateway], clients: Clients) -> None:
    """Telemetry tells the producer the body limit; the route accepts NORMAL, FIFO and DELAY messages."""
    gw = rmq_gateway(env={"TIDEWIRE_ROCKETMQ_MAX_BODY": "1000"})
    producer = clients.producer(gw, ["T"])
    wait_until(lambda: producer._Producer__max_body_size == 1000, what="settings from the gateway")
    with pytest.raises(IllegalArgumentException, match="exceeds"):
        producer.send(message("T", b"x" * 1001))
    fifo = message("T", b"x")
    fifo.message_group = "g"
    producer.send(fifo)
    producer.send(message("T", b"x" * 1000))


def _stub_send(gw: Gateway, request: service_pb2.SendMessageRequest) -> service_pb2.SendMessageResponse:
    config = Clients().config(gw)
    with grpc.insecure_channel(f"127.0.0.1:{gw.rocketmq_port}") as channel:
        stub = MessagingServiceStub(channel)
        return stub.SendMessage(request, metadata=Signature.metadata(config, "stub-client"), timeout=5)


def _request(message_id: str, body: bytes) -> service_pb2.SendMessageRequest:
    request = service_pb2.SendMessageRequest()
    pb = request.messages.add(body=body)
    pb.topic.name = "T"
    pb.system_properties.message_id = message_id
    pb.system_properties.message_type = definition_pb2.NORMAL
    pb.system_properties.body_encoding = definition_pb2.IDENTITY
    pb.user_properties["mqttSecondTopic"] = "/dedup/"
    return request


def test_retried_send_is_stored_once(rmq_gateway: Callable[..., Gateway], paho_factory: PahoFactory) -> None:
    """A retry carries the first attempt's message id (the client's generated stubs, as its retry sends them):
    concurrent and later retries get the first answer, and the message is stored once."""
    gw = rmq_gateway()
    sub = subscriber(paho_factory, gw, "T/dedup")
    request = _request("0A0B0C0D0E0F00000000000001", b"once")
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda _: _stub_send(gw, request), range(4)))
    answers.append(_stub_send(gw, request))
    assert {a.status.code for a in answers} == {Code.OK}
    assert len({(a.entries[0].message_id, a.entries[0].offset) for a in answers}) == 1
    assert sub.get().payload == b"once"
    other = _stub_send(gw, _request("0A0B0C0D0E0F00000000000002", b"twice"))
    assert other.entries[0].offset > answers[0].entries[0].offset
    assert sub.get().payload == b"twice"
    sub.assert_nothing()


def test_body_over_the_limit(rmq_gateway: Callable[..., Gateway], paho_factory: PahoFactory) -> None:
    gw = rmq_gateway(env={"TIDEWIRE_ROCKETMQ_MAX_BODY": "1000"})
    sub = subscriber(paho_factory, gw, "T/#")
    answer = _stub_send(gw, _request("big-1", b"x" * 1001))
    assert answer.status.code == Code.MESSAGE_BODY_TOO_LARGE
    assert _stub_send(gw, _request("empty-1", b"")).status.code == Code.MESSAGE_BODY_EMPTY
    sub.assert_nothing()


def test_sends_go_through_the_publish_hooks(rmq_gateway: Callable[..., Gateway], clients: Clients,
                                           paho_factory: PahoFactory, tmp_path: Path) -> None:
    """The test plugin's hook (tests/extensions/plugin_pkg/) rewrites `rewrite/X` to `rewritten/X` and denies
    `deny/X`: a RocketMQ send to topic `rewrite` reaches MQTT on `rewritten/...`, one to `deny` is FORBIDDEN."""
    gw = rmq_gateway(env={"PYTHONPATH": pythonpath(lay_out(tmp_path / "plugins")),
                          "TIDEWIRE_PUBLISH_HOOKS": '["testhook"]'})
    sub = subscriber(paho_factory, gw, "rewritten/#", "rewrite/#", "deny/#")
    producer = clients.producer(gw, ["rewrite", "deny"])
    producer.send(message("rewrite", b"m", properties={"mqttSecondTopic": "/a"}))
    got = sub.get()
    assert (got.topic, got.payload) == ("rewritten/a", b"R:m")
    with pytest.raises(ForbiddenException):
        producer.send(message("deny", b"m", properties={"mqttSecondTopic": "/a"}))
    sub.assert_nothing(0.2)
