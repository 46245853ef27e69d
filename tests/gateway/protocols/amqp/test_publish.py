"""AMQP publishing against the real gateway: pika and aio-pika publish with confirms, paho MQTT 5 devices receive
what was confirmed with the properties mapped; exchanges route into their own topic spaces; refusals."""

from __future__ import annotations

import aio_pika
import pika
import pika.exceptions
import pytest
from pamqp import commands

from tests.gateway.protocols.amqp.conftest import AmqpGateway, PikaFactory
from tests.integration.conftest import PahoFactory

N = 200


def test_pika_confirmed_publishes_reach_mqtt_devices_with_mapped_properties(
        amqp_gateway: AmqpGateway, pika_factory: PikaFactory, paho_factory: PahoFactory) -> None:
    gw = amqp_gateway()
    device = paho_factory(gw.port, "dev-1")
    device.connect()
    device.subscribe("devices/dev-1/cmd/#", qos=1)
    channel = pika_factory(gw.amqp_port).channel()
    channel.confirm_delivery()  # every basic_publish below returns once the broker's Basic.Ack arrived
    stamp = 1714564800  # pika takes epoch seconds
    for i in range(N):
        channel.basic_publish("amq.topic", f"devices.dev-1.cmd.set{i % 3}", b"cmd %d" % i, pika.BasicProperties(
            delivery_mode=2, content_type="text/plain", correlation_id=f"req-{i}", reply_to="backend.replies",
            headers={"n": i, "flag": True, "who": "svc"}, expiration="60000", message_id=f"m{i}",
            timestamp=stamp, app_id="svc", priority=3, type="command"))
    got = device.expect(N, timeout=10)
    assert [r.payload for r in got] == [b"cmd %d" % i for i in range(N)]
    first = got[0]
    assert first.topic == "devices/dev-1/cmd/set0"
    assert first.qos == 1
    props = first.properties
    assert props["ContentType"] == "text/plain"
    assert bytes.fromhex(props["CorrelationData"]) == b"req-0"
    assert props["ResponseTopic"] == "backend/replies"
    assert 55 <= props["MessageExpiryInterval"] <= 60
    user = dict(props["UserProperty"])
    assert user["n"] == "0" and user["flag"] == "true" and user["who"] == "svc"
    assert user["x-amqp-message-id"] == "m0" and user["x-amqp-app-id"] == "svc" and user["x-amqp-type"] == "command"
    assert user["x-amqp-priority"] == "3" and user["x-amqp-timestamp"] == str(stamp)


def test_transient_publish_is_qos0_and_dots_slashes_swap(amqp_gateway: AmqpGateway, pika_factory: PikaFactory,
                                                         paho_factory: PahoFactory) -> None:
    gw = amqp_gateway()
    device = paho_factory(gw.port, "dev-2")
    device.connect()
    device.subscribe("site/+/v1.2", qos=1)
    channel = pika_factory(gw.amqp_port).channel()
    channel.confirm_delivery()
    channel.basic_publish("amq.topic", "site.a.v1/2", b"x", pika.BasicProperties(delivery_mode=1))
    got = device.get(5)
    assert (got.topic, got.payload, got.qos) == ("site/a/v1.2", b"x", 0)


async def test_aio_pika_confirmed_publishes_reach_mqtt_devices(amqp_gateway: AmqpGateway,
                                                               paho_factory: PahoFactory) -> None:
    gw = amqp_gateway()
    device = paho_factory(gw.port, "dev-3")
    device.connect()
    device.subscribe("fleet/#", qos=1)
    conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{gw.amqp_port}/")
    try:
        channel = await conn.channel(publisher_confirms=True)
        exchange = await channel.get_exchange("amq.topic")
        for i in range(N):
            confirmation = await exchange.publish(aio_pika.Message(
                b"p%d" % i, delivery_mode=aio_pika.DeliveryMode.PERSISTENT, content_type="application/json",
                correlation_id=f"c{i}", headers={"k": "v"}), routing_key=f"fleet.truck{i % 5}.pos")
            assert isinstance(confirmation, commands.Basic.Ack)
    finally:
        await conn.close()
    got = device.expect(N, timeout=10)
    assert sorted(r.payload for r in got) == sorted(b"p%d" % i for i in range(N))
    assert {r.topic for r in got} == {f"fleet/truck{i}/pos" for i in range(5)}
    assert all(r.qos == 1 and r.properties["ContentType"] == "application/json" for r in got)
    assert dict(got[0].properties["UserProperty"])["k"] == "v"


