"""AMQP consumers against the real gateway: MQTT devices publish, pika / aio-pika consumers on bound queues get
every message once; prefetch is credit; nack/reject/recover redeliver; consumers on one queue compete."""

from __future__ import annotations

import functools
import time

import aio_pika
import pika
import pika.exceptions
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from tests.gateway.protocols.amqp.conftest import AmqpGateway, PikaFactory
from tests.gateway.protocols.amqp.helpers import Delivered, collector, drain, settle_for, telemetry_queue
from tests.integration.conftest import PahoFactory, v5_props


def test_device_messages_reach_a_consumer_once_with_mapped_properties(
        amqp_gateway: AmqpGateway, pika_factory: PikaFactory, paho_factory: PahoFactory) -> None:
    gw = amqp_gateway()
    conn = pika_factory(gw.amqp_port)
    channel = conn.channel()
    queue = telemetry_queue(channel)
    device = paho_factory(gw.port, "sensor-1")
    device.connect()
    n = 300
    for i in range(n):
        device.publish(f"telemetry/sensor-1/t{i % 4}", b"%d" % i, qos=1, properties=v5_props(
            3, ContentType="text/plain", CorrelationData=b"c", ResponseTopic="replies/sensor-1",
            UserProperty=[("unit", "C")]) if i == 0 else None)
    device.publish("other/topic", b"not bound", qos=1)
    got: list[tuple[str, bytes, pika.BasicProperties]] = []

    def on_message(ch: BlockingChannel, method: pika.spec.Basic.Deliver, props: pika.BasicProperties,
                   body: bytes) -> None:
        assert method.exchange == "amq.topic" and not method.redelivered
        got.append((method.routing_key, body, props))
        ch.basic_ack(method.delivery_tag)

    channel.basic_qos(prefetch_count=50)
    channel.basic_consume(queue, on_message)
    drain(conn, lambda: len(got) >= n)
    settle_for(conn, 0.3)
    assert [body for _, body, _ in got] == [b"%d" % i for i in range(n)]  # each once, in order
    key, _, props = got[0]
    assert key == "telemetry.sensor-1.t0"
    assert props.content_type == "text/plain" and props.correlation_id == "c"
    assert props.reply_to == "replies.sensor-1" and props.headers == {"unit": "C"} and props.delivery_mode == 2


def test_basic_get_and_message_count(amqp_gateway: AmqpGateway, pika_factory: PikaFactory,
                                     paho_factory: PahoFactory) -> None:
    gw = amqp_gateway()
    channel = pika_factory(gw.amqp_port).channel()
    queue = telemetry_queue(channel)
    device = paho_factory(gw.port, "sensor-2")
    device.connect()
    for i in range(3):
        device.publish("telemetry/x", b"g%d" % i, qos=1)
    assert channel.queue_declare(queue, passive=True).method.message_count == 3
    method, _, body = channel.basic_get(queue)
    assert method is not None and body == b"g0" and method.routing_key == "telemetry.x" and not method.redelivered
    channel.basic_ack(method.delivery_tag)
    method, _, body = channel.basic_get(queue, auto_ack=True)
    assert method is not None and body == b"g1"
    method, _, body = channel.basic_get(queue)
    assert method is not None and body == b"g2"
    channel.basic_reject(method.delivery_tag, requeue=True)
    method, _, body = channel.basic_get(queue, auto_ack=True)
    assert method is not None and body == b"g2" and method.redelivered
    assert channel.basic_get(queue) == (None, None, None)


def test_prefetch_is_credit(amqp_gateway: AmqpGateway, pika_factory: PikaFactory, paho_factory: PahoFactory) -> None:
    gw = amqp_gateway()
    conn = pika_factory(gw.amqp_port)
    channel = conn.channel()
    queue = telemetry_queue(channel)
    device = paho_factory(gw.port, "sensor-3")
    device.connect()
    for i in range(40):
        device.publish("telemetry/p", b"%d" % i, qos=1)
    got: list[Delivered] = []
    channel.basic_qos(prefetch_count=5)
    channel.basic_consume(queue, collector(got, ack=False))
    drain(conn, lambda: len(got) >= 5)
    settle_for(conn, 0.3)
    assert len(got) == 5  # never more unacked than the prefetch
    for acked in range(1, 41):
        channel.basic_ack(got[acked - 1][0])
        drain(conn, functools.partial(at_least, got, min(40, acked + 5)))
        assert len(got) - acked <= 5
    assert sorted(int(body) for _, body, _ in got) == list(range(40))


def at_least(got: list[Delivered], n: int) -> bool:
    return len(got) >= n


