"""RocketMQ delay (timer) messages through a real gateway with the official Python client: delivered at their
delivery timestamp, not before, across a restart of a single embedded node and a kill -9 of the cluster node
that took (and had claimed) the message: the due time is in the store."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest
from rocketmq import Message, SimpleConsumer

from tests.cluster.conftest import ClusterFactory, cluster  # noqa: F401 - `cluster` is a fixture
from tests.integration.conftest import Gateway
from tests.store import redis_server
from tests.waiting import wait_until

from .conftest import Clients, message, restart, wait_port

DELAY_MS = 6000
LATE_MS = 5000  # a loaded machine's margin: the node looks for due messages every second


def delayed(topic: str, body: bytes, due_ms: int) -> Message:
    m = message(topic, body)
    m.delivery_timestamp = due_ms // 1000  # this client sends it in seconds (into the Timestamp's seconds)
    return m


def due_at() -> int:
    """A delivery time DELAY_MS ahead, in whole seconds (ms)."""
    return (now_ms() + DELAY_MS) // 1000 * 1000


def now_ms() -> int:
    return int(time.time() * 1000)


def receive_when_due(consumer: SimpleConsumer, due_ms: int) -> tuple[list[Message], int]:
    """Poll until something comes (or well past the due time); what came and when (ms)."""
    while now_ms() < due_ms + LATE_MS + 10_000:
        got = consumer.receive(4, 30)
        if got:
            return got, now_ms()
    return [], now_ms()


@pytest.mark.slow  # seconds: waits for the delivery time
def test_a_delay_message_comes_at_its_time_after_a_restart(rmq_gateway: Callable[..., Gateway],
                                                            clients: Clients) -> None:
    gw = rmq_gateway()
    consumer = clients.consumer(gw, "d", "t", await_s=2)
    producer = clients.producer(gw, ["t"])
    due = due_at()
    producer.send(delayed("t", b"later", due))
    producer.send(message("t", b"now"))
    first = consumer.receive(4, 30)  # claims both: the delay message's claim is hidden until its time
    assert [(m.body, m.message_type) for m in first] == [(b"now", 1)]
    consumer.ack(first[0])
    clients.shutdown(consumer)
    clients.shutdown(producer)
    restart(gw)
    consumer = clients.consumer(gw, "d", "t", await_s=2, wait_declared=False)
    got, arrived = receive_when_due(consumer, due)
    # (its delivery attempt counts the restart, which released the node's claims: 2)
    assert [(m.body, m.delivery_timestamp) for m in got] == [(b"later", due)], gw.stderr
    assert due <= arrived <= due + LATE_MS
    consumer.ack(got[0])
    assert consumer.receive(4, 30) == []


def _claims_in_redis(c: object, group: str) -> int:
    client = c._client()  # type: ignore[attr-defined]
    try:
        return sum(int(client.hlen(key)) for key in client.scan_iter(match=f"*:gp:{group}"))
    finally:
        client.close()


@pytest.mark.slow
@pytest.mark.skipif(not redis_server.available(), reason="a cluster needs redis-server")
def test_a_delay_message_comes_at_its_time_after_its_node_is_killed(cluster: ClusterFactory,  # noqa: F811
                                                                     clients: Clients) -> None:
    c = cluster(3)
    n1, n2, _ = c.nodes
    for node in c.nodes:
        wait_port(node.rocketmq_port)
    first = clients.consumer(n1, "d", "t", await_s=20)
    producer = clients.producer(n1, ["t"])
    with ThreadPoolExecutor(1) as pool:
        polling = pool.submit(first.receive, 4, 30)  # n1 claims the message, hidden until due
        due = due_at()
        producer.send(delayed("t", b"later", due))
        wait_until(lambda: _claims_in_redis(c, "rmq/d/t") == 1, timeout=5, what="n1's claim in the store")
        c.kill9(n1)
        with pytest.raises(Exception):  # noqa: B017 - the node died under the poll
            polling.result(timeout=10)
    assert now_ms() < due  # the test kills before the due time, or it proves nothing
    second = clients.consumer(n2, "d", "t", await_s=2, wait_declared=False)
    got, arrived = receive_when_due(second, due)
    assert [(m.body, m.delivery_timestamp) for m in got] == [(b"later", due)], c.logs()
    assert due <= arrived <= due + LATE_MS
    second.ack(got[0])
    assert second.receive(4, 30) == []
