"""Helpers for the pika-based AMQP tests: pumping a BlockingConnection, collecting deliveries."""

from __future__ import annotations

import time
from collections.abc import Callable

import pika
from pika.adapters.blocking_connection import BlockingChannel

Delivered = tuple[int, bytes, bool]  # delivery tag, body, redelivered


def drain(conn: pika.BlockingConnection, until: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not until():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        conn.process_data_events(time_limit=0.05)


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
