"""What an AMQP client was told is safe survives `kill -9` of the gateway: confirmed messages, a durable queue,
its bindings and its position (acked messages stay acked, unacked ones come back redelivered)."""

from __future__ import annotations

import pika

from tests.gateway.protocols.amqp.conftest import AmqpGateway, PikaFactory, wait_for_port
from tests.integration.conftest import PahoFactory


def test_confirmed_messages_and_queue_position_survive_kill_9(amqp_gateway: AmqpGateway, pika_factory: PikaFactory,
                                                             paho_factory: PahoFactory) -> None:
    gw = amqp_gateway()
    channel = pika_factory(gw.amqp_port).channel()
    channel.confirm_delivery()
    channel.queue_declare("jobs", durable=True)
    channel.queue_bind("jobs", "amq.topic", "jobs.#")
    channel.queue_declare("scratch", durable=False)  # a transient queue does not survive a restart
    for i in range(100):
        channel.basic_publish("amq.topic", f"jobs.j{i}", b"%d" % i, pika.BasicProperties(delivery_mode=2))
    for i in range(40):
        method, _, body = channel.basic_get("jobs")
        assert method is not None and body == b"%d" % i
        channel.basic_ack(method.delivery_tag)
    unacked = [channel.basic_get("jobs")[2] for _ in range(10)]
    assert unacked == [b"%d" % i for i in range(40, 50)]
    channel.queue_declare("jobs", passive=True)  # a round trip: the acks before it are settled

    gw.kill9()
    gw.start()
    wait_for_port(gw.amqp_port)

    conn = pika_factory(gw.amqp_port)
    channel = conn.channel()
    got = []
    while (result := channel.basic_get("jobs", auto_ack=True))[0] is not None:
        got.append((int(result[2]), result[0].redelivered))
    assert [n for n, _ in got] == list(range(40, 100))  # acked stay acked, nothing lost, nothing twice
    assert all(redelivered == (n < 50) for n, redelivered in got)
    device = paho_factory(gw.port, "after-restart")  # the binding survived too: new device data is routed
    device.connect()
    device.publish("jobs/new", b"new", qos=1)
    channel.confirm_delivery()
    channel.queue_declare("jobs", passive=True)
    method, _, body = channel.basic_get("jobs", auto_ack=True)
    assert body == b"new"
    try:
        conn.channel().queue_declare("scratch", passive=True)
        raise AssertionError("a non-durable queue outlived the restart")
    except pika.exceptions.ChannelClosedByBroker as exc:
        assert exc.reply_code == 404
