"""Bad input end to end: malformed and forbidden packets close only the offending connection, with 5.0 reasons.

Each case: a healthy paho client is connected first; the raw client misbehaves; the server closes the raw
connection within 2 s (5.0: after a DISCONNECT with the right reason code); the healthy client still works
and the process is alive.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

import pytest

from tests.integration.conftest import TARGET, Gateway, GatewayFactory, PahoClient, PahoFactory
from tests.integration.rawmqtt import RawClient, mqtt_str, varint
from tidewire.gateway.protocols.mqtt.codec import Connack, Connect, Disconnect, Publish, encode

MAX_PACKET = 1024


def publish_bytes(level: int, topic: bytes, payload: bytes = b"x", flags: int = 0) -> bytes:
    body = mqtt_str(topic) + (b"\x00" if level == 5 else b"") + payload
    return bytes([0x30 | flags]) + varint(len(body)) + body


# name -> (builder of the bytes sent after a good CONNECT, 5.0 DISCONNECT reason expected)
CASES: dict[str, tuple[Callable[[int], bytes], int]] = {
    "remaining_length_5_bytes": (lambda lv: b"\x30\xff\xff\xff\xff\x01" + b"\x00" * 16, 0x81),
    "invalid_utf8_topic": (lambda lv: publish_bytes(lv, b"a/\xff\xfe"), 0x81),
    "wildcard_in_publish_topic": (lambda lv: encode(Publish(topic="a/+/b", payload=b"x"), lv), 0x90),
    "oversized_packet": (lambda lv: encode(Publish(topic="big", payload=b"x" * (2 * MAX_PACKET)), lv), 0x95),
    "second_connect": (lambda lv: encode(Connect(client_id="again", protocol_level=lv), lv), 0x82),
    # SUBSCRIBE must have flags 0b0010
    "subscribe_reserved_flags": (lambda lv: b"\x80" + varint(len(sub_body(lv))) + sub_body(lv), 0x81),
    "pubrel_reserved_flags": (lambda lv: b"\x60\x02\x00\x01", 0x81),
}

# Mosquitto 2.0.11 answers a wildcard PUBLISH topic with 0x82 (protocol error) rather than 0x90.
MOSQUITTO_REASONS = {"wildcard_in_publish_topic": 0x82}


def sub_body(level: int) -> bytes:
    return b"\x00\x01" + (b"\x00" if level == 5 else b"") + mqtt_str("ok/t") + b"\x01"


def healthy(gateway: Gateway, paho_factory: PahoFactory) -> PahoClient:
    c = paho_factory(gateway.port, "healthy", version=5)
    c.connect()
    c.subscribe("health/t", 1)
    return c


def still_healthy(gateway: Gateway, c: PahoClient, tag: bytes) -> None:
    assert gateway.alive, f"gateway died:\n{gateway.stderr[-3000:]}"
    assert c.disconnects.empty(), "an innocent client was disconnected"
    c.publish("health/t", tag, qos=1)
    assert c.get().payload == tag


@pytest.fixture
def small_gateway(gateway_factory: GatewayFactory) -> Gateway:
    return gateway_factory(env={"TIDEWIRE_MAX_PACKET_SIZE": str(MAX_PACKET)})


@pytest.mark.parametrize("level", [4, 5])
@pytest.mark.parametrize("case", list(CASES))
def test_bad_packet_closes_connection(small_gateway: Gateway, paho_factory: PahoFactory, case: str,
                                      level: int) -> None:
    build, reason = CASES[case]
    if TARGET == "mosquitto":
        reason = MOSQUITTO_REASONS.get(case, reason)
    ok = healthy(small_gateway, paho_factory)
    raw = RawClient(small_gateway.port, level=level)
    raw.connect(f"bad-{case}")
    still_healthy(small_gateway, ok, b"during")
    try:
        raw.send_raw(build(level))
    except OSError:
        pass  # the server may already have hung up while we were still writing
    got = raw.until_closed(2.0)
    if level == 5:
        disconnects = [p for p in got if isinstance(p, Disconnect)]
        if disconnects or TARGET != "mosquitto":  # Mosquitto 2.0.11 often just closes
            assert disconnects, f"no DISCONNECT before close; got {got}"
            assert disconnects[-1].reason_code == reason, f"reason {disconnects[-1].reason_code:#x} != {reason:#x}"
    else:
        assert not [p for p in got if isinstance(p, Disconnect)], "3.1.1 servers never send DISCONNECT"
    still_healthy(small_gateway, ok, b"after")


@pytest.mark.parametrize("level", [4, 5])
def test_publish_before_connect_closes(gateway: Gateway, paho_factory: PahoFactory, level: int) -> None:
    ok = healthy(gateway, paho_factory)
    raw = RawClient(gateway.port, level=level)
    raw.send_raw(encode(Publish(topic="early", payload=b"x"), level))
    raw.until_closed(2.0)
    still_healthy(gateway, ok, b"after")


def test_connect_with_reserved_flag_closes(gateway: Gateway, paho_factory: PahoFactory) -> None:
    ok = healthy(gateway, paho_factory)
    raw = RawClient(gateway.port, level=4)
    body = mqtt_str("MQTT") + bytes([4, 0x03]) + (60).to_bytes(2, "big") + mqtt_str("resv")  # bit 0 set
    raw.send_raw(b"\x10" + varint(len(body)) + body)
    got = raw.until_closed(2.0)
    assert all(isinstance(p, Connack) and p.reason_code != 0 for p in got), got
    still_healthy(gateway, ok, b"after")


def test_garbage_bytes_close(gateway: Gateway, paho_factory: PahoFactory) -> None:
    ok = healthy(gateway, paho_factory)
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=2) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        s.settimeout(2.0)
        try:
            while s.recv(4096):
                pass
        except ConnectionResetError:
            pass
    still_healthy(gateway, ok, b"after")


@pytest.mark.tidewire_only  # Mosquitto has no connect timeout setting
def test_half_open_socket_closed_after_connect_timeout(gateway_factory: GatewayFactory,
                                                       paho_factory: PahoFactory) -> None:
    gw = gateway_factory(env={"TIDEWIRE_CONNECT_TIMEOUT": "1"})
    ok = healthy(gw, paho_factory)
    with socket.create_connection(("127.0.0.1", gw.port), timeout=5) as s:
        start = time.monotonic()
        s.settimeout(4.0)
        try:
            data = s.recv(4096)
        except ConnectionResetError:
            data = b""
        except TimeoutError:
            pytest.fail("half-open socket still open after 4 s with connect_timeout 1")
        elapsed = time.monotonic() - start
    assert data == b""
    assert 0.8 <= elapsed <= 2.5, f"closed after {elapsed:.2f}s"
    still_healthy(gw, ok, b"after")
