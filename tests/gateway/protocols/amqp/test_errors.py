"""AMQP refusals and failures against the real gateway: credentials, malformed frames (raw socket), not
implemented methods, heartbeats, and the Connection.Close every client gets when the gateway stops."""

from __future__ import annotations

import os
import struct
import time
from pathlib import Path

import pika
import pika.exceptions
import pytest
from pamqp import commands, header

from tests.gateway.protocols.amqp.conftest import AmqpGateway, PikaFactory
from tests.gateway.protocols.amqp.rawamqp import RawAmqp
from tests.integration.conftest import PahoFactory, write_password_file


def test_bad_credentials_are_refused_good_ones_accepted(tmp_path: Path, amqp_gateway: AmqpGateway,
                                                        pika_factory: PikaFactory) -> None:
    passwords = write_password_file(tmp_path / "passwd", {"svc": "s3cret-Pa55"})
    gw = amqp_gateway(password_file=passwords)
    for username, password in (("svc", "wrong-Pa55"), ("nobody", "s3cret-Pa55"), ("guest", "guest")):
        with pytest.raises(pika.exceptions.ProbableAuthenticationError) as refused:
            pika_factory(gw.amqp_port, username, password)
        assert "ACCESS_REFUSED" in str(refused.value)
    channel = pika_factory(gw.amqp_port, "svc", "s3cret-Pa55").channel()
    channel.confirm_delivery()
    channel.basic_publish("amq.topic", "ok", b"x")
    assert "wrong-Pa55" not in gw.stderr and "s3cret-Pa55" not in gw.stderr


def test_a_malformed_frame_closes_only_its_connection(amqp_gateway: AmqpGateway, pika_factory: PikaFactory) -> None:
    gw = amqp_gateway()
    conn = pika_factory(gw.amqp_port)
    channel = conn.channel()
    channel.confirm_delivery()
    queue = channel.queue_declare("", exclusive=True).method.queue
    channel.queue_bind(queue, "amq.topic", "still.#")
    cases: list[tuple[bytes, int]] = [
        (struct.pack(">BHI", 9, 0, 1) + b"x\xce", 501),  # unknown frame type
        (struct.pack(">BHI", 1, 0, 4) + b"\x00\x0a\x00\x0b\x00", 501),  # no frame-end octet
        (struct.pack(">BHI", 1, 0, 6) + b"\x00\x0a\x00\x0b\xff\xff\xce", 502),  # StartOk cut short
        (struct.pack(">BHI", 1, 0, 0x7FFFFFFF) + b"\x00" * 16, 501),  # larger than frame_max
    ]
    for garbage, code in cases:
        raw = RawAmqp(gw.amqp_port)
        raw.handshake()
        raw.send(garbage)
        _, closing = raw.read_method()
        assert isinstance(closing, commands.Connection.Close) and closing.reply_code == code, closing
        raw.wait_closed()  # at once: nothing after a framing fault can be read
        raw.close()
        channel.basic_publish("amq.topic", "still.working", b"%d" % code)  # confirmed: the gateway lives on
    assert [channel.basic_get(queue, auto_ack=True)[2] for _ in cases] == [b"501", b"501", b"502", b"501"]


