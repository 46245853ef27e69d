"""Helpers for the pika-based AMQP tests: pumping a BlockingConnection, collecting deliveries."""

from __future__ import annotations

import time
from collections.abc import Callable

import pika
from pika.adapters.blocking_connection import BlockingChannel

from tests.waiting import describe, wait_until

Delivered = tuple[int, bytes, bool]  # delivery tag, body, redelivered


def drain(conn: pika.BlockingConnection, until: Callable[[], bool], timeout: float = 5.0,
          what: str | None = None) -> None:
    """Pump the connection (deliveries, callbacks) until `until()` holds; fail naming it after `timeout`."""
    def pumped() -> bool:
        if until():
            return True
        conn.process_data_events(time_limit=0.05)  # waits for the broker up to 50 ms: the poll interval
        return False

    wait_until(pumped, timeout, what=lambda: describe(until, what), interval=0)


def settle_for(conn: pika.BlockingConnection, seconds: float) -> None:
    """Let deliveries that would arrive arrive."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.05)


def telemetry_queue(channel: BlockingChannel, name: str = "telemetry") -> str:
    channel.queue_declare(name, durable=True)
    channel.queue_bind(name, "amq.topic", "telemetry.#")
    return name


def collector(into: list[Delivered], ack: bool = True) -> Callable[..., None]:
    def on_message(ch: BlockingChannel, method: pika.spec.Basic.Deliver, props: pika.BasicProperties,
                   body: bytes) -> None:
        into.append((method.delivery_tag, body, method.redelivered))
        if ack:
            ch.basic_ack(method.delivery_tag)

    return on_message
