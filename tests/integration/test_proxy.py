"""PROXY protocol v2 on the MQTT listener: the real client address (from the load balancer's header) is what
`$SYS` events and the logs see; a connection without a header, or from an untrusted peer, gets nothing."""

from __future__ import annotations

import json
import socket
import struct

import pytest

from tests.integration.conftest import GatewayFactory
from tests.integration.rawmqtt import ConnectionClosed, RawClient
from tidewire.gateway.protocols.mqtt.codec import Publish, Suback, Subscribe, SubscriptionRequest

pytestmark = pytest.mark.tidewire_only  # Mosquitto 2.0.11 has no PROXY protocol

SIGNATURE = b"\r\n\r\n\x00\r\nQUIT\n"


def proxy_v2(source: tuple[str, int], destination: tuple[str, int] = ("10.0.0.1", 1883)) -> bytes:
    body = (socket.inet_aton(source[0]) + socket.inet_aton(destination[0])
            + struct.pack("!HH", source[1], destination[1]))
    return SIGNATURE + bytes([0x21, 0x11]) + struct.pack("!H", len(body)) + body


def behind_balancer(port: int, source: tuple[str, int], level: int = 5) -> RawClient:
    client = RawClient(port, level=level)
    client.send_raw(proxy_v2(source))
    return client


def test_real_address_reaches_sys_events_and_logs(gateway_factory: GatewayFactory) -> None:
    gw = gateway_factory(env={"TIDEWIRE_PROXY_PROTOCOL": "true"})
    watcher = behind_balancer(gw.port, ("203.0.113.9", 5555))
    watcher.connect("watcher")
    watcher.send(Subscribe(1, [SubscriptionRequest("$SYS/brokers/+/clients/+/connected", 0)]))
    # Its own connect event may come first: a server may send matching PUBLISHes before the SUBACK (3.8.4).
    packet = watcher.recv()
    while isinstance(packet, Publish):
        packet = watcher.recv()
    assert isinstance(packet, Suback)
    device = behind_balancer(gw.port, ("198.51.100.7", 4242), level=4)
    device.connect("behind-lb")
    while True:
        event = watcher.expect(Publish)
        if event.topic.endswith("/behind-lb/connected"):
            break
    assert json.loads(event.payload)["address"] == "198.51.100.7:4242"
    device.disconnect()
    watcher.disconnect()
    assert "198.51.100.7:4242" in gw.stderr


def test_no_header_or_untrusted_peer_is_closed_unanswered(gateway_factory: GatewayFactory) -> None:
    gw = gateway_factory(env={"TIDEWIRE_PROXY_PROTOCOL": "true", "TIDEWIRE_PROXY_PROTOCOL_TIMEOUT": "1"})
    bare = RawClient(gw.port, level=5)
    with pytest.raises(ConnectionClosed):
        bare.connect("no-header")  # the CONNECT is not a PROXY header
    bare.close()
    ok = behind_balancer(gw.port, ("192.0.2.1", 1))
    ok.connect("still-served")
    ok.disconnect()

    strict = gateway_factory(env={"TIDEWIRE_PROXY_PROTOCOL": "true",
                                  "TIDEWIRE_PROXY_PROTOCOL_TRUSTED": '["10.0.0.0/8"]'})
    spoofer = behind_balancer(strict.port, ("192.0.2.66", 1))
    with pytest.raises(ConnectionClosed):
        spoofer.connect("spoofer")
    spoofer.close()
    assert "not from a trusted proxy" in strict.stderr
