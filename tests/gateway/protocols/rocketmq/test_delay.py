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
    """Poll until something comes (or well past the due time); what came and when (ms). A receive from a node
    that was just killed fails: routes list it until the cluster declares it dead, and the client polls each
    queue of the route in turn."""
    while now_ms() < due_ms + LATE_MS + 10_000:
        try:
            got = consumer.receive(4, 30)
        except Exception:  # the client raises its own and gRPC's errors for a dead endpoint
            continue
        if got:
            return got, now_ms()
    return [], now_ms()


def receive_nothing(consumer: SimpleConsumer, answers: int = 3) -> list[Message]:
    """What `answers` polls that reached a live node got (should be nothing): a poll sent to the killed node
    fails until the cluster declares it dead, and does not count."""
    got: list[Message] = []
    deadline = time.monotonic() + 60
    while answers and time.monotonic() < deadline:
        try:
            got += consumer.receive(4, 30)
        except Exception:  # the client raises its own and gRPC's errors for a dead endpoint
            continue
        answers -= 1
    assert not answers, "no live node answered"
    return got


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


def _claim_owner(c: object, group: str) -> str | None:
    """The node holding the group's one pending claim in Redis (`:gp:` "deliveries token visible_at owner")."""
    client = c._client()  # type: ignore[attr-defined]
    try:
        for key in client.scan_iter(match=f"*:gp:{group}"):
            for value in client.hvals(key):
                return str(value.decode().split()[3])
        return None
    finally:
        client.close()


@pytest.mark.slow
@pytest.mark.skipif(not redis_server.available(), reason="a cluster needs redis-server")
def test_a_delay_message_comes_at_its_time_after_its_node_is_killed(cluster: ClusterFactory,  # noqa: F811
                                                                     clients: Clients) -> None:
    """The node that claimed a delay message (hidden until due) is killed before the due time: another node
    hands it out at its time. (Routes list every node: which one the poll reaches, and claims on, is the
    client's choice, so the test kills whichever holds the claim.)"""
    c = cluster(3)
    for node in c.nodes:
        wait_port(node.rocketmq_port)
    first = clients.consumer(c.nodes[0], "d", "t", await_s=20)
    producer = clients.producer(c.nodes[0], ["t"])
    pool = ThreadPoolExecutor(1)
    pool.submit(first.receive, 4, 30)  # the node polled claims the message, hidden until due
    due = due_at()
    producer.send(delayed("t", b"later", due))
    wait_until(lambda: _claim_owner(c, "rmq/d/t") is not None, timeout=5, what="the claim in the store")
    owner = next(n for n in c.nodes if n.node_id == _claim_owner(c, "rmq/d/t"))
    c.kill9(owner)
    pool.shutdown(wait=False)  # a poll on a live node may go on until its long-poll ends
    assert now_ms() < due  # the test kills before the due time, or it proves nothing
    survivor = next(n for n in c.nodes if n is not owner)
    second = clients.consumer(survivor, "d", "t", await_s=2, wait_declared=False)
    got, arrived = receive_when_due(second, due)
    assert [(m.body, m.delivery_timestamp) for m in got] == [(b"later", due)], c.logs()
    assert due <= arrived <= due + LATE_MS
    second.ack(got[0])
    assert receive_nothing(second) == []