def test_mandatory_unroutable_comes_back_then_routable_is_confirmed(amqp_gateway: AmqpGateway,
                                                                      pika_factory: PikaFactory,
                                                                      paho_factory: PahoFactory) -> None:
    gw = amqp_gateway()
    channel = pika_factory(gw.amqp_port).channel()
    channel.confirm_delivery()
    with pytest.raises(pika.exceptions.UnroutableError) as returned:
        channel.basic_publish("amq.topic", "nobody.listens", b"lost", mandatory=True)
    message = returned.value.messages[0]
    assert message.method.reply_code == 312 and message.body == b"lost"
    device = paho_factory(gw.port, "dev-4")
    device.connect()
    device.subscribe("somebody/listens", qos=1)
    channel.basic_publish("amq.topic", "somebody.listens", b"kept", mandatory=True)
    assert device.get(5).payload == b"kept"
    # Only an offline persistent session subscribes (to the exact topic, or to its first level): the message
    # waits for it, so it is routed, not returned (as RabbitMQ's MQTT plugin, whose session has a queue)
    away = paho_factory(gw.port, "dev-away", clean=False)
    away.connect(session_expiry=3600)
    away.subscribe([("away/dev/cmd", 1), ("fleet/#", 1)])
    away.disconnect()
    channel.basic_publish("amq.topic", "away.dev.cmd", b"waits", mandatory=True)
    channel.basic_publish("amq.topic", "fleet.truck1.cmd", b"waits too", mandatory=True)
    away.connect(session_expiry=3600)
    assert sorted(m.payload for m in away.expect(2, 5)) == [b"waits", b"waits too"]


def test_publish_to_missing_exchange_closes_the_channel_404(amqp_gateway: AmqpGateway,
                                                             pika_factory: PikaFactory) -> None:
    gw = amqp_gateway()
    conn = pika_factory(gw.amqp_port)
    channel = conn.channel()
    channel.confirm_delivery()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        channel.basic_publish("no-such-exchange", "k", b"x")
    assert closed.value.reply_code == 404
    assert conn.is_open
    other = conn.channel()  # only that channel went
    other.basic_publish("amq.topic", "still.fine", b"y")


def test_exchanges_route_in_their_own_topic_space(amqp_gateway: AmqpGateway, pika_factory: PikaFactory,
                                                  paho_factory: PahoFactory) -> None:
    gw = amqp_gateway()
    channel = pika_factory(gw.amqp_port).channel()
    channel.confirm_delivery()
    channel.exchange_declare("orders", "topic", durable=True)
    channel.exchange_declare("jobs", "direct")
    channel.exchange_declare("news", "fanout")
    queues = {}
    for name, exchange, key in (("q-orders", "orders", "eu.*"), ("q-jobs", "jobs", "a/b+#"), ("q-news", "news", ""),
                                ("q-plain", "amq.direct", "x")):
        queues[name] = channel.queue_declare(name, durable=True).method.queue
        channel.queue_bind(name, exchange, key)
    device = paho_factory(gw.port, "dev-5")
    device.connect()
    device.subscribe("#", qos=1)  # `$exchange/...` and `$queue/...` are `$` topics: MQTT `#` does not see them
    device.subscribe("$exchange/orders/#", qos=1)
    channel.basic_publish("orders", "eu.fr", b"o1")
    channel.basic_publish("orders", "us.ny", b"o2")  # no binding matches: stored, read by nobody but `$exchange/#`
    channel.basic_publish("jobs", "a/b+#", b"j1")
    channel.basic_publish("jobs", "a/b", b"j2")
    channel.basic_publish("news", "whatever", b"n1")
    channel.basic_publish("amq.direct", "x", b"d1")
    channel.basic_publish("", "q-plain", b"default-exchange")
    seen = {r.payload: r.topic for r in device.expect(2, timeout=5)}
    assert seen == {b"o1": "$exchange/orders/eu/fr", b"o2": "$exchange/orders/us/ny"}
    device.assert_nothing(0.3)
    expected = {"q-orders": [(b"o1", "orders", "eu.fr")], "q-jobs": [(b"j1", "jobs", "a/b+#")],
                "q-news": [(b"n1", "news", "")], "q-plain": [(b"d1", "amq.direct", "x"), (b"default-exchange", "",
                                                                                          "q-plain")]}
    for name, want in expected.items():
        got = []
        while (result := channel.basic_get(name, auto_ack=True))[0] is not None:
            method, _, body = result
            got.append((body, method.exchange, method.routing_key))
        assert got == want, name


