"""RocketMQ SimpleConsumers (the official Python client) consume device data through a real gateway: a
consumer of topic `a` reads every MQTT publish on `a/...` once, with competing consumers, invisible durations,
filters and the dead-letter queue; invisible durations also in-process, on the node's clock moved by hand."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest
from paho.mqtt.packettypes import PacketTypes
from rocketmq import FilterExpression
from rocketmq.grpc_protocol import Code, FilterType, ForwardMessageToDeadLetterQueueRequest, definition_pb2, service_pb2
from rocketmq.v5.exception import BadRequestException

from tests.gateway.fakeclock import FakeClock
from tests.integration.conftest import Gateway, PahoClient, PahoFactory, v5_props
from tidewire.extensions.hooks import ClientInfo
from tidewire.gateway.core.ingress import publish_future
from tidewire.gateway.node import Node
from tidewire.gateway.protocols.rocketmq.consuming import Consuming
from tidewire.store.base import Message

from .conftest import Clients, message


def device(paho_factory: PahoFactory, gw: Gateway) -> PahoClient:
    pub = paho_factory(gw.port, "device-1")
    pub.connect()
    return pub


def test_device_data_reaches_a_consumer_once(rmq_gateway: Callable[..., Gateway], clients: Clients,
                                             paho_factory: PahoFactory) -> None:
    gw = rmq_gateway()
    consumer = clients.consumer(gw, "backend", "a")
    pub = device(paho_factory, gw)
    topics = ["a/b/c", "a/x", "a", "other/b", "a/b/c"]
    for i, topic in enumerate(topics):
        pub.publish(topic, b"v%d" % i, qos=1, properties=v5_props(PacketTypes.PUBLISH, UserProperty=[("unit", "C")]))
    got = consumer.receive(16, 30)
    assert [(m.topic, m.body, m.properties.get("mqttSecondTopic")) for m in got] == [
        ("a", b"v0", "/b/c/"), ("a", b"v1", "/x/"), ("a", b"v2", None), ("a", b"v4", "/b/c/")]
    assert all(m.properties["unit"] == "C" for m in got)
    assert all(m.delivery_attempt == 1 for m in got)
    assert len({m.message_id for m in got}) == 4
    assert [m.born_timestamp for m in got] == sorted(m.born_timestamp for m in got) and got[0].born_timestamp > 0
    for m in got:
        consumer.ack(m)
    assert consumer.receive(16, 30) == []  # acked: never again (MESSAGE_NOT_FOUND after the long poll)


def test_competing_consumers_share_a_group(rmq_gateway: Callable[..., Gateway], clients: Clients,
                                           paho_factory: PahoFactory) -> None:
    gw = rmq_gateway()
    first = clients.consumer(gw, "workers", "a")
    second = clients.consumer(gw, "workers", "a", wait_declared=False)
    other_group = clients.consumer(gw, "audit", "a")
    pub = device(paho_factory, gw)
    for i in range(20):
        pub.publish(f"a/{i}", b"%d" % i, qos=1)
    seen: list[bytes] = []
    deadline = time.monotonic() + 10
    while len(seen) < 20 and time.monotonic() < deadline:
        for consumer in (first, second):
            for m in consumer.receive(3, 30):
                seen.append(m.body)
                consumer.ack(m)
    assert sorted(seen) == sorted(b"%d" % i for i in range(20))  # each once across the group
    audit: list[bytes] = []
    while len(audit) < 20 and time.monotonic() < deadline:
        audit += [m.body for m in other_group.receive(32, 30)]
    assert sorted(audit) == sorted(seen)  # another group reads everything again


@pytest.mark.slow  # waits out a protocol timer (make test-slow)
def test_unacked_message_comes_back(rmq_gateway: Callable[..., Gateway], clients: Clients,
                                    paho_factory: PahoFactory) -> None:
    gw = rmq_gateway()
    consumer = clients.consumer(gw, "g", "a", await_s=3)
    device(paho_factory, gw).publish("a/b", b"retry me", qos=1)
    first = consumer.receive(1, 1)
    assert [m.body for m in first] == [b"retry me"]
    started = time.monotonic()
    again = consumer.receive(1, 30)  # invisible for 1 s, then redelivered
    assert time.monotonic() - started >= 0.5
    assert [(m.body, m.message_id, m.delivery_attempt) for m in again] == [
        (b"retry me", first[0].message_id, 2)]
    with pytest.raises(BadRequestException) as stale:
        consumer.ack(first[0])  # the first delivery's receipt handle is dead
    assert stale.value.code == Code.INVALID_RECEIPT_HANDLE
    consumer.ack(again[0])
    consumer.await_duration = 1
    assert consumer.receive(1, 1) == []


@pytest.mark.slow  # waits out a protocol timer (make test-slow)
def test_change_invisible_duration(rmq_gateway: Callable[..., Gateway], clients: Clients,
                                   paho_factory: PahoFactory) -> None:
    gw = rmq_gateway()
    consumer = clients.consumer(gw, "g", "a", await_s=1)
    pub = device(paho_factory, gw)
    pub.publish("a/1", b"keep", qos=1)
    pub.publish("a/2", b"now", qos=1)
    keep, now = consumer.receive(2, 1)
    received_at = time.monotonic()
    old_handle = keep.receipt_handle
    consumer.change_invisible_duration(keep, 3)  # hidden longer: not back after its first second
    assert keep.receipt_handle != old_handle
    consumer.change_invisible_duration(now, 0)  # visible again at once (a nack)
    again = consumer.receive(2, 10)
    assert [(m.body, m.delivery_attempt) for m in again] == [(b"now", 2)]
    consumer.ack(again[0])
    time.sleep(max(0.0, received_at + 1.3 - time.monotonic()))
    assert consumer.receive(2, 10) == []  # past the first invisible second: a lapsed claim would be taken now
    consumer.ack(keep)  # with the new handle (the old one is dead: acking with it would raise)


def test_tag_and_sql_filters(rmq_gateway: Callable[..., Gateway], clients: Clients) -> None:
    gw = rmq_gateway()
    tagged = clients.consumer(gw, "tagged", "T", FilterExpression("x || y"))
    sql = clients.consumer(gw, "sql", "T", FilterExpression("level > 5 AND site IN ('s1', 's2')", FilterType.SQL))
    producer = clients.producer(gw, ["T"])
    sent = [("x", {"level": "9", "site": "s1"}), ("z", {"level": "7", "site": "s2"}),
            ("y", {"level": "1", "site": "s1"}), (None, {"level": "6", "site": "s3"}), (None, {"site": "s1"})]
    for i, (tag, props) in enumerate(sent):
        producer.send(message("T", b"%d" % i, tag=tag, properties=props))
    assert sorted(m.body for m in tagged.receive(16, 30)) == [b"0", b"2"]
    assert sorted(m.body for m in sql.receive(16, 30)) == [b"0", b"1"]


def test_bad_sql_filter_is_refused(rmq_gateway: Callable[..., Gateway], clients: Clients) -> None:
    gw = rmq_gateway()
    consumer = clients.consumer(gw, "bad", "T", FilterExpression("a LIKE 'x%'", FilterType.SQL),
                                wait_declared=False)
    with pytest.raises(BadRequestException) as refused:
        consumer.receive(1, 10)
    assert refused.value.code == Code.ILLEGAL_FILTER_EXPRESSION


def test_dead_letter_queue(rmq_gateway: Callable[..., Gateway], clients: Clients,
                          paho_factory: PahoFactory) -> None:
    gw = rmq_gateway()
    consumer = clients.consumer(gw, "g", "a")
    dlq = clients.consumer(gw, "dlq-reader", "%DLQ%g")
    device(paho_factory, gw).publish("a/b/c", b"poison", qos=1)
    (poison,) = consumer.receive(1, 30)
    request = ForwardMessageToDeadLetterQueueRequest(receipt_handle=poison.receipt_handle,
                                                     message_id=poison.message_id, delivery_attempt=1,
                                                     max_delivery_attempts=1)
    request.group.name = "g"
    request.topic.name = "a"
    answer = consumer.rpc_client.forward_message_to_dead_letter_queue_async(
        poison.endpoints, request, metadata=consumer.sign(), timeout=3).result()
    assert answer.status.code == Code.OK
    (dead,) = dlq.receive(1, 30)
    assert (dead.topic, dead.body, dead.properties["mqttSecondTopic"]) == ("%DLQ%g", b"poison", "/b/c/")
    assert dead.properties["ORIGIN_MESSAGE_ID"] == poison.message_id
    assert consumer.receive(1, 30) == []  # settled in its group
    again = consumer.rpc_client.forward_message_to_dead_letter_queue_async(
        poison.endpoints, request, metadata=consumer.sign(), timeout=3).result()
    assert again.status.code == Code.INVALID_RECEIPT_HANDLE



# --- in-process, on the node's clock moved by hand ---------------------------------------------------------------

async def _receive(consuming: Consuming, caller: ClientInfo, invisible_s: int) -> tuple[list[Any], Any]:
    """One ReceiveMessage of topic `a` for group `g` (no long polling): the messages and the last response."""
    request = service_pb2.ReceiveMessageRequest(
        group=definition_pb2.Resource(name="g"), message_queue=definition_pb2.MessageQueue(
            topic=definition_pb2.Resource(name="a")), batch_size=8,
        filter_expression=definition_pb2.FilterExpression(type=definition_pb2.TAG, expression="*"))
    request.invisible_duration.seconds = invisible_s
    responses = [r async for r in consuming.receive(caller, request, None)]
    return [r.message for r in responses if r.HasField("message")], responses[-1]


async def test_invisible_durations_count_on_the_node_clock(clocked_node: Node, clock: FakeClock) -> None:
    """A received message stays invisible for its invisible duration on the node's clock, then comes back (delivery
    attempt 2); ChangeInvisibleDuration moves that on the same clock. No socket, no sleep."""
    node = clocked_node
    consuming = Consuming(node, "127.0.0.1:8081")
    caller = ClientInfo("rmq-1", None)
    assert await consuming.subscribe("g", "a", definition_pb2.TAG, "*") == "rmq/g/a"
    await asyncio.gather(*publish_future(node.publish, [Message("a/1", b"one", 1)]))
    [first], last = await _receive(consuming, caller, 30)
    assert first.body == b"one" and first.system_properties.delivery_attempt == 1
    assert last.delivery_timestamp.seconds == int(clock.wall)
    clock.advance(29)
    assert (await _receive(consuming, caller, 30))[0] == []
    clock.advance(1)
    [again], _ = await _receive(consuming, caller, 30)
    assert again.system_properties.delivery_attempt == 2
    change = service_pb2.ChangeInvisibleDurationRequest(
        group=definition_pb2.Resource(name="g"), topic=definition_pb2.Resource(name="a"),
        receipt_handle=again.system_properties.receipt_handle, message_id=again.system_properties.message_id)
    change.invisible_duration.seconds = 120
    changed = await consuming.change_invisible(caller, change)
    assert changed.status.code == definition_pb2.Code.OK
    clock.advance(119)
    assert (await _receive(consuming, caller, 30))[0] == []
    clock.advance(1)
    [third], _ = await _receive(consuming, caller, 30)
    assert third.system_properties.delivery_attempt == 3
