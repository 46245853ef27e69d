"""AMQPStorm, unmodified, against the real gateway. It takes frame-max as the body frame's payload size, so its
body frames are frame-max + 8 bytes: RabbitMQ tolerates that, so must we (and paho devices get the bodies)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import amqpstorm
import pytest

from tests.gateway.protocols.amqp.conftest import AmqpGateway
from tests.integration.conftest import PahoFactory

FRAME_MAX = 131072  # AMQPStorm's own ceiling too: the two agree on it in Tune


@pytest.fixture
def storm_connections() -> Iterator[list[amqpstorm.Connection]]:
    """Connections a test opened, closed at teardown (AMQPStorm runs an I/O thread per connection)."""
    made: list[amqpstorm.Connection] = []
    yield made
    for conn in made:
        if conn.is_open:
            conn.close()


def test_amqpstorm_confirmed_publishes_of_large_bodies_reach_mqtt_devices(
        amqp_gateway: AmqpGateway, paho_factory: PahoFactory,
        storm_connections: list[amqpstorm.Connection]) -> None:
    gw = amqp_gateway(env={"TIDEWIRE_AMQP_FRAME_MAX": str(FRAME_MAX)})
    device = paho_factory(gw.port, "storm-dev")
    device.connect()
    device.subscribe("storm/#", qos=1)
    conn = amqpstorm.Connection("127.0.0.1", "guest", "guest", port=gw.amqp_port, timeout=5)
    storm_connections.append(conn)
    assert conn.max_frame_size == FRAME_MAX
    channel = conn.channel()
    channel.confirm_deliveries()
    # 64 KiB fits one frame however it is counted; 160 KiB makes a body frame of FRAME_MAX + 8 bytes
    bodies = {"storm.small": os.urandom(64 * 1024), "storm.large": os.urandom(160 * 1024)}
    for key, body in bodies.items():
        assert channel.basic.publish(body, key, exchange="amq.topic") is True  # True: Basic.Ack, not Nack
    got = device.expect(2, timeout=10)
    assert {r.topic: r.payload for r in got} == {key.replace(".", "/"): body for key, body in bodies.items()}
    assert conn.is_open and channel.is_open
    conn.check_for_errors()  # raises what the I/O thread saw, such as a Connection.Close from the gateway
