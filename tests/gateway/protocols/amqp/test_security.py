"""AMQP behind the gateway's security and flow control: the topic ACL on publishes and bindings (for the
identity the password proved), AMQP over TLS, and Connection.Blocked while the node holds publishes back."""

from __future__ import annotations

import ssl
import time
from pathlib import Path

import pika
import pika.exceptions
import pytest

from tests.gateway.protocols.amqp.conftest import AmqpGateway, PikaFactory, wait_for_port
from tests.gateway.protocols.amqp.helpers import Delivered, collector, drain
from tests.integration.certs import TestPKI
from tests.integration.conftest import PahoFactory, TlsOptions, free_port, write_password_file
from tests.store.delaying import delaying_env

ACL = """user svc
topic write devices/#
topic read telemetry/#
topic readwrite $exchange/#
"""


def test_topic_acl_applies_to_publishes_and_bindings(tmp_path: Path, amqp_gateway: AmqpGateway,
                                                     pika_factory: PikaFactory) -> None:
    passwords = write_password_file(tmp_path / "passwd", {"svc": "svc-Pa55word"})
    gw = amqp_gateway(acl_text=ACL, password_file=passwords)
    conn = pika_factory(gw.amqp_port, "svc", "svc-Pa55word")
    channel = conn.channel()
    channel.confirm_delivery()
    channel.basic_publish("amq.topic", "devices.d1.cmd", b"allowed")
    channel.queue_declare("svc-q", durable=True)
    channel.queue_bind("svc-q", "amq.topic", "telemetry.#")
    channel.exchange_declare("svc-ex", "topic")
    channel.queue_bind("svc-q", "svc-ex", "#")  # `$exchange/svc-ex/#`: granted by the last line
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        channel.basic_publish("amq.topic", "telemetry.d1", b"not allowed")
    assert refused.value.reply_code == 403
    channel = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        channel.queue_bind("svc-q", "amq.topic", "devices.#")
    assert refused.value.reply_code == 403
    channel = conn.channel()
    channel.confirm_delivery()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        channel.basic_publish("amq.topic", "$SYS.x", b"never")
    assert refused.value.reply_code == 403


def test_amqp_over_tls(tmp_path: Path, amqp_gateway: AmqpGateway, pika_factory: PikaFactory,
                       paho_factory: PahoFactory) -> None:
    pki = TestPKI(tmp_path / "pki")
    amqps_port = free_port()
    gw = amqp_gateway(tls=TlsOptions(pki.server.certfile, pki.server.keyfile),
                      extra_args=["--amqps-port", str(amqps_port)])
    wait_for_port(amqps_port)
    device = paho_factory(gw.port, "tls-dev")
    device.connect()
    device.subscribe("secure/#", qos=1)
    context = ssl.create_default_context(cafile=str(pki.cafile))
    channel = pika_factory(amqps_port, ssl_options=pika.SSLOptions(context, "127.0.0.1")).channel()
    channel.confirm_delivery()
    channel.basic_publish("amq.topic", "secure.hello", b"over tls", pika.BasicProperties(delivery_mode=2))
    assert device.get(5).payload == b"over tls"
    with pytest.raises(pika.exceptions.AMQPConnectionError):  # plain AMQP on the TLS port: no handshake
        pika_factory(amqps_port)


def test_connection_blocked_while_the_node_holds_publishes(amqp_gateway: AmqpGateway,
                                                           pika_factory: PikaFactory) -> None:
    # A slow store and a tiny append queue: the node pauses the publisher, which is told (Connection.Blocked),
    # and unpaused once the queue drains (Connection.Unblocked); nothing is lost.
    gw = amqp_gateway(env={**delaying_env(150), "TIDEWIRE_MAX_PENDING_PUBLISHES": "5"})
    conn = pika_factory(gw.amqp_port)
    events: list[str] = []
    conn.add_on_connection_blocked_callback(lambda _c, _f: events.append("blocked"))
    conn.add_on_connection_unblocked_callback(lambda _c, _f: events.append("unblocked"))
    channel = conn.channel()
    channel.queue_declare("held", durable=True)
    channel.queue_bind("held", "amq.topic", "held")
    for i in range(60):
        channel.basic_publish("amq.topic", "held", b"%d" % i, pika.BasicProperties(delivery_mode=2))
    deadline = time.monotonic() + 10
    while "unblocked" not in events and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.05)
    assert events[:2] == ["blocked", "unblocked"]
    channel.confirm_delivery()
    channel.basic_publish("amq.topic", "held", b"last", pika.BasicProperties(delivery_mode=2))
    got: list[Delivered] = []
    channel.basic_consume("held", collector(got, ack=False), auto_ack=True)  # one claim for all: the store is slow
    drain(conn, lambda: len(got) >= 61, timeout=10)
    assert [body for _, body, _ in got] == [b"%d" % i for i in range(60)] + [b"last"]
