"""Headers exchanges, alternate exchanges and exchange-to-exchange bindings against a running gateway, with
the unmodified clients (pika, aio-pika, AMQPStorm): what each queue gets is counted, message by message, so a
message lost, delivered twice to one queue or routed where it should not be fails the test."""

from __future__ import annotations

import decimal
from collections.abc import Iterator

import aio_pika
import amqpstorm
import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from tests.gateway.protocols.amqp.conftest import AmqpGateway, PikaFactory
from tests.waiting import wait_until

pytestmark = pytest.mark.slow  # each starts a gateway: `make test-slow`


def _drain(channel: BlockingChannel, queue: str) -> list[tuple[bytes, dict[str, object] | None]]:
    """Everything ready in `queue` (Basic.Get until empty), acked: (body, headers)."""
    got: list[tuple[bytes, dict[str, object] | None]] = []
    while True:
        method, props, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            return got
        got.append((body, props.headers))


def _get_until(channel: BlockingChannel, queue: str, count: int, timeout: float = 10.0) -> list[bytes]:
    got: list[bytes] = []

    def enough() -> bool:
        got.extend(body for body, _ in _drain(channel, queue))
        return len(got) >= count

    wait_until(enough, timeout, what=lambda: f"{count} messages in {queue} (got {len(got)})")
    return got


def test_headers_exchange_routes_by_typed_headers(amqp_gateway: AmqpGateway, pika_factory: PikaFactory) -> None:
    gw = amqp_gateway()
    channel = pika_factory(gw.amqp_port).channel()
    channel.confirm_delivery()
    channel.exchange_declare("hdr", exchange_type="headers")
    patterns = {"all-int": {"x-match": "all", "kind": "temp", "n": 5},
                "any-int": {"x-match": "any", "kind": "temp", "n": 5},
                "all-str": {"n": "5"},  # x-match defaults to all
                "present": {"x-match": "all", "flag": None},  # void: the header need only be there
                "with-x": {"x-match": "any-with-x", "x-tenant": "a"}}
    for queue, pattern in patterns.items():
        channel.queue_declare(queue)
        channel.queue_bind(queue, "hdr", arguments=pattern)
    sent = {b"int": {"kind": "temp", "n": 5}, b"str": {"kind": "temp", "n": "5"},
            b"decimal": {"kind": "temp", "n": decimal.Decimal(5)},  # a decimal 5 is no int 5 either
            b"flag": {"n": 6, "flag": False}, b"tenant": {"x-tenant": "a"}}
    for body, headers in sent.items():
        channel.basic_publish("hdr", "ignored.key", body, pika.BasicProperties(headers=headers))
    expected = {"all-int": [b"int"], "any-int": [b"int", b"str", b"decimal"], "all-str": [b"str"],
                "present": [b"flag"], "with-x": [b"tenant"]}
    for queue, bodies in expected.items():
        got = _get_until(channel, queue, len(bodies))
        assert sorted(got) == sorted(bodies), queue
    # the headers come back with their types: an int stays an int, a bool a bool
    channel.basic_publish("hdr", "", b"typed", pika.BasicProperties(headers={"kind": "temp", "n": 5, "ok": True}))
    typed: list[tuple[bytes, dict[str, object] | None]] = []
    wait_until(lambda: bool(typed.extend(_drain(channel, "all-int")) or typed), 10, what="the typed message")
    assert typed == [(b"typed", {"kind": "temp", "n": 5, "ok": True})]
    _get_until(channel, "any-int", 1)  # (it matches there too)
    # nothing matches: a mandatory publish comes back (pika raises UnroutableError), and nothing was queued
    with pytest.raises(pika.exceptions.UnroutableError):
        channel.basic_publish("hdr", "", b"none", pika.BasicProperties(headers={"n": 7}), mandatory=True)
    assert all(_drain(channel, queue) == [] for queue in patterns)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        channel.queue_bind("all-int", "hdr", arguments={"x-match": "some"})
    assert refused.value.reply_code == 406