def test_nack_and_reject_requeue_redeliver_and_drop(amqp_gateway: AmqpGateway, pika_factory: PikaFactory,
                                                     paho_factory: PahoFactory) -> None:
    gw = amqp_gateway()
    conn = pika_factory(gw.amqp_port)
    channel = conn.channel()
    queue = telemetry_queue(channel)
    device = paho_factory(gw.port, "sensor-4")
    device.connect()
    for body in (b"a", b"b", b"c"):
        device.publish("telemetry/n", body, qos=1)
    got: list[Delivered] = []
    channel.basic_consume(queue, collector(got, ack=False))
    drain(conn, lambda: len(got) >= 3)
    assert [(b, r) for _, b, r in got] == [(b"a", False), (b"b", False), (b"c", False)]
    channel.basic_nack(got[0][0], requeue=True)
    channel.basic_reject(got[1][0], requeue=True)
    channel.basic_nack(got[2][0], requeue=False)  # dropped: there is no dead-lettering
    drain(conn, lambda: len(got) >= 5)
    settle_for(conn, 0.3)
    assert sorted((b, r) for _, b, r in got[3:]) == [(b"a", True), (b"b", True)]
    channel.basic_ack(0, multiple=True)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        channel.basic_ack(999)
        channel.queue_declare(queue, passive=True)  # pika raises the channel's close on the next call
    assert closed.value.reply_code == 406


def test_recover_and_channel_close_requeue_unacked(amqp_gateway: AmqpGateway, pika_factory: PikaFactory,
                                                    paho_factory: PahoFactory) -> None:
    gw = amqp_gateway()
    conn = pika_factory(gw.amqp_port)
    channel = conn.channel()
    queue = telemetry_queue(channel)
    device = paho_factory(gw.port, "sensor-5")
    device.connect()
    for body in (b"r1", b"r2"):
        device.publish("telemetry/r", body, qos=1)
    got: list[Delivered] = []
    channel.basic_consume(queue, collector(got, ack=False))
    drain(conn, lambda: len(got) >= 2)
    channel.basic_recover(requeue=True)
    drain(conn, lambda: len(got) >= 4)
    assert [(b, r) for _, b, r in got[2:]] == [(b"r1", True), (b"r2", True)]
    channel.close()  # unacked go back to the queue
    other = pika_factory(gw.amqp_port).channel()
    bodies = []
    while (result := other.basic_get(queue, auto_ack=True))[0] is not None:
        bodies.append((result[2], result[0].redelivered))
    assert bodies == [(b"r1", True), (b"r2", True)]


def test_two_consumers_compete(amqp_gateway: AmqpGateway, pika_factory: PikaFactory,
                               paho_factory: PahoFactory) -> None:
    gw = amqp_gateway()
    conns = [pika_factory(gw.amqp_port) for _ in range(2)]
    channels = [c.channel() for c in conns]
    queue = telemetry_queue(channels[0])
    got: list[list[Delivered]] = [[], []]
    for channel, into in zip(channels, got, strict=True):
        channel.basic_qos(prefetch_count=10)
        channel.basic_consume(queue, collector(into))
    device = paho_factory(gw.port, "sensor-6")
    device.connect()
    n = 400
    for i in range(n):
        device.publish("telemetry/c", b"%d" % i, qos=1, wait=False)
    deadline = time.monotonic() + 10
    while len(got[0]) + len(got[1]) < n and time.monotonic() < deadline:
        for conn in conns:
            conn.process_data_events(time_limit=0.02)
    for conn in conns:
        settle_for(conn, 0.2)
    bodies = [int(b) for into in got for _, b, _ in into]
    assert sorted(bodies) == list(range(n))  # nothing lost, nothing twice
    assert got[0] and got[1]  # both took part


def test_deleting_a_queue_cancels_its_consumers(amqp_gateway: AmqpGateway, pika_factory: PikaFactory) -> None:
    gw = amqp_gateway()
    conn = pika_factory(gw.amqp_port)
    channel = conn.channel()
    queue = telemetry_queue(channel, "doomed")
    cancelled: list[str] = []
    channel.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    tag = channel.basic_consume(queue, collector([]))
    pika_factory(gw.amqp_port).channel().queue_delete(queue)
    drain(conn, lambda: bool(cancelled))
    assert cancelled == [tag]


async def test_aio_pika_consumer_acks_everything(amqp_gateway: AmqpGateway, paho_factory: PahoFactory) -> None:
    gw = amqp_gateway()
    conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{gw.amqp_port}/")
    try:
        channel = await conn.channel()
        await channel.set_qos(prefetch_count=20)
        queue = await channel.declare_queue("aio-telemetry", durable=True)
        await queue.bind("amq.topic", "telemetry.*.temp")
        device = paho_factory(gw.port, "sensor-7")
        device.connect()
        n = 100
        for i in range(n):
            device.publish(f"telemetry/s{i % 3}/temp", b"%d" % i, qos=1, wait=False)
        device.publish("telemetry/s1/humidity", b"not bound", qos=1)
        seen: list[int] = []
        async with queue.iterator() as messages:
            async for message in messages:
                async with message.process():
                    seen.append(int(message.body))
                    assert message.routing_key == f"telemetry.s{int(message.body) % 3}.temp"
                if len(seen) == n:
                    break
        assert sorted(seen) == list(range(n))
        assert await queue.get(fail=False, timeout=2) is None
    finally:
        await conn.close()
