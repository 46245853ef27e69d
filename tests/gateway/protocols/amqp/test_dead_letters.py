"""RabbitMQ's queue semantics with unmodified pika and AMQPStorm against the real gateway: dead-lettering
(rejected, expired, maxlen) with the x-death header, x-max-length drop-head and reject-publish, exact message
counts, and the consumer timeout closing the channel with 406. Expiry with no consumer attached also runs
in-process, on the node's clock moved by hand (the sweep is called; nothing sleeps)."""

from __future__ import annotations

import asyncio
import datetime
from typing import Any

import amqpstorm
import pika
import pika.exceptions
import pytest
from pamqp import commands
from pika.adapters.blocking_connection import BlockingChannel

from tests.gateway.fakeclock import FakeClock
from tests.gateway.protocols.amqp.conftest import AmqpGateway, PikaFactory
from tests.waiting import wait_until
from tidewire.gateway.core.ingress import publish_future
from tidewire.gateway.node import Node
from tidewire.gateway.protocols.amqp.arguments import QueueArgs
from tidewire.gateway.protocols.amqp.codec import Fault
from tidewire.gateway.protocols.amqp.mapping import DEATHS, queue_topic
from tidewire.gateway.protocols.amqp.queues import Queues, QueueSpec
from tidewire.store.base import Message
from tidewire.store.properties import Properties


def count(channel: BlockingChannel, queue: str) -> int:
    return int(channel.queue_declare(queue, passive=True).method.message_count)


def get(channel: BlockingChannel, queue: str) -> tuple[Any, pika.BasicProperties, bytes]:
    """The next message of `queue` (acked), waiting for it to arrive."""
    got: list[tuple[Any, pika.BasicProperties, bytes]] = []

    def arrived() -> bool:
        method, props, body = channel.basic_get(queue, auto_ack=True)
        if method is not None:
            got.append((method, props, body))
        return bool(got)

    wait_until(arrived, 5, what=f"a message in {queue}")
    return got[0]


def death(props: pika.BasicProperties, index: int = 0) -> dict[str, Any]:
    deaths = props.headers["x-death"]
    assert isinstance(deaths, list)
    entry = deaths[index]
    return {k: (v.decode() if isinstance(v, bytes) else v) for k, v in entry.items()}


@pytest.mark.slow  # starts its own gateway; the retry round trip waits for a 300 ms TTL
def test_rejected_then_expired_then_rejected_again_counts_in_x_death(amqp_gateway: AmqpGateway,
                                                                     pika_factory: PikaFactory) -> None:
    """The retry pattern of RabbitMQ users: a rejected message goes to a retry queue with no consumer, expires
    there back to the work queue, is rejected again: x-death counts each (queue, reason) and keeps the newest
    first; x-first-death-* stay as they were. Lost: none (every message is back in the work queue or the
    parking queue)."""
    gw = amqp_gateway()
    channel = pika_factory(gw.amqp_port).channel()
    channel.confirm_delivery()
    channel.queue_declare("work", durable=True, arguments={"x-dead-letter-exchange": "",
                                                           "x-dead-letter-routing-key": "retry"})
    channel.queue_declare("retry", durable=True, arguments={"x-message-ttl": 300, "x-dead-letter-exchange": "",
                                                            "x-dead-letter-routing-key": "work"})
    channel.basic_publish("", "work", b"job", pika.BasicProperties(delivery_mode=2, headers={"tenant": "a"}))
    for round_ in (1, 2):
        method = None

        def taken() -> bool:
            nonlocal method
            method, _, _ = channel.basic_get("work")
            return method is not None

        wait_until(taken, 5, what=f"the job back in 'work' (round {round_})")
        assert method is not None
        channel.basic_reject(method.delivery_tag, requeue=False)
        if round_ == 1:
            # In 'retry' (nobody consumes it) until its TTL passes: dead-lettered back by the node's sweep.
            assert count(channel, "retry") == 1
    wait_until(lambda: count(channel, "retry") == 1, 5)
    method, props, body = channel.basic_get("retry", auto_ack=True)  # before its TTL passes again (300 ms)
    assert method is not None and body == b"job"
    assert props.headers["tenant"] == "a"
    assert [(d["queue"], d["reason"], d["count"]) for d in (death(props, 0), death(props, 1))] == [
        ("work", "rejected", 2), ("retry", "expired", 1)]
    first = death(props, 0)
    # An entry counted again keeps where the message came from the first time (RabbitMQ raises count and time).
    assert first["exchange"] == "" and first["routing-keys"] == ["work"]
    assert isinstance(first["time"], datetime.datetime)
    assert props.headers["x-first-death-reason"] == "rejected"
    assert props.headers["x-first-death-queue"] == "work"
    assert count(channel, "work") == 0