def test_exchange_declare_rules(amqp_gateway: AmqpGateway, pika_factory: PikaFactory) -> None:
    gw = amqp_gateway()
    conn = pika_factory(gw.amqp_port)
    channel = conn.channel()
    channel.exchange_declare("ex1", "topic")
    channel.exchange_declare("ex1", "topic")  # the same again: fine
    channel.exchange_declare("ex1", passive=True)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        channel.exchange_declare("ex1", "fanout")
    assert closed.value.reply_code == 406
    channel = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        channel.exchange_declare("missing", passive=True)
    assert closed.value.reply_code == 404
    channel = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        channel.exchange_declare("amq.custom", "topic")
    assert closed.value.reply_code == 403
    channel = conn.channel()
    channel.exchange_delete("ex1")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        channel.exchange_declare("ex1", passive=True)
    assert closed.value.reply_code == 404


def test_large_bodies_are_reassembled_and_split_again(amqp_gateway: AmqpGateway, pika_factory: PikaFactory,
                                                      paho_factory: PahoFactory) -> None:
    gw = amqp_gateway()
    device = paho_factory(gw.port, "dev-6")
    device.connect()
    device.subscribe("big/#", qos=1)
    channel = pika_factory(gw.amqp_port, frame_max=8192).channel()  # small frames both ways
    channel.confirm_delivery()
    queue = channel.queue_declare("", exclusive=True).method.queue
    channel.queue_bind(queue, "amq.topic", "big.#")
    body = bytes(range(256)) * 1200  # 300 KiB: dozens of body frames in, dozens out
    channel.basic_publish("amq.topic", "big.one", body, pika.BasicProperties(delivery_mode=2))
    assert device.get(5).payload == body
    method, _, got = channel.basic_get(queue, auto_ack=True)
    assert method is not None and got == body


def test_body_over_the_limit_closes_the_channel_406(amqp_gateway: AmqpGateway, pika_factory: PikaFactory) -> None:
    gw = amqp_gateway(env={"TIDEWIRE_AMQP_MAX_BODY": "1000"})
    conn = pika_factory(gw.amqp_port)
    channel = conn.channel()
    channel.confirm_delivery()
    channel.basic_publish("amq.topic", "small", b"x" * 1000)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        channel.basic_publish("amq.topic", "large", b"x" * 1001)
    assert closed.value.reply_code == 406
    conn.channel().basic_publish("amq.topic", "after", b"y")
    assert conn.is_open


def test_publishes_just_before_close_are_not_lost(amqp_gateway: AmqpGateway, pika_factory: PikaFactory,
                                                  paho_factory: PahoFactory) -> None:
    gw = amqp_gateway()
    device = paho_factory(gw.port, "dev-7")
    device.connect()
    device.subscribe("last/#", qos=1)
    for close_channel_first in (False, True):
        conn = pika_factory(gw.amqp_port)
        channel = conn.channel()
        for i in range(50):  # no confirms: the client closes at once, the gateway still handles these first
            channel.basic_publish("amq.topic", "last.words", b"%d" % i, pika.BasicProperties(delivery_mode=2))
        if close_channel_first:
            channel.close()
        conn.close()
        assert [r.payload for r in device.expect(50, timeout=5)] == [b"%d" % i for i in range(50)]
