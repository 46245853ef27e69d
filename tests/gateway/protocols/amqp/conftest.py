"""Fixtures for the AMQP tests: a real gateway process with its AMQP listener, real pika connections."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pika
import pytest

from tests.integration.conftest import Gateway, GatewayFactory, gateway_factory, paho_factory, wait_accepting  # noqa: F401

AmqpGateway = Callable[..., Gateway]


wait_for_port = wait_accepting  # the Gateway fixture already waits for every port it opened


@pytest.fixture
def amqp_gateway(gateway_factory: GatewayFactory) -> AmqpGateway:  # noqa: F811
    """`amqp_gateway(**Gateway keywords)` → a started gateway whose AMQP port accepts connections."""

    def make(**kwargs: Any) -> Gateway:
        gw = gateway_factory(amqp=True, **kwargs)
        wait_for_port(gw.amqp_port)
        return gw

    return make


PikaFactory = Callable[..., pika.BlockingConnection]


@pytest.fixture
def pika_factory() -> Iterator[PikaFactory]:
    """`pika_factory(port, username="guest", password="guest", **ConnectionParameters keywords)`; closed at
    teardown."""
    made: list[pika.BlockingConnection] = []

    def make(port: int, username: str = "guest", password: str = "guest", **kwargs: Any) -> pika.BlockingConnection:
        params = pika.ConnectionParameters("127.0.0.1", port, credentials=pika.PlainCredentials(username, password),
                                           connection_attempts=1, socket_timeout=5, blocked_connection_timeout=10,
                                           **kwargs)
        conn = pika.BlockingConnection(params)
        made.append(conn)
        return conn

    yield make
    for conn in made:
        if conn.is_open:
            try:
                conn.close()
            except Exception:  # already closed by the server, or the gateway was killed
                pass