@pytest.mark.slow  # starts its own gateway; the message's own expiration is 1 s (AMQP ms round up to MQTT s)
def test_expired_message_is_dead_lettered_with_no_consumer_amqpstorm(amqp_gateway: AmqpGateway) -> None:
    """AMQPStorm: a message past its own `expiration` in a queue nobody consumes lands in the dead-letter queue
    (fanout exchange 'dlx'), x-death reason expired with its original expiration; the one without expiration
    stays. Lost: none."""
    gw = amqp_gateway()
    conn = amqpstorm.Connection("127.0.0.1", "guest", "guest", port=gw.amqp_port, timeout=5)
    try:
        channel = conn.channel()
        channel.confirm_deliveries()
        channel.exchange.declare("dlx", "fanout", durable=True)
        channel.queue.declare("parked", durable=True)
        channel.queue.bind("parked", "dlx", "")
        channel.queue.declare("orders", durable=True, arguments={"x-dead-letter-exchange": "dlx"})
        channel.queue.bind("orders", "amq.topic", "orders.*")
        assert channel.basic.publish(b"short", "orders.eu", "amq.topic", {"expiration": "1000", "delivery_mode": 2})
        assert channel.basic.publish(b"kept", "orders.eu", "amq.topic", {"delivery_mode": 2})
        got: list[amqpstorm.Message] = []

        def parked() -> bool:
            message = channel.basic.get("parked", no_ack=True)
            if message is not None:
                got.append(message)
            return bool(got)

        wait_until(parked, 6, what="the expired message in 'parked'")
        message = got[0]
        assert message.body == "short"  # (AMQPStorm decodes bodies to str)
        assert message.properties.get("expiration") in (None, "")  # RabbitMQ drops it when dead-lettering
        deaths = message.properties["headers"]["x-death"]
        entry = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in deaths[0].items()}
        assert (entry["reason"], entry["queue"], entry["exchange"], entry["count"]) == (
            "expired", "orders", "amq.topic", 1)
        assert entry["routing-keys"] == ["orders.eu"]
        assert entry["original-expiration"] == "1000"
        kept = channel.basic.get("orders", no_ack=True)
        assert kept is not None and kept.body == "kept"
    finally:
        conn.close()


@pytest.mark.slow  # starts its own gateway
def test_an_ack_on_a_dead_lettering_queue_settles_without_a_dead_letter(amqp_gateway: AmqpGateway,
                                                                       pika_factory: PikaFactory) -> None:
    """Basic.Ack of deliveries from a queue with x-dead-letter-exchange settles them: no copy in the dead-letter
    queue (only a reject without requeue dead-letters). Of 3 acked (one by Get, two by a consumer), 0 copies."""
    gw = amqp_gateway()
    channel = pika_factory(gw.amqp_port).channel()
    channel.confirm_delivery()
    channel.queue_declare("parked-acks", durable=True)
    channel.queue_declare("orders-acked", durable=True, arguments={"x-dead-letter-exchange": "",
                                                                   "x-dead-letter-routing-key": "parked-acks"})
    for i in range(3):
        channel.basic_publish("", "orders-acked", b"%d" % i, pika.BasicProperties(delivery_mode=2))
    method, _, _ = channel.basic_get("orders-acked")
    channel.basic_ack(method.delivery_tag)
    acked: list[bytes] = []

    def on_message(ch: Any, m: Any, _props: Any, body: bytes) -> None:
        ch.basic_ack(m.delivery_tag)
        acked.append(body)

    channel.basic_consume("orders-acked", on_message)
    wait_until(lambda: channel.connection.process_data_events(time_limit=0.1) or len(acked) == 2, 5,
               what="two deliveries acked")
    assert count(channel, "orders-acked") == 0
    assert count(channel, "parked-acks") == 0  # dead-lettered copies of acked messages: none


