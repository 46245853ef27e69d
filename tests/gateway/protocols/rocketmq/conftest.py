"""Fixtures for the RocketMQ handler: a real gateway process with its RocketMQ listener, and the official
`rocketmq-python-client` (Producer, SimpleConsumer), shut down at teardown.

The client runs its gRPC calls on one process-wide I/O thread it never stops (a daemon thread of the library);
every client made here is shut down, which closes its channels and scheduler threads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, Producer, SimpleConsumer

from tests.integration.conftest import (
    Gateway,
    GatewayFactory,
    gateway_factory,
    paho_factory,
    wait_accepting,
)
from tests.waiting import wait_until

__all__ = ["gateway_factory", "paho_factory"]



wait_port = wait_accepting  # the Gateway fixture already waits for every port it opened


@pytest.fixture
def rmq_gateway(gateway_factory: GatewayFactory) -> Callable[..., Gateway]:
    """`rmq_gateway(**Gateway keywords)`: a started gateway whose RocketMQ port accepts connections."""

    def make(**kwargs: Any) -> Gateway:
        gw = gateway_factory(rocketmq=True, **kwargs)
        wait_port(gw.rocketmq_port)
        return gw

    return make


def restart(gw: Gateway, kill: bool = False) -> None:
    """Stop (SIGTERM, or kill -9) and start again on the same ports and data."""
    if kill:
        gw.kill9()
    else:
        gw.stop()
    gw.start()
    wait_port(gw.rocketmq_port)


def message(topic: str, body: bytes, *, tag: str | None = None, keys: tuple[str, ...] = (),
            properties: dict[str, str] | None = None) -> Message:
    m = Message()
    m.topic = topic
    m.body = body
    if tag is not None:
        m.tag = tag
    for key in keys:
        m.keys = key  # the client's setter adds one key per assignment
    for name, value in (properties or {}).items():
        m.add_property(name, value)
    return m


class Clients:
    """Makes official RocketMQ clients for one gateway and shuts them all down at teardown."""

    def __init__(self) -> None:
        self.made: list[Any] = []

    def config(self, gw: Gateway, ak: str = "", sk: str = "") -> ClientConfiguration:
        return ClientConfiguration(f"127.0.0.1:{gw.rocketmq_port}", Credentials(ak, sk), request_timeout=3)

    def producer(self, gw: Gateway, topics: list[str], ak: str = "", sk: str = "", **kwargs: Any) -> Producer:
        producer = Producer(self.config(gw, ak, sk), topics=topics, **kwargs)
        producer.startup()
        self.made.append(producer)
        return producer

    def consumer(self, gw: Gateway, group: str, topic: str, expression: FilterExpression | None = None, *,
                 await_s: int = 1, ak: str = "", sk: str = "", wait_declared: bool = True) -> SimpleConsumer:
        """A started SimpleConsumer; by default returns once the gateway has set its subscription up (a new
        consumer group starts at the end of the log, as RocketMQ's does)."""
        consumer = SimpleConsumer(self.config(gw, ak, sk), group, {topic: expression or FilterExpression()},
                                  await_duration=await_s)
        consumer.startup()
        self.made.append(consumer)
        if wait_declared:
            wait_until(lambda: f"event=rocketmq.subscription group={group} topic={topic} " in gw.stderr,
                       timeout=5, what=f"subscription {group}/{topic}")
        return consumer

    def shutdown(self, client: Any) -> None:
        if client in self.made:
            self.made.remove(client)
            client.shutdown()

    def close(self) -> None:
        for client in reversed(self.made):
            try:
                client.shutdown()
            except Exception:
                pass
        self.made.clear()


@pytest.fixture
def clients() -> Iterator[Clients]:
    made = Clients()
    yield made
    made.close()


def write_credentials(path: Path, pairs: dict[str, str]) -> Path:
    path.write_text("".join(f"{ak}:{sk}\n" for ak, sk in pairs.items()))
    return path
