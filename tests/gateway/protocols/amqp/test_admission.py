"""AMQP connections go through the same listeners and admission as MQTT's: per-listener connection limits and
connect rates (`listeners.amqp`), the shedding of connects while too many wait for authentication, and the PROXY
protocol. A refused client is decided on before any authentication work and gets Connection.Close 530
NOT_ALLOWED at Connection.Open, where RabbitMQ refuses over a connection limit; the clients already connected
carry on."""

from __future__ import annotations

import json
import threading

import pika
import pika.exceptions
import pytest

from tests.gateway.protocols.amqp.conftest import AmqpGateway, PikaFactory
from tests.gateway.protocols.amqp.rawamqp import RawAmqp
from tests.integration.test_limits import AUTH_DELAY, SlowAuthServer, slow_auth  # noqa: F401  (fixture)
from tests.waiting import wait_until


def _refused(pika_factory: PikaFactory, port: int) -> str:
    """The refusal as pika reports it: a Connection.Close at Connection.Open, which it calls a probable denial of
    access to the vhost (as it does RabbitMQ's connection limits)."""
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as info:
        pika_factory(port)
    return str(info.value)


def _works(conn: pika.BlockingConnection, key: str) -> None:
    channel = conn.channel()
    channel.confirm_delivery()
    channel.basic_publish("amq.topic", key, b"still served")  # raises unless confirmed


def test_a_full_listener_refuses_with_530_and_keeps_its_clients(amqp_gateway: AmqpGateway,
                                                                pika_factory: PikaFactory) -> None:
    gw = amqp_gateway(env={"TIDEWIRE_LISTENERS": json.dumps({"amqp": {"max_connections": 2}})})
    first, second = pika_factory(gw.amqp_port), pika_factory(gw.amqp_port)
    assert "(530) 'NOT_ALLOWED - connection refused: max connections on listener amqp'" in _refused(
        pika_factory, gw.amqp_port)
    _works(first, "full.first")
    _works(second, "full.second")
    first.close()  # its place is free again
    wait_until(lambda: "amqp.closed" in gw.stderr, what="the close seen by the node")
    _works(pika_factory(gw.amqp_port), "full.third")


def test_the_connect_rate_of_a_listener(amqp_gateway: AmqpGateway, pika_factory: PikaFactory) -> None:
    gw = amqp_gateway(env={"TIDEWIRE_LISTENERS": json.dumps(
        {"amqp": {"max_connection_rate": 0.2, "connection_rate_burst": 1}})})  # one every 5 s
    steady = pika_factory(gw.amqp_port)
    assert "(530) 'NOT_ALLOWED - connection refused: connect rate on listener amqp'" in _refused(
        pika_factory, gw.amqp_port)
    _works(steady, "rate.steady")


def test_connects_beyond_those_in_authentication_are_shed_at_once(
        amqp_gateway: AmqpGateway, pika_factory: PikaFactory, slow_auth: SlowAuthServer) -> None:  # noqa: F811
    gw = amqp_gateway(env={"TIDEWIRE_MAX_PENDING_CONNECTS": "1",
                           "TIDEWIRE_HTTP_AUTH_URL": f"http://127.0.0.1:{slow_auth.server_port}/auth",
                           "TIDEWIRE_HTTP_AUTH_CACHE_TTL": "0"})
    waiting: list[pika.BlockingConnection] = []
    slow = threading.Thread(target=lambda: waiting.append(pika_factory(gw.amqp_port, "slowpoke", "pw")))
    slow.start()
    try:
        wait_until(lambda: bool(slow_auth.bodies), timeout=5, what="the first login at the auth service")
        assert "(530) 'NOT_ALLOWED - connection refused: too many connects in authentication'" in _refused(
            pika_factory, gw.amqp_port)
    finally:
        slow.join(AUTH_DELAY + 5)
    assert len(waiting) == 1 and waiting[0].is_open  # the one in authentication got in
    with slow_auth.lock:
        assert len(slow_auth.bodies) == 1, "a shed connect must not reach the auth service"


def test_proxy_protocol_gives_the_real_client_address(amqp_gateway: AmqpGateway, pika_factory: PikaFactory) -> None:
    gw = amqp_gateway(env={"TIDEWIRE_LISTENERS": json.dumps({"amqp": {"proxy_protocol": True}})})
    raw = RawAmqp(gw.amqp_port)
    try:
        raw.send(f"PROXY TCP4 203.0.113.9 127.0.0.1 51234 {gw.amqp_port}\r\n".encode())
        raw.handshake()
        wait_until(lambda: "amqp.connected" in gw.stderr, what="the login")
        line = next(x for x in gw.stderr.splitlines() if "amqp.connected" in x)
        assert "peer=203.0.113.9:51234" in line, line
    finally:
        raw.close()
    with pytest.raises(pika.exceptions.AMQPConnectionError):  # no PROXY header: not an AMQP client of ours
        pika_factory(gw.amqp_port)