async def test_unroutable_messages_go_to_the_alternate_exchange(amqp_gateway: AmqpGateway) -> None:
    gw = amqp_gateway()
    conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{gw.amqp_port}/", timeout=10)
    async with conn:
        channel = await conn.channel(publisher_confirms=True, on_return_raises=True)
        lost = await channel.declare_exchange("lost", aio_pika.ExchangeType.FANOUT)
        lost_q = await channel.declare_queue("lost-q")
        await lost_q.bind(lost)
        orders = await channel.declare_exchange("orders", aio_pika.ExchangeType.DIRECT,
                                                arguments={"alternate-exchange": "lost"})
        orders_q = await channel.declare_queue("orders-q")
        await orders_q.bind(orders, "new")
        for i in range(10):
            # mandatory (aio-pika's default): an unroutable one that the alternate takes is not returned
            await orders.publish(aio_pika.Message(b"o%d" % i), routing_key="new" if i % 2 else "unknown")
        # alternates chained in a cycle that routes nowhere: the publish ends, and comes back as unroutable
        a = await channel.declare_exchange("ring-a", aio_pika.ExchangeType.DIRECT,
                                           arguments={"alternate-exchange": "ring-b"})
        await channel.declare_exchange("ring-b", aio_pika.ExchangeType.DIRECT,
                                       arguments={"alternate-exchange": "ring-a"})
        with pytest.raises(aio_pika.exceptions.DeliveryError):
            await a.publish(aio_pika.Message(b"ring"), routing_key="k")

        async def bodies(queue: aio_pika.abc.AbstractQueue) -> list[bytes]:
            got: list[bytes] = []
            while (message := await queue.get(no_ack=True, fail=False)) is not None:
                got.append(message.body)
            return got

        assert sorted(await bodies(orders_q)) == [b"o%d" % i for i in (1, 3, 5, 7, 9)]
        assert sorted(await bodies(lost_q)) == [b"o%d" % i for i in (0, 2, 4, 6, 8)]
        with pytest.raises(aio_pika.exceptions.ChannelPreconditionFailed):  # 406: inequivalent alternate
            await channel.declare_exchange("orders", aio_pika.ExchangeType.DIRECT,
                                           arguments={"alternate-exchange": "other"})


@pytest.fixture
def storm() -> Iterator[list[amqpstorm.Connection]]:
    made: list[amqpstorm.Connection] = []
    yield made
    for conn in made:
        if conn.is_open:
            conn.close()


def test_exchange_bindings_deliver_once_through_a_chain_and_a_cycle(amqp_gateway: AmqpGateway,
                                                                    storm: list[amqpstorm.Connection]) -> None:
    gw = amqp_gateway()
    conn = amqpstorm.Connection("127.0.0.1", "guest", "guest", port=gw.amqp_port, timeout=5)
    storm.append(conn)
    channel = conn.channel()
    channel.confirm_deliveries()
    channel.exchange.declare("front", "topic")
    channel.exchange.declare("middle", "direct")
    channel.exchange.declare("back", "fanout")
    channel.exchange.bind("middle", "front", "eu.*")  # destination, source, key
    channel.exchange.bind("back", "middle", "eu.fr")
    channel.exchange.bind("front", "back", "")  # back → front closes a cycle
    channel.queue.declare("everything")
    channel.queue.bind("everything", "front", "#")  # reached straight from front, and around the cycle
    channel.queue.declare("french")
    channel.queue.bind("french", "back")
    keys = ["eu.fr", "eu.de", "us.ny"] * 10
    for i, key in enumerate(keys):
        assert channel.basic.publish(b"%d" % i, key, exchange="front") is True

    def drain(queue: str, count: int) -> list[bytes]:
        got: list[bytes] = []

        def enough() -> bool:
            while (message := channel.basic.get(queue, no_ack=True, auto_decode=False)) is not None:
                got.append(message.body)
            return len(got) >= count

        wait_until(enough, 10, what=lambda: f"{count} in {queue} (got {len(got)})")
        return got

    everything = drain("everything", len(keys))
    french = drain("french", 10)
    assert sorted(everything) == sorted(b"%d" % i for i in range(len(keys)))  # each once, cycle or not
    assert sorted(french) == sorted(b"%d" % i for i, k in enumerate(keys) if k == "eu.fr")
    assert channel.basic.get("everything", no_ack=True) is None and channel.basic.get("french", no_ack=True) is None
    # delivered with the exchange and routing key they were published with
    assert channel.basic.publish(b"origin", "eu.fr", exchange="front") is True
    seen: list[amqpstorm.Message] = []

    def got_origin() -> bool:
        message = channel.basic.get("french", no_ack=True, auto_decode=False)
        if message is not None:
            seen.append(message)
        return bool(seen)

    wait_until(got_origin, 10, what="the origin message")
    assert (seen[0].method["exchange"], seen[0].method["routing_key"]) == ("front", "eu.fr")
    # unbinding the chain: french gets nothing more; deleting middle drops its bindings both ways
    channel.exchange.unbind("middle", "front", "eu.*")
    assert channel.basic.publish(b"after", "eu.fr", exchange="front") is True
    drain("everything", 1)
    assert channel.basic.get("french", no_ack=True, auto_decode=False) is None
    channel.exchange.delete("middle")
    channel.exchange.declare("middle", "direct")
    channel.exchange.bind("middle", "front", "eu.*")
    assert channel.basic.publish(b"again", "eu.fr", exchange="front") is True
    drain("everything", 1)
    assert channel.basic.get("french", no_ack=True, auto_decode=False) is None  # middle → back went with the old middle
