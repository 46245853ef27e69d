"""The backend protocols across a 3-node cluster, with the unmodified clients: AMQP consumers on two nodes
compete for one queue (nothing twice, nothing lost), a node dying with unacked deliveries hands them to the
other node's consumer, confirmed publishes survive `kill -9` of the node that confirmed them, and one device
publish reaches an AMQP queue and a RocketMQ consumer group on other nodes, once each."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aio_pika
import pytest

from tests.cluster.conftest import ClusterFactory
from tests.gateway.protocols.rocketmq.conftest import Clients, wait_port
from tests.integration.conftest import PahoFactory
from tests.waiting import until

pytestmark = pytest.mark.timeout(120)


async def _connect(port: int) -> Any:
    return await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{port}/", timeout=10)


async def _declare_work_queue(port: int, name: str, key: str) -> None:
    conn = await _connect(port)
    async with conn:
        channel = await conn.channel()
        queue = await channel.declare_queue(name, durable=True)
        await queue.bind("amq.topic", routing_key=key)


async def _publish_confirmed(port: int, count: int, key_prefix: str) -> None:
    conn = await _connect(port)
    async with conn:
        channel = await conn.channel(publisher_confirms=True)
        exchange = await channel.get_exchange("amq.topic")
        await asyncio.gather(*(exchange.publish(aio_pika.Message(f"m{i}".encode(), delivery_mode=2),
                                                routing_key=f"{key_prefix}.{i}") for i in range(count)))


class _Collector:
    """An aio-pika consumer that records bodies; acks after `ack_delay` (or never when None)."""

    def __init__(self, ack_delay: float | None) -> None:
        self.ack_delay = ack_delay
        self.bodies: list[str] = []
        self.redelivered = 0

    async def on_message(self, message: Any) -> None:
        self.bodies.append(message.body.decode())
        self.redelivered += int(message.redelivered)
        if self.ack_delay is not None:
            await asyncio.sleep(self.ack_delay)  # a consumer that works a while on each message
            await message.ack()


async def _consume(port: int, queue_name: str, collector: _Collector, prefetch: int) -> Any:
    conn = await _connect(port)
    channel = await conn.channel()
    await channel.set_qos(prefetch_count=prefetch)
    queue = await channel.get_queue(queue_name)
    await queue.consume(collector.on_message)
    return conn


async def test_competing_consumers_on_two_nodes_share_a_queue(cluster: ClusterFactory) -> None:
    c = cluster(3)
    n1, n2, n3 = c.nodes
    await _declare_work_queue(n1.amqp_port, "work", "jobs.#")
    a, b = _Collector(0.002), _Collector(0.002)
    conns = [await _consume(n1.amqp_port, "work", a, 5), await _consume(n2.amqp_port, "work", b, 5)]
    try:
        await _publish_confirmed(n3.amqp_port, 300, "jobs")
        await until(lambda: len(a.bodies) + len(b.bodies) >= 300, 30,
                     lambda: f"300 deliveries (got {len(a.bodies)} + {len(b.bodies)})\n{c.logs()}")
        await asyncio.sleep(0.5)  # absence: anything delivered twice would show up now (no event to wait on)
    finally:
        for conn in conns:
            await conn.close()
    everything = a.bodies + b.bodies
    assert sorted(everything) == sorted(f"m{i}" for i in range(300)), c.logs()
    assert a.bodies and b.bodies, (len(a.bodies), len(b.bodies))


async def test_unacked_deliveries_of_a_dead_node_go_to_the_survivor(cluster: ClusterFactory) -> None:
    c = cluster(3)
    n1, n2, n3 = c.nodes
    await _declare_work_queue(n3.amqp_port, "held", "held.#")
    await _publish_confirmed(n3.amqp_port, 40, "held")
    holder = _Collector(None)  # never acks
    conn1 = await _consume(n1.amqp_port, "held", holder, 100)
    await until(lambda: len(holder.bodies) == 40, 15, "the first consumer holds all 40")
    c.kill9(n1)
    survivor = _Collector(0)
    conn2 = await _consume(n2.amqp_port, "held", survivor, 100)
    try:
        await until(lambda: len(survivor.bodies) >= 40, 20, "the survivor gets the dead node's 40")
    finally:
        await conn2.close()
        del conn1  # its node is gone
    assert sorted(survivor.bodies) == sorted(f"m{i}" for i in range(40))
    assert survivor.redelivered == 40


async def test_confirmed_publishes_survive_kill9_of_the_confirming_node(cluster: ClusterFactory) -> None:
    c = cluster(2)
    n1, n2 = c.nodes
    await _declare_work_queue(n2.amqp_port, "kept", "kept.#")
    await _publish_confirmed(n1.amqp_port, 200, "kept")
    c.kill9(n1)
    got = _Collector(0)
    conn = await _consume(n2.amqp_port, "kept", got, 100)
    try:
        await until(lambda: len(got.bodies) >= 200, 20, "200 confirmed messages")
    finally:
        await conn.close()
    assert sorted(got.bodies) == sorted(f"m{i}" for i in range(200))


async def test_a_device_publish_reaches_amqp_and_rocketmq_consumers_on_other_nodes_once(
        cluster: ClusterFactory, paho_factory: PahoFactory) -> None:
    c = cluster(3)
    n1, n2, n3 = c.nodes
    wait_port(n3.rocketmq_port)
    await _declare_work_queue(n2.amqp_port, "telemetry", "plant.#")
    clients = Clients()
    try:
        consumer = await asyncio.to_thread(clients.consumer, n3, "analytics", "plant")
        amqp = _Collector(0)
        conn = await _consume(n2.amqp_port, "telemetry", amqp, 50)
        device = paho_factory(n1.port, "sensor-1")
        await asyncio.to_thread(device.connect)
        for i in range(60):
            await asyncio.to_thread(device.publish, f"plant/line{i % 3}/temp", f"m{i}".encode(), 1)
        rocket: list[tuple[str, str | None]] = []
        deadline = time.monotonic() + 30
        while (len(rocket) < 60 or len(amqp.bodies) < 60) and time.monotonic() < deadline:
            for m in await asyncio.to_thread(consumer.receive, 16, 30):
                rocket.append((m.body.decode(), m.properties.get("mqttSecondTopic")))
                await asyncio.to_thread(consumer.ack, m)
        await asyncio.sleep(0.5)  # absence: a second delivery to the AMQP queue would show up now
        await conn.close()
    finally:
        await asyncio.to_thread(clients.close)
    expected = sorted(f"m{i}" for i in range(60))
    assert sorted(amqp.bodies) == expected, c.logs()
    assert sorted(body for body, _ in rocket) == expected, c.logs()
    assert {second for _, second in rocket} == {"/line0/temp/", "/line1/temp/", "/line2/temp/"}


async def _count(port: int, queue: str) -> int:
    conn = await _connect(port)
    async with conn:
        channel = await conn.channel()
        declared = await channel.declare_queue(queue, passive=True)
        return int(declared.declaration_result.message_count)


async def test_length_limit_and_dead_letters_hold_across_nodes(cluster: ClusterFactory) -> None:
    """aio-pika on three nodes: a queue of x-max-length 5 with a dead-letter queue, declared on node 1, gets 8
    confirmed publishes through node 3 (which never declared it): the 3 oldest are dead-lettered once
    (reason maxlen; both nodes that know the queue sweep it, one trims: nothing dropped twice), the counts
    read on any node are exact, and a message rejected on node 2 lands in the dead-letter queue with its
    x-death. Lost: none; dropped beyond the limit: none."""
    c = cluster(3)
    n1, n2, n3 = c.nodes
    conn = await _connect(n1.amqp_port)
    async with conn:
        channel = await conn.channel()
        await channel.declare_queue("parked", durable=True)
        await channel.declare_queue("capped", durable=True, arguments={
            "x-max-length": 5, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "parked"})
    assert await _count(n2.amqp_port, "capped") == 0  # node 2 knows the queue too: it sweeps it as well
    conn = await _connect(n3.amqp_port)
    async with conn:
        channel = await conn.channel(publisher_confirms=True)
        for i in range(8):
            await channel.default_exchange.publish(aio_pika.Message(b"m%d" % i, delivery_mode=2), routing_key="capped")

    async def counts() -> tuple[int, int]:
        return await _count(n2.amqp_port, "capped"), await _count(n3.amqp_port, "parked")

    seen: list[tuple[int, int]] = []

    async def trimmed() -> bool:
        seen.append(await counts())
        return seen[-1] == (5, 3)

    await until(trimmed, 10, lambda: f"5 in capped, 3 parked (last seen {seen[-1:]})\n{c.logs()}")
    conn = await _connect(n2.amqp_port)
    async with conn:
        channel = await conn.channel()
        capped = await channel.get_queue("capped")
        message = await capped.get(no_ack=False)
        assert message.body == b"m3"
        await message.reject(requeue=False)
        parked = await channel.get_queue("parked")
        bodies, reasons = [], []
        while len(bodies) < 4:
            got = await parked.get(no_ack=True, fail=False)
            if got is None:
                await asyncio.sleep(0.05)  # the rejected one is republished once durable: poll for it
                continue
            bodies.append(got.body)
            reasons.append(got.headers["x-death"][0]["reason"])
    assert bodies == [b"m0", b"m1", b"m2", b"m3"]
    assert reasons == ["maxlen", "maxlen", "maxlen", "rejected"]
    assert await counts() == (4, 0)
