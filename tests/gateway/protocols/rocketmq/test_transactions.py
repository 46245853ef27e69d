"""RocketMQ transactional messages through a real gateway with the official Python client: a half message is
invisible until EndTransaction commits it (a rollback drops it); a transaction never ended is checked back
with a producer's TransactionChecker, and its answer applied; the half survives the node that took it."""

from __future__ import annotations

import queue
import time
from collections.abc import Callable

import pytest
from rocketmq import Message, Producer, TransactionChecker, TransactionResolution
from rocketmq.grpc_protocol import Code, TransactionSource

from tests.cluster.conftest import ClusterFactory, cluster  # noqa: F401 - `cluster` is a fixture
from tests.integration.conftest import Gateway
from tests.store import redis_server
from tests.waiting import wait_until

from .conftest import Clients, message, wait_port

FAST_CHECKS = {"TIDEWIRE_ROCKETMQ_TRANSACTION_CHECK_SECONDS": "1"}


class Checker(TransactionChecker):
    """Answers by the body: COMMIT for `commit...`, ROLLBACK for `rollback...`; records every check."""

    def __init__(self) -> None:
        self.checked: queue.Queue[bytes] = queue.Queue()

    def check(self, message: Message) -> int:
        self.checked.put(message.body)
        if message.body.startswith(b"commit"):
            return TransactionResolution.COMMIT
        if message.body.startswith(b"rollback"):
            return TransactionResolution.ROLLBACK
        return TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED  # unknown: ask again later


def send_half(producer: Producer, body: bytes) -> object:
    transaction = producer.begin_transaction()
    producer.send(message("t", body), transaction)
    return transaction


def send_half_to(producer: Producer, body: bytes) -> str:
    """Send a half message; the id of the node that took it (a route's broker name is its node id; the client
    shows a queue as "<broker>.<topic>.<id>")."""
    receipt = producer.send(message("t", body), producer.begin_transaction())
    return str(receipt.message_queue).split(".", 1)[0]


def receive_all(consumer: object, until: Callable[[list[bytes]], bool], timeout: float = 20) -> list[bytes]:
    got: list[bytes] = []
    deadline = time.monotonic() + timeout
    while not until(got) and time.monotonic() < deadline:
        try:
            batch = consumer.receive(8, 30)  # type: ignore[attr-defined]
        except Exception:  # a node just killed: routes list it until the cluster declares it dead
            continue
        for m in batch:
            got.append(m.body)
            consumer.ack(m)  # type: ignore[attr-defined]
    return got


@pytest.mark.slow  # a gateway of its own, 2 s
def test_commit_shows_a_half_message_and_rollback_drops_it(rmq_gateway: Callable[..., Gateway],
                                                           clients: Clients) -> None:
    gw = rmq_gateway()
    consumer = clients.consumer(gw, "c", "t")
    producer = clients.producer(gw, ["t"], checker=Checker())
    kept = send_half(producer, b"kept")
    dropped = send_half(producer, b"dropped")
    producer.send(message("t", b"plain"))
    assert receive_all(consumer, lambda got: b"plain" in got) == [b"plain"]  # the halves are not visible
    dropped.rollback()  # type: ignore[attr-defined]
    kept.commit()  # type: ignore[attr-defined]
    kept.commit()  # type: ignore[attr-defined]  # again: it ends once
    assert receive_all(consumer, lambda got: b"kept" in got) == [b"kept"]
    consumer.await_duration = 1
    assert consumer.receive(8, 30) == []
    half = message("t", b"x")
    half.message_id = "0A0B0C0D0E0F00000000000003"
    answer = producer.end_transaction(producer.client_configuration.rpc_endpoints, half, "tx-1",
                                      TransactionResolution.COMMIT, TransactionSource.SOURCE_CLIENT)
    assert answer.status.code == Code.INVALID_TRANSACTION_ID


@pytest.mark.slow  # seconds: waits for the check interval
def test_an_open_transaction_is_checked_back_and_the_answer_applied(rmq_gateway: Callable[..., Gateway],
                                                                    clients: Clients) -> None:
    gw = rmq_gateway(env=FAST_CHECKS)
    consumer = clients.consumer(gw, "c", "t")
    checker = Checker()
    producer = clients.producer(gw, ["t"], checker=checker)
    send_half(producer, b"commit-me")
    send_half(producer, b"rollback-me")  # neither is ever ended by the producer's code
    checked = {checker.checked.get(timeout=15), checker.checked.get(timeout=15)}
    assert checked == {b"commit-me", b"rollback-me"}
    assert receive_all(consumer, lambda got: b"commit-me" in got) == [b"commit-me"]
    wait_until(lambda: gw.stderr.count("event=rocketmq.transaction_end ") == 2, what="both ends")
    # ended: settled at their next check, never asked again, the rolled back one never delivered
    wait_until(lambda: gw.stderr.count("event=rocketmq.transaction_check ") == 2 and
               checker.checked.empty(), what="no more checks")
    consumer.await_duration = 3
    assert consumer.receive(8, 30) == []
    assert checker.checked.empty()


@pytest.mark.slow  # seconds: waits for the check interval
def test_an_unanswered_transaction_is_checked_up_to_the_limit_then_dropped(rmq_gateway: Callable[..., Gateway],
                                                                          clients: Clients) -> None:
    gw = rmq_gateway(env={**FAST_CHECKS, "TIDEWIRE_ROCKETMQ_TRANSACTION_CHECK_MAX": "3"})
    consumer = clients.consumer(gw, "c", "t")
    checker = Checker()
    producer = clients.producer(gw, ["t"], checker=checker)
    send_half(producer, b"unknown")
    assert [checker.checked.get(timeout=10) for _ in range(3)] == [b"unknown"] * 3
    wait_until(lambda: "event=rocketmq.transaction_dropped " in gw.stderr, what="the drop")
    assert "checks=3" in gw.stderr.split("event=rocketmq.transaction_dropped ")[1].splitlines()[0]
    consumer.await_duration = 2
    assert consumer.receive(8, 30) == []
    assert checker.checked.empty()


@pytest.mark.slow
@pytest.mark.skipif(not redis_server.available(), reason="a cluster needs redis-server")
def test_a_half_message_survives_its_node_and_another_node_checks_it(cluster: ClusterFactory,  # noqa: F811
                                                                     clients: Clients) -> None:
    c = cluster(3, env=FAST_CHECKS)
    for node in c.nodes:
        wait_port(node.rocketmq_port)
    first = clients.producer(c.nodes[0], ["t"], checker=Checker())
    took = send_half_to(first, b"commit-after-kill")
    clients.shutdown(first)  # the producer that sent it is gone too: only a new one can answer the check
    taker = next(n for n in c.nodes if n.node_id == took)
    c.kill9(taker)  # before any check could reach it
    survivor = next(n for n in c.nodes if n is not taker)
    consumer = clients.consumer(survivor, "c", "t")
    checker = Checker()
    clients.producer(survivor, ["t"], checker=checker)
    assert checker.checked.get(timeout=20) == b"commit-after-kill"
    assert receive_all(consumer, lambda got: bool(got)) == [b"commit-after-kill"], c.logs()
