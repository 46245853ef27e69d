"""AMQP queues across a 3-node cluster, as RabbitMQ behaves, with the unmodified clients (pika, aio-pika): an
unbound queue keeps its backlog; an exclusive queue is locked on every node and goes with its connection, even
when its node is killed; exclusive consumers, consumer counts and auto-delete count every node's consumers; a
mandatory publish is returned only when nothing anywhere would get it (an offline MQTT session would)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import aio_pika
import pika
import pika.exceptions
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from tests.cluster.conftest import ClusterFactory
from tests.gateway.protocols.amqp.conftest import PikaFactory, pika_factory  # noqa: F401 - a fixture
from tests.integration.conftest import PahoFactory
from tests.waiting import until, wait_until

pytestmark = pytest.mark.timeout(120)


def refused(action: Callable[[], object]) -> int:
    """The reply code of the Channel.Close that `action` ended with (0: it went through)."""
    try:
        action()
    except pika.exceptions.ChannelClosedByBroker as closed:
        return int(closed.reply_code)
    return 0


def confirmed(channel: BlockingChannel, key: str, bodies: list[str]) -> None:
    for body in bodies:
        channel.basic_publish("amq.topic", key, body.encode(), pika.BasicProperties(delivery_mode=2))


def drain(channel: BlockingChannel, queue: str) -> list[str]:
    """Basic.Get until Get-Empty."""
    got: list[str] = []
    while True:
        _, _, body = channel.basic_get(queue, auto_ack=True)
        if body is None:
            return got
        got.append(body.decode())


def test_an_unbound_queue_keeps_its_backlog_on_every_node(cluster: ClusterFactory, pika_factory: PikaFactory) -> None:  # noqa: F811
    n1, n2, n3 = cluster(3).nodes
    on1, on2, on3 = (pika_factory(n.amqp_port).channel() for n in (n1, n2, n3))
    on2.confirm_delivery()
    on1.queue_declare("backlog", durable=True)
    on1.queue_bind("backlog", "amq.topic", "bk.*")
    before = [f"b{i}" for i in range(50)]
    confirmed(on2, "bk.x", before)  # routed to the queue through another node
    on3.queue_unbind("backlog", "amq.topic", "bk.*")
    confirmed(on2, "bk.x", [f"after{i}" for i in range(10)])  # not routed: the binding is gone
    assert on1.queue_declare("backlog", passive=True).method.message_count == len(before)
    got = drain(on3, "backlog")
    lost, extra = set(before) - set(got), [b for b in got if b not in before]
    assert (len(lost), len(got) - len(set(got)), extra) == (0, 0, []), got
    assert got == before  # in order


def test_exclusive_queues_and_consumers_hold_on_every_node(cluster: ClusterFactory,
                                                           pika_factory: PikaFactory) -> None:  # noqa: F811
    n1, n2, n3 = cluster(3).nodes
    owner = pika_factory(n1.amqp_port)
    owner.channel().queue_declare("mine", exclusive=True)
    other = pika_factory(n2.amqp_port)
    codes = [refused(lambda: other.channel().queue_declare("mine", exclusive=True)),
             refused(lambda: other.channel().queue_declare("mine", passive=True)),
             refused(lambda: other.channel().basic_consume("mine", lambda *a: None))]
    assert codes == [405, 405, 405]

    # An exclusive consumer on n1 refuses consumers on n2 and n3 (403), and is refused where one consumes.
    setup = pika_factory(n3.amqp_port).channel()
    setup.queue_declare("solo", durable=True)
    setup.queue_declare("busy", durable=True)
    first = pika_factory(n1.amqp_port).channel()
    first.basic_consume("solo", lambda *a: None, exclusive=True)
    first.basic_consume("busy", lambda *a: None)

    def consume(port: int, queue: str, exclusive: bool) -> int:
        return refused(lambda: pika_factory(port).channel().basic_consume(queue, lambda *a: None,
                                                                          exclusive=exclusive))

    codes = [consume(n.amqp_port, "solo", exclusive) for n in (n2, n3) for exclusive in (False, True)]
    codes.append(consume(n2.amqp_port, "busy", True))
    assert codes == [403] * 5
    first.close()  # its consumers go: the queue can be consumed exclusively elsewhere
    assert consume(n2.amqp_port, "solo", True) == 0
    owner.close()  # the exclusive queue goes with its connection
    wait_until(lambda: refused(lambda: other.channel().queue_declare("mine", passive=True)) == 404, 5.0,
               "the exclusive queue deleted with its connection")
    assert refused(lambda: other.channel().queue_declare("mine", exclusive=True)) == 0


async def test_consumer_counts_and_auto_delete_count_every_node(cluster: ClusterFactory) -> None:
    n1, n2, n3 = cluster(3).nodes
    conns = [await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{n.amqp_port}/", timeout=10) for n in (n1, n2, n3)]
    try:
        c1, c2, c3 = [await conn.channel() for conn in conns]
        auto = await c1.declare_queue("auto", auto_delete=True)
        tags = [await auto.consume(_ignore), await auto.consume(_ignore)]
        on2 = await c2.get_queue("auto")
        tag2 = await on2.consume(_ignore)
        counted = await c3.declare_queue("auto", passive=True)
        assert counted.declaration_result.consumer_count == 3
        for tag in tags:
            await auto.cancel(tag)  # n1's consumers go: n2 still consumes, the queue stays
        assert (await c3.declare_queue("auto", passive=True)).declaration_result.consumer_count == 1
        await on2.cancel(tag2)  # the last consumer anywhere: the queue goes

        async def gone() -> bool:
            probe = await conns[2].channel()
            try:
                await probe.declare_queue("auto", passive=True)
            except aio_pika.exceptions.ChannelNotFoundEntity:
                return True
            return False

        await until(gone, 5.0, "the auto-delete queue deleted after its last consumer")
    finally:
        for conn in conns:
            await conn.close()


async def _ignore(message: Any) -> None:
    await message.ack()


def test_a_killed_node_frees_its_exclusive_queues_and_consumers(cluster: ClusterFactory,
                                                                pika_factory: PikaFactory) -> None:  # noqa: F811
    c = cluster(3)
    n1, n2, n3 = c.nodes
    on1 = pika_factory(n1.amqp_port).channel()
    on1.queue_declare("held", exclusive=True)
    pika_factory(n3.amqp_port).channel().queue_declare("work", durable=True)
    on1.queue_declare("temp", auto_delete=True)
    on1.basic_consume("work", lambda *a: None, exclusive=True)
    on1.basic_consume("temp", lambda *a: None)
    on2 = pika_factory(n2.amqp_port)
    assert refused(lambda: on2.channel().queue_declare("held", passive=True)) == 405
    c.kill9(n1)
    c.wait_gone("n1")

    def freed() -> bool:
        return refused(lambda: on2.channel().queue_declare("held", passive=True)) == 404

    wait_until(freed, 10.0, "the killed node's exclusive queue deleted")
    assert refused(lambda: on2.channel().queue_declare("temp", passive=True)) == 404  # its last consumer died
    assert on2.channel().queue_declare("work", passive=True).method.consumer_count == 0
    assert refused(lambda: on2.channel().basic_consume("work", lambda *a: None, exclusive=True)) == 0
    assert refused(lambda: on2.channel().queue_declare("held", exclusive=True)) == 0


def test_mandatory_counts_an_offline_session_of_another_node(cluster: ClusterFactory, pika_factory: PikaFactory,  # noqa: F811
                                                             paho_factory: PahoFactory) -> None:
    c = cluster(3)
    n1, n2, n3 = c.nodes
    away = paho_factory(n1.port, "away-1", clean=False)
    away.connect(session_expiry=3600)
    away.subscribe("away/dev/cmd", 1)
    away.disconnect()  # only this offline persistent session subscribes
    c.kill9(n1)  # and the node it was on is gone: no node's lookup names a reader of its topic any more
    c.wait_gone("n1")
    channel = pika_factory(n3.amqp_port).channel()
    channel.confirm_delivery()
    returned = 0
    for i in range(20):
        try:
            channel.basic_publish("amq.topic", "away.dev.cmd", f"m{i}".encode(), pika.BasicProperties(delivery_mode=2),
                                  mandatory=True)
        except pika.exceptions.UnroutableError:
            returned += 1
    with pytest.raises(pika.exceptions.UnroutableError):  # nobody anywhere: still returned
        channel.basic_publish("amq.topic", "nobody.anywhere", b"x", mandatory=True)
    assert returned == 0
    back = paho_factory(n2.port, "away-1", clean=False)
    assert back.connect(session_expiry=3600).session_present  # back, on another node: everything waited for it
    assert [m.payload for m in back.expect(20, 10)] == [f"m{i}".encode() for i in range(20)]


async def test_bindings_changed_through_one_node_hold_for_a_consumer_on_another(cluster: ClusterFactory) -> None:
    n1, n2, n3 = cluster(3).nodes
    conns = [await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{n.amqp_port}/", timeout=10) for n in (n1, n2, n3)]
    try:
        c1, c2, c3 = [await conn.channel() for conn in conns]
        queue = await c1.declare_queue("live", durable=True)
        await queue.bind("amq.topic", "lv.a")
        got: list[str] = []

        async def take(message: Any) -> None:
            got.append(message.body.decode())
            await message.ack()

        await queue.consume(take)  # on n1
        exchange = await c3.get_exchange("amq.topic")
        await (await c2.get_queue("live")).bind("amq.topic", "lv.b")  # through n2
        await exchange.publish(aio_pika.Message(b"new-binding"), routing_key="lv.b")
        await exchange.publish(aio_pika.Message(b"old-binding"), routing_key="lv.a")
        await until(lambda: "old-binding" in got, 10.0, "the n1 consumer reading the old binding")
        await until(lambda: "new-binding" in got, 3.0, "what the binding made on n2 routed, not skipped")
        await (await c2.get_queue("live")).unbind("amq.topic", "lv.a")
        await exchange.publish(aio_pika.Message(b"unbound"), routing_key="lv.a")
        await exchange.publish(aio_pika.Message(b"still-bound"), routing_key="lv.b")
        await until(lambda: "still-bound" in got, 10.0, "the n1 consumer reading the binding left")
        assert got == ["new-binding", "old-binding", "still-bound"]  # nothing lost, nothing after its unbind
    finally:
        for conn in conns:
            await conn.close()


async def test_racing_exclusive_declares_on_two_nodes_give_the_queue_one_owner(cluster: ClusterFactory) -> None:
    n1, n2, _ = cluster(3).nodes
    a, b = [await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{n.amqp_port}/", timeout=10) for n in (n1, n2)]
    try:
        owners = []
        for i in range(40):
            on_a, on_b = await a.channel(), await b.channel()
            results = await asyncio.gather(on_a.declare_queue(f"race{i}", exclusive=True),
                                           on_b.declare_queue(f"race{i}", exclusive=True), return_exceptions=True)
            owners.append(sum(not isinstance(r, BaseException) for r in results))
        assert owners == [1] * 40  # never both (each would think it owns the queue), never neither
    finally:
        await a.close()
        await b.close()
