"""A RocketMQ PushConsumer (the official Python client) on the gateway: settings, QueryAssignment, auto-renewed
receives, acks, and a failed consumption redelivered after the backoff the gateway's settings name."""

from __future__ import annotations

import queue
from collections.abc import Callable

import pytest
from rocketmq import ConsumeResult, FilterExpression, Message, MessageListener, PushConsumer

from tests.integration.conftest import Gateway, PahoFactory
from tests.waiting import wait_until

from .conftest import Clients


class _Listener(MessageListener):
    """Fails the first delivery of `fail-once` (the push consumer then hides it for its backoff: 1 s)."""

    def __init__(self) -> None:
        self.got: queue.Queue[tuple[bytes, int]] = queue.Queue()

    def consume(self, message: Message) -> int:
        self.got.put((message.body, message.delivery_attempt))
        retry = message.body == b"fail-once" and message.delivery_attempt == 1
        return ConsumeResult.FAILURE if retry else ConsumeResult.SUCCESS


@pytest.mark.slow  # seconds long: `make test-slow` keeps `make test` under its 10 minutes
def test_push_consumer(rmq_gateway: Callable[..., Gateway], clients: Clients, paho_factory: PahoFactory) -> None:
    """Settings, QueryAssignment, auto-renewed receives, and a failed consumption retried after its backoff."""
    gw = rmq_gateway()
    listener = _Listener()
    consumer = PushConsumer(clients.config(gw), "push", listener, {"a": FilterExpression()},
                            consumption_thread_count=2)
    consumer.startup()  # waits for the gateway's settings
    clients.made.append(consumer)
    wait_until(lambda: "event=rocketmq.subscription group=push topic=a " in gw.stderr, what="subscription")
    pub = paho_factory(gw.port, "device-1")
    pub.connect()
    pub.publish("a/1", b"fail-once", qos=1)
    pub.publish("a/2", b"ok", qos=1)
    got = [listener.got.get(timeout=10) for _ in range(3)]
    assert sorted(got) == [(b"fail-once", 1), (b"fail-once", 2), (b"ok", 1)]
    with pytest.raises(queue.Empty):
        listener.got.get(timeout=1.5)  # both acknowledged: nothing comes back