@pytest.mark.slow  # starts its own gateway
def test_max_length_drops_from_the_head_and_counts_are_exact(amqp_gateway: AmqpGateway,
                                                             pika_factory: PikaFactory) -> None:
    """x-max-length 3 (drop-head): of 5 confirmed publishes the 2 oldest are dead-lettered (reason maxlen), the
    3 newest stay; Declare-Ok says 3 and each Get-Ok the count left; an unacked delivery is not counted.
    Dropped: exactly the surplus; lost: none."""
    gw = amqp_gateway()
    channel = pika_factory(gw.amqp_port).channel()
    channel.confirm_delivery()
    channel.queue_declare("overflowed", durable=True)
    channel.queue_declare("capped", durable=True, arguments={"x-max-length": 3, "x-dead-letter-exchange": "",
                                                             "x-dead-letter-routing-key": "overflowed"})
    for i in range(5):
        channel.basic_publish("", "capped", b"%d" % i, pika.BasicProperties(delivery_mode=2))
    assert count(channel, "capped") == 3
    assert count(channel, "overflowed") == 2
    method, props, body = channel.basic_get("overflowed", auto_ack=True)
    assert body == b"0" and death(props)["reason"] == "maxlen" and death(props)["queue"] == "capped"
    assert get(channel, "overflowed")[2] == b"1"
    method, _, body = channel.basic_get("capped")  # unacked: not counted, as in RabbitMQ
    assert (body, method.message_count) == (b"2", 2)
    assert count(channel, "capped") == 2
    method2, _, body2 = channel.basic_get("capped", auto_ack=True)
    assert (body2, method2.message_count) == (b"3", 1)
    channel.basic_nack(method.delivery_tag, requeue=True)  # back: ready again
    assert count(channel, "capped") == 2


@pytest.mark.slow  # starts its own gateway
def test_reject_publish_nacks_the_publish_over_the_limit(amqp_gateway: AmqpGateway,
                                                         pika_factory: PikaFactory) -> None:
    """x-overflow reject-publish: the third confirmed publish to a queue of x-max-length 2 gets Basic.Nack
    (pika raises NackError) and is not stored; once one is consumed there is room again. Refused: exactly 1."""
    gw = amqp_gateway()
    channel = pika_factory(gw.amqp_port).channel()
    channel.confirm_delivery()
    channel.queue_declare("bounded", durable=True, arguments={"x-max-length": 2, "x-overflow": "reject-publish"})
    channel.queue_bind("bounded", "amq.topic", "bounded.#")
    refused = 0
    for i in range(3):
        try:
            channel.basic_publish("amq.topic", "bounded.x", b"%d" % i, pika.BasicProperties(delivery_mode=2))
        except pika.exceptions.NackError:
            refused += 1
    assert refused == 1
    assert count(channel, "bounded") == 2
    assert channel.basic_get("bounded", auto_ack=True)[2] == b"0"
    channel.basic_publish("amq.topic", "bounded.x", b"3", pika.BasicProperties(delivery_mode=2))
    assert [channel.basic_get("bounded", auto_ack=True)[2] for _ in range(2)] == [b"1", b"3"]
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        channel.queue_declare("bounded", durable=True, arguments={"x-max-length": 5})
    assert closed.value.reply_code == 406  # inequivalent arg 'x-max-length'


@pytest.mark.slow  # starts its own gateway and publishes 1,500 messages
def test_message_count_is_exact_past_a_thousand(amqp_gateway: AmqpGateway, pika_factory: PikaFactory) -> None:
    """1,500 messages over two bindings: Declare-Ok counts each once, every one of them (the count was an
    estimate capped at 1,000 per binding, and counted unacked deliveries)."""
    gw = amqp_gateway()
    channel = pika_factory(gw.amqp_port).channel()
    channel.queue_declare("big", durable=True)
    channel.queue_bind("big", "amq.topic", "big.#")
    channel.queue_bind("big", "amq.topic", "big.*")  # the same messages again: counted once
    for i in range(1500):
        channel.basic_publish("amq.topic", "big.x", b"%d" % i)
    wait_until(lambda: count(channel, "big") == 1500, 10, what=lambda: f"1500 counted, got {count(channel, 'big')}")
    method, _, _ = channel.basic_get("big")
    assert method is not None and method.message_count == 1499
    assert count(channel, "big") == 1499  # the unacked delivery is not counted


