"""RocketMQ FIFO messages (message groups) through a real gateway with the official Python client: per group
order, one message of a group in flight per consumer group (the next only after the previous is acked), with
competing SimpleConsumers and with a PushConsumer; nothing lost or duplicated."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from rocketmq import ConsumeResult, FilterExpression, Message, MessageListener, PushConsumer, SimpleConsumer

from tests.cluster.conftest import ClusterFactory, cluster  # noqa: F401 - `cluster` is a fixture
from tests.integration.conftest import Gateway
from tests.store import redis_server
from tests.waiting import wait_until

from .conftest import Clients, message, wait_port

GROUPS = 10


def fifo(topic: str, group: str, n: int) -> Message:
    m = message(topic, f"{group}:{n}".encode())
    m.message_group = group
    return m


class Tally:
    """What consumers got, per message group in arrival order, and any second message of a group handed out
    while one was still unacked."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_group: dict[str, list[int]] = {}
        self.in_flight: dict[str, str] = {}
        self.overlaps: list[str] = []
        self.count = 0

    def got(self, m: Message) -> None:
        group, n = m.body.decode().split(":")
        assert m.message_group == group
        with self.lock:
            if group in self.in_flight:
                self.overlaps.append(f"{self.in_flight[group]} and {n}")
            self.in_flight[group] = n
            self.by_group.setdefault(group, []).append(int(n))
            self.count += 1

    def settling(self, m: Message) -> None:
        """Called just before the ack: the server may hand out the group's next one from then on."""
        with self.lock:
            self.in_flight.pop(m.body.decode().split(":")[0], None)

    def check(self, per_group: int) -> None:
        assert self.overlaps == []
        assert sorted(self.by_group) == [f"g{i}" for i in range(GROUPS)]
        for group, ns in self.by_group.items():
            assert ns == list(range(per_group)), group  # in order, none lost, none twice


def send_all(clients: Clients, gw: Gateway, topic: str, per_group: int) -> None:
    producer = clients.producer(gw, [topic])
    for n in range(per_group):
        for i in range(GROUPS):
            producer.send(fifo(topic, f"g{i}", n))


def consume_all(consumers: list[SimpleConsumer], tally: Tally, total: int) -> None:
    """Two threads, one per consumer, until `total` came; then nothing more comes."""
    stop = threading.Event()

    def run(consumer: SimpleConsumer) -> None:
        while not stop.is_set():
            batch = consumer.receive(32, 30)
            for m in batch:  # a batch holds at most one message of a group
                tally.got(m)
            for m in batch:
                tally.settling(m)
                consumer.ack(m)

    threads = [threading.Thread(target=run, args=(c,), daemon=True) for c in consumers]
    for thread in threads:
        thread.start()
    try:
        wait_until(lambda: tally.count >= total, timeout=60, what="every FIFO message")
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=5)
    assert consumers[0].receive(32, 30) == []


@pytest.mark.slow  # seconds: 1,000 messages with 10 in flight at a time
def test_fifo_groups_in_order_with_two_simple_consumers(rmq_gateway: Callable[..., Gateway],
                                                        clients: Clients) -> None:
    gw = rmq_gateway()
    per_group = 100
    consumers = [clients.consumer(gw, "fifo", "t"), clients.consumer(gw, "fifo", "t", wait_declared=False)]
    send_all(clients, gw, "t", per_group)  # a backlog first: every receive could take 32 of it at once
    tally = Tally()
    consume_all(consumers, tally, GROUPS * per_group)
    tally.check(per_group)


@pytest.mark.slow
@pytest.mark.skipif(not redis_server.available(), reason="a cluster needs redis-server")
def test_fifo_groups_in_order_with_consumers_on_two_nodes(cluster: ClusterFactory,  # noqa: F811
                                                          clients: Clients) -> None:
    c = cluster(2)
    n1, n2 = c.nodes
    for node in c.nodes:
        wait_port(node.rocketmq_port)
    per_group = 100
    consumers = [clients.consumer(n1, "fifo", "t"), clients.consumer(n2, "fifo", "t")]
    send_all(clients, n1, "t", per_group)
    tally = Tally()
    consume_all(consumers, tally, GROUPS * per_group)
    tally.check(per_group)


class _Listener(MessageListener):
    def __init__(self, tally: Tally) -> None:
        self.tally = tally

    def consume(self, message: Message) -> int:
        self.tally.got(message)
        self.tally.settling(message)  # the push consumer acks after this returns
        return ConsumeResult.SUCCESS


@pytest.mark.slow
def test_fifo_groups_in_order_with_a_push_consumer(rmq_gateway: Callable[..., Gateway], clients: Clients) -> None:
    gw = rmq_gateway()
    per_group = 30
    tally = Tally()
    consumer = PushConsumer(clients.config(gw), "fifo-push", _Listener(tally), {"t": FilterExpression()},
                            consumption_thread_count=4)
    consumer.startup()
    clients.made.append(consumer)
    wait_until(lambda: "event=rocketmq.subscription group=fifo-push topic=t " in gw.stderr, what="subscription")
    send_all(clients, gw, "t", per_group)
    wait_until(lambda: tally.count >= GROUPS * per_group, timeout=60, what="every FIFO message")
    tally.check(per_group)
