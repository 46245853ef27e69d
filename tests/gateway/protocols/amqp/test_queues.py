"""AMQP queue semantics against the real gateway: server-named, exclusive, auto-delete, x-expires,
x-message-ttl, bind/unbind, purge, delete conditions, and the reply codes of the refusals; x-expires and
x-message-ttl also in-process, on the node's clock moved by hand (no sleep)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import cast

import pika
import pika.exceptions
import pytest
from pamqp import commands
from pika.adapters.blocking_connection import BlockingChannel

from tests.gateway.fakeclock import FakeClock
from tests.gateway.protocols.amqp.conftest import AmqpGateway, PikaFactory
from tests.gateway.protocols.amqp.helpers import collector, settle_for
from tests.store.failing import FailingStore
from tests.waiting import until, wait_until
from tidewire.extensions.hooks import AllowAll
from tidewire.gateway.config import Settings
from tidewire.gateway.core.ingress import publish_future
from tidewire.gateway.node import Node
from tidewire.gateway.protocols.amqp.arguments import QueueArgs
from tidewire.gateway.protocols.amqp.codec import Fault
from tidewire.gateway.protocols.amqp.mapping import queue_topic
from tidewire.gateway.protocols.amqp.queues import Queues, QueueSpec, group_name
from tidewire.lookup.base import InProcessLookup
from tidewire.notify.base import LocalNotifier
from tidewire.store.base import Message, Store
from tidewire.store.embedded.engine import EmbeddedStore


def closed_with(code: int, action: object) -> None:
    assert callable(action)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        action()
    assert closed.value.reply_code == code, closed.value


def publish(channel: BlockingChannel, key: str, body: bytes, **props: str) -> None:
    channel.basic_publish("amq.topic", key, body, pika.BasicProperties(delivery_mode=2, **props))


def test_server_named_queue_bind_unbind(amqp_gateway: AmqpGateway, pika_factory: PikaFactory) -> None:
    gw = amqp_gateway()
    channel = pika_factory(gw.amqp_port).channel()
    channel.confirm_delivery()
    queue = channel.queue_declare("", exclusive=True).method.queue
    assert queue.startswith("amq.gen-")
    channel.queue_bind(queue, "amq.topic", "a.*.c")
    publish(channel, "a.b.c", b"1")
    publish(channel, "a.b.d", b"2")
    assert channel.basic_get(queue, auto_ack=True)[2] == b"1"
    publish(channel, "a.b.c", b"3")
    publish(channel, "a.x.c", b"4")
    # As RabbitMQ: what the binding routed before the unbind stays in the queue (its backlog), what is
    # published after it is not routed there
    channel.queue_unbind(queue, "amq.topic", "a.*.c")
    publish(channel, "a.b.c", b"5")
    assert channel.queue_declare(queue, passive=True).method.message_count == 2
    assert [channel.basic_get(queue, auto_ack=True)[2] for _ in range(3)] == [b"3", b"4", None]
    channel.queue_bind(queue, "amq.topic", "a.*.c")  # bound again: from now on, as a new binding
    publish(channel, "a.y.c", b"6")
    assert [channel.basic_get(queue, auto_ack=True)[2] for _ in range(2)] == [b"6", None]


def test_declare_refusals(amqp_gateway: AmqpGateway, pika_factory: PikaFactory) -> None:
    gw = amqp_gateway()
    conn = pika_factory(gw.amqp_port)
    closed_with(404, lambda: conn.channel().queue_declare("missing", passive=True))
    channel = conn.channel()
    channel.queue_declare("durable-q", durable=True)
    closed_with(406, lambda: channel.queue_declare("durable-q", durable=False))
    closed_with(403, lambda: conn.channel().queue_declare("amq.mine"))
    closed_with(404, lambda: conn.channel().queue_bind("durable-q", "no-such-exchange", "k"))
    closed_with(404, lambda: conn.channel().queue_bind("no-such-queue", "amq.topic", "k"))
    closed_with(406, lambda: conn.channel().queue_bind("durable-q", "amq.topic", "#.tail"))  # not an MQTT filter
    closed_with(406, lambda: conn.channel().queue_declare("q-bad-ttl", arguments={"x-message-ttl": -1}))
    assert conn.is_open


def test_exclusive_queue_is_locked_and_goes_with_its_connection(amqp_gateway: AmqpGateway,
                                                                pika_factory: PikaFactory) -> None:
    gw = amqp_gateway()
    owner = pika_factory(gw.amqp_port)
    owner.channel().queue_declare("mine", exclusive=True, durable=True)
    other = pika_factory(gw.amqp_port)
    closed_with(405, lambda: other.channel().queue_declare("mine", exclusive=True, durable=True))
    closed_with(405, lambda: other.channel().basic_get("mine"))
    owner.close()

    def gone() -> bool:
        try:
            other.channel().queue_declare("mine", passive=True)
        except pika.exceptions.ChannelClosedByBroker as exc:
            assert exc.reply_code == 404
            return True
        return False

    wait_until(gone, timeout=3, what="the exclusive queue gone with its connection", interval=0.05)


def test_auto_delete_queue_goes_with_its_last_consumer(amqp_gateway: AmqpGateway, pika_factory: PikaFactory) -> None:
    gw = amqp_gateway()
    conn = pika_factory(gw.amqp_port)
    channel = conn.channel()
    channel.queue_declare("transient", auto_delete=True)
    first = channel.basic_consume("transient", collector([]))
    second = channel.basic_consume("transient", collector([]))
    channel.basic_cancel(first)
    assert channel.queue_declare("transient", passive=True).method.consumer_count == 1
    channel.basic_cancel(second)
    closed_with(404, lambda: channel.queue_declare("transient", passive=True))


def test_exclusive_consumer_and_delete_conditions(amqp_gateway: AmqpGateway, pika_factory: PikaFactory) -> None:
    gw = amqp_gateway()
    conn = pika_factory(gw.amqp_port)
    channel = conn.channel()
    channel.confirm_delivery()
    channel.queue_declare("shared", durable=True)
    channel.queue_bind("shared", "amq.topic", "s")
    channel.basic_consume("shared", collector([], ack=False), exclusive=True)
    closed_with(403, lambda: conn.channel().basic_consume("shared", collector([])))
    closed_with(406, lambda: conn.channel().queue_delete("shared", if_unused=True))
    channel.close()
    channel = conn.channel()
    channel.confirm_delivery()
    publish(channel, "s", b"x")
    closed_with(406, lambda: channel.queue_delete("shared", if_empty=True))
    channel = conn.channel()
    assert channel.queue_delete("shared").method.message_count == 1
    channel.queue_delete("shared")  # gone already: still Delete-Ok


def test_purge_drops_what_is_ready(amqp_gateway: AmqpGateway, pika_factory: PikaFactory) -> None:
    gw = amqp_gateway()
    channel = pika_factory(gw.amqp_port).channel()
    channel.confirm_delivery()
    channel.queue_declare("purged", durable=True)
    channel.queue_bind("purged", "amq.topic", "p.#")
    for i in range(10):
        publish(channel, "p.x", b"%d" % i)
    method, _, _ = channel.basic_get("purged")  # one unacked: purge leaves it
    assert method is not None
    channel.basic_nack(method.delivery_tag, requeue=True)  # ...and one requeued: purge drops it
    assert channel.queue_purge("purged").method.message_count == 10
    assert channel.basic_get("purged") == (None, None, None)
    publish(channel, "p.y", b"after")
    assert channel.basic_get("purged", auto_ack=True)[2] == b"after"


def test_message_ttl_skips_old_messages(amqp_gateway: AmqpGateway, pika_factory: PikaFactory) -> None:
    gw = amqp_gateway()
    channel = pika_factory(gw.amqp_port).channel()
    channel.confirm_delivery()
    channel.queue_declare("ttl", durable=True, arguments={"x-message-ttl": 300})
    channel.queue_bind("ttl", "amq.topic", "ttl")
    publish(channel, "ttl", b"old")
    time.sleep(0.5)  # the behaviour under test: "old" outlives the queue's 300 ms TTL
    publish(channel, "ttl", b"fresh")
    assert channel.basic_get("ttl", auto_ack=True)[2] == b"fresh"
    assert channel.basic_get("ttl") == (None, None, None)
    publish(channel, "ttl", b"expiring", expiration="200")  # per-message expiration as well
    time.sleep(0.4)  # the behaviour under test: past the message's 200 ms expiration
    assert channel.basic_get("ttl") == (None, None, None)


@pytest.mark.slow  # seconds long: `make test-slow` keeps `make test` under its 10 minutes
def test_x_expires_deletes_an_unused_queue(amqp_gateway: AmqpGateway, pika_factory: PikaFactory) -> None:
    gw = amqp_gateway()
    conn = pika_factory(gw.amqp_port)
    channel = conn.channel()
    channel.queue_declare("short-lived", arguments={"x-expires": 600})
    channel.queue_declare("kept-alive", arguments={"x-expires": 600})
    got: list[tuple[int, bytes, bool]] = []
    channel.basic_consume("kept-alive", collector(got))
    # The behaviour under test is time passing: 600 ms unused plus the node's 0.5 s expiry rounds. It cannot be
    # polled for: asking about a queue uses it, which starts its clock again.
    settle_for(conn, 1.8)
    closed_with(404, lambda: conn.channel().queue_declare("short-lived", passive=True))
    assert conn.channel().queue_declare("kept-alive", passive=True).method.consumer_count == 1


# --- in-process, on the node's clock moved by hand ---------------------------------------------------------------

def _spec(name: str, expires_ms: int | None = None, ttl_ms: int | None = None) -> QueueSpec:
    return QueueSpec(name, durable=True, exclusive=False, auto_delete=False,
                     args=QueueArgs(expires_ms=expires_ms, ttl_ms=ttl_ms))


async def test_x_expires_counts_on_the_node_clock(clocked_node: Node, clock: FakeClock) -> None:
    """An unused x-expires queue goes once its time has passed on the node's clock, not a moment before."""
    queues = Queues(clocked_node)
    method = commands.Queue.Declare(queue="idle")
    declared = await queues.declare("/", _spec("idle", expires_ms=10_000), "conn-1", method)
    assert not isinstance(declared, Fault)
    clock.advance(9.5)
    await queues.expire_due()
    assert await clocked_node.store.get_group(group_name("/", "idle")) is not None
    queues.touch(group_name("/", "idle"))  # used: its time starts again
    clock.advance(9.5)
    await queues.expire_due()
    assert await clocked_node.store.get_group(group_name("/", "idle")) is not None
    clock.advance(0.5)
    await queues.expire_due()
    assert await clocked_node.store.get_group(group_name("/", "idle")) is None