@pytest.mark.slow  # starts its own gateway; the behaviour under test is a 1 s consumer timeout passing
def test_consumer_timeout_closes_the_channel_with_406_and_requeues(amqp_gateway: AmqpGateway,
                                                                   pika_factory: PikaFactory) -> None:
    """A delivery not acked within the queue's x-consumer-timeout closes its channel with 406
    PRECONDITION_FAILED, as RabbitMQ does (it was redelivered silently to the same channel); the message is
    back in the queue, redelivered. Lost: none; duplicated to the timed-out channel: none."""
    gw = amqp_gateway()
    conn = pika_factory(gw.amqp_port)
    channel = conn.channel()
    channel.queue_declare("slow", durable=True, arguments={"x-consumer-timeout": 1000})
    channel.basic_publish("", "slow", b"job", pika.BasicProperties(delivery_mode=2))
    seen: list[bytes] = []
    channel.basic_consume("slow", lambda _ch, _m, _p, body: seen.append(body))  # never acks
    conn.call_later(8, channel.stop_consuming)  # a bound on the wait: the close comes after about 1 s
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        channel.start_consuming()
    assert closed.value.reply_code == 406
    assert "delivery acknowledgement on channel" in closed.value.reply_text
    assert "1000 ms" in closed.value.reply_text
    assert seen == [b"job"]
    other = conn.channel()
    method, _, body = other.basic_get("slow", auto_ack=True)
    assert body == b"job" and method is not None and method.redelivered


# --- in-process, on the node's clock moved by hand ---------------------------------------------------------------

async def test_expiry_without_consumer_is_driven_by_the_sweep_on_the_node_clock(clocked_node: Node,
                                                                                clock: FakeClock) -> None:
    """A queue nobody consumes: its message expires (x-message-ttl 5 s) at the sweep after the TTL has passed
    on the node's clock, not before, and lands in the dead-letter queue with its x-death."""
    node = clocked_node
    queues = Queues(node)
    method = commands.Queue.Declare(queue="q")
    for name, args in (("q", QueueArgs(ttl_ms=5000, dlx="", dlrk="dead")), ("dead", QueueArgs())):
        declared = await queues.declare("/", QueueSpec(name, True, False, False, args), "conn-1", method)
        assert not isinstance(declared, Fault)
    await asyncio.gather(*publish_future(node.publish, [Message(queue_topic("q"), b"m", 1)]))
    clock.advance(4.9)
    await queues.sweep()
    dead = await node.groups.get("amqp///dead")
    assert dead is not None and await queues.message_count(dead) == 0
    clock.advance(0.2)
    await queues.sweep()
    assert await queues.message_count(dead) == 1
    got = await node.groups.receive("amqp///dead", 8, 30_000, 0)
    assert [d.message.payload for d in got] == [b"m"]
    user = dict(Properties.from_block(got[0].message.properties).user)
    assert '"reason":"expired"' in user[DEATHS] and '"queue":"q"' in user[DEATHS]
    assert user["x-first-death-queue"] == "q"


async def test_a_dead_letter_cycle_without_rejection_is_broken(clocked_node: Node, clock: FakeClock) -> None:
    """A queue whose expired messages are dead-lettered back to itself: the message comes back once (x-death
    expired, count 1), and when it expires there again it is dropped (counted), not sent round for ever."""
    node = clocked_node
    queues = Queues(node)
    args = QueueArgs(ttl_ms=5000, dlx="", dlrk="loop")
    declared = await queues.declare("/", QueueSpec("loop", True, False, False, args), "conn-1",
                                    commands.Queue.Declare(queue="loop"))
    assert not isinstance(declared, Fault)
    record, _ = declared
    await asyncio.gather(*publish_future(node.publish, [Message(queue_topic("loop"), b"m", 1)]))
    clock.advance(5.1)
    await queues.sweep()
    assert await queues.message_count(record) == 1  # back once, dead-lettered from 'loop'
    clock.advance(5.1)
    await queues.sweep()
    assert await queues.message_count(record) == 0
    assert node.counters.drops.get("expired") == 1


async def test_max_length_bytes_drops_the_oldest_bodies(clocked_node: Node) -> None:
    """x-max-length-bytes 10 with four 4-byte bodies: the sweep drops the two oldest (no dead-letter exchange:
    counted as queue_full), 8 bytes stay; the ready count is exact."""
    node = clocked_node
    queues = Queues(node)
    declared = await queues.declare("/", QueueSpec("bytes", True, False, False, QueueArgs(max_length_bytes=10)),
                                    "conn-1", commands.Queue.Declare(queue="bytes"))
    assert not isinstance(declared, Fault)
    record, _ = declared
    await asyncio.gather(*publish_future(node.publish, [Message(queue_topic("bytes"), b"m%03d" % i, 1)
                                                        for i in range(4)]))
    await queues.sweep()
    assert await queues.backlog.ready(record, with_bytes=True) == (2, 8)
    assert node.counters.drops.get("queue_full") == 2
    assert node.counters.messages_out == 0  # dropped, not delivered
    got = await node.groups.receive(record.name, 8, 30_000, 0)
    assert [d.message.payload for d in got] == [b"m002", b"m003"]