def test_one_frame_overhead_over_frame_max_is_tolerated_not_more(amqp_gateway: AmqpGateway,
                                                                  pika_factory: PikaFactory,
                                                                  paho_factory: PahoFactory) -> None:
    frame_max = 16384
    gw = amqp_gateway(env={"TIDEWIRE_AMQP_FRAME_MAX": str(frame_max)})
    device = paho_factory(gw.port, "edge-dev")
    device.connect()
    device.subscribe("edge/#", qos=1)
    bystander = pika_factory(gw.amqp_port).channel()  # connected all along, must not notice
    bystander.confirm_delivery()
    raw = RawAmqp(gw.amqp_port)
    raw.handshake()  # takes the frame_max the gateway tunes
    raw.send_frame(1, commands.Channel.Open())
    assert isinstance(raw.read_method()[1], commands.Channel.OpenOk)
    raw.send_frame(1, commands.Confirm.Select())
    assert isinstance(raw.read_method()[1], commands.Confirm.SelectOk)

    def publish(key: str, body: bytes) -> None:
        raw.send_frame(1, commands.Basic.Publish(exchange="amq.topic", routing_key=key))
        raw.send_frame(1, header.ContentHeader(0, len(body), commands.Basic.Properties()))
        raw.send(struct.pack(">BHI", 3, 1, len(body)) + body + b"\xce")  # the whole body in one frame

    fits = os.urandom(frame_max)  # a frame of frame_max + 8 bytes, as AMQPStorm sends: RabbitMQ takes it
    publish("edge.fits", fits)
    _, ack = raw.read_method()
    assert isinstance(ack, commands.Basic.Ack) and ack.delivery_tag == 1, ack
    got = device.get(5)
    assert (got.topic, got.payload) == ("edge/fits", fits)
    publish("edge.over", os.urandom(frame_max + 1))  # frame_max + 9: one byte beyond the tolerance
    _, closing = raw.read_method()
    assert isinstance(closing, commands.Connection.Close) and closing.reply_code == 501, closing
    assert closing.reply_text == f"FRAME_ERROR - frame size {frame_max + 9} larger than negotiated maximum " \
                                 f"{frame_max}"
    raw.wait_closed()
    raw.close()
    bystander.basic_publish("amq.topic", "edge.after", b"still here")  # confirmed: the gateway lives on
    got = device.get(5)  # the refused body was never routed: the next message is the bystander's
    assert (got.topic, got.payload) == ("edge/after", b"still here")


def test_wrong_protocol_header_gets_ours_back(amqp_gateway: AmqpGateway) -> None:
    gw = amqp_gateway()
    raw = RawAmqp(gw.amqp_port)
    raw.send(b"AMQP\x01\x01\x00\x0a")
    raw.sock.settimeout(5)
    assert raw.sock.recv(8) == b"AMQP\x00\x00\x09\x01"
    raw.wait_closed()
    raw.close()


def test_content_without_a_method_is_unexpected(amqp_gateway: AmqpGateway) -> None:
    gw = amqp_gateway()
    raw = RawAmqp(gw.amqp_port)
    raw.handshake()
    raw.send_frame(1, commands.Channel.Open())
    assert isinstance(raw.read_method()[1], commands.Channel.OpenOk)
    raw.send(struct.pack(">BHI", 3, 1, 3) + b"abc\xce")  # a body frame nobody announced
    _, closing = raw.read_method()
    assert isinstance(closing, commands.Connection.Close) and closing.reply_code == 505
    raw.close()


def test_transactions_are_not_implemented(amqp_gateway: AmqpGateway, pika_factory: PikaFactory) -> None:
    gw = amqp_gateway()
    conn = pika_factory(gw.amqp_port)
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        conn.channel().tx_select()
    assert closed.value.reply_code == 540


@pytest.mark.slow  # waits out a protocol timer (make test-slow)
def test_heartbeats_are_sent_and_a_silent_client_is_dropped(amqp_gateway: AmqpGateway) -> None:
    gw = amqp_gateway()
    raw = RawAmqp(gw.amqp_port)
    raw.handshake(heartbeat=1)
    started = time.monotonic()
    _, beat = raw.read_frame(timeout=2)
    assert beat.name == "Heartbeat"  # the server beats every half interval
    raw.wait_closed(timeout=5)  # and closes after two silent intervals
    assert 1.5 < time.monotonic() - started < 4.5
    raw.close()


def test_stopping_the_gateway_closes_connections_with_320(amqp_gateway: AmqpGateway,
                                                          pika_factory: PikaFactory) -> None:
    gw = amqp_gateway(env={"TIDEWIRE_CLOSE_DRAIN_TIMEOUT": "0.5"})  # pika answers only when its loop runs
    conn = pika_factory(gw.amqp_port)
    conn.channel()
    gw.stop()
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        conn.process_data_events(time_limit=2)
    assert closed.value.reply_code == 320
