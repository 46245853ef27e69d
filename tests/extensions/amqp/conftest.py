"""Fixtures for the AMQP tests: a real gateway process with its AMQP listener, real pika connections."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import pika
import pytest

from tests.integration.conftest import Gateway, GatewayFactory, gateway_factory, paho_factory  # noqa: F401

AmqpGateway = Callable[..., Gateway]


def wait_for_port(port: int, timeout: float = 10.0) -> None:
    """The AMQP listener opens just after the MQTT one the gateway fixture waits for."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise AssertionError(f"nothing listens on AMQP port {port}") from None
            time.sleep(0.05)


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