async def test_x_message_ttl_counts_on_the_node_clock(clocked_node: Node, clock: FakeClock) -> None:
    """A message older than the queue's x-message-ttl on the node's clock is passed over; a younger one is not."""
    node = clocked_node
    queues = Queues(node)
    declared = await queues.declare("/", _spec("fresh", ttl_ms=5_000), "conn-1", commands.Queue.Declare(queue="fresh"))
    assert not isinstance(declared, Fault)
    record, _ = declared
    await asyncio.gather(*publish_future(node.publish, [Message(queue_topic("fresh"), b"old", 1)]))
    clock.advance(3)
    await asyncio.gather(*publish_future(node.publish, [Message(queue_topic("fresh"), b"new", 1)]))
    clock.advance(2.5)  # "old" is 5.5 s old, "new" 2.5 s
    got = await node.groups.receive(record.name, 8, 30_000, 0)
    assert [d.message.payload for d in got] == [b"new"]


async def test_a_consumer_that_stops_while_the_store_fails_leaves_once_it_is_back(tmp_path: Path) -> None:
    """The member of an exclusive consumer left registered would lock the queue for good: its leave is retried
    until the store takes it, and an auto-delete queue then goes."""
    settings = Settings(data_dir=tmp_path, port=0, sys_events=False, node_id="n1")
    inner = EmbeddedStore(tmp_path, fsync="never")
    await inner.open()
    store = FailingStore(inner)
    lookup = InProcessLookup()
    node = Node(settings, cast(Store, store), lookup, LocalNotifier(lookup), AllowAll())
    await node.start()
    try:
        queues = Queues(node)
        method = commands.Queue.Declare(queue="temp")
        spec = QueueSpec("temp", durable=False, exclusive=False, auto_delete=True)
        assert not isinstance(await queues.declare("/", spec, "conn-1", method), Fault)
        name = group_name("/", "temp")
        assert await queues.join(name, "conn-1/1/ctag", exclusive=True)
        assert not await queues.join(name, "conn-2/1/ctag", exclusive=False)  # locked by the exclusive one
        store.fail("leave_group")
        await queues.leave(name, "conn-1/1/ctag")  # returns at once: the channel closes meanwhile
        assert await inner.group_members(name) == 1 and store.failures["leave_group"] == 1
        store.heal()
        await until(lambda: _gone(inner, name), 5.0, "the leave retried and the auto-delete queue deleted")
    finally:
        await node.stop()
        await inner.close()


async def _gone(store: EmbeddedStore, name: str) -> bool:
    return await store.group_members(name) == 0 and await store.get_group(name) is None
