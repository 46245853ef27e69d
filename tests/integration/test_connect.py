"""CONNECT/CONNACK end to end: return/reason codes, CONNACK properties, client ids, keepalive."""

from __future__ import annotations

import time

import pytest

from tests.integration.conftest import TARGET, Gateway, GatewayFactory, PahoFactory
from tests.integration.rawmqtt import RawClient, mqtt_str, varint
from tidewire.gateway.protocols.mqtt.codec import Connack


def raw_connect_bytes(level: int, client_id: str, flags: int = 0x02, name: str = "MQTT") -> bytes:
    body = mqtt_str(name) + bytes([level, flags]) + (60).to_bytes(2, "big")
    if level == 5:
        body += b"\x00"  # empty property block
    body += mqtt_str(client_id)
    return b"\x10" + varint(len(body)) + body


def test_311_unsupported_level_gets_code_1_then_close(gateway: Gateway) -> None:
    raw = RawClient(gateway.port, level=4)
    raw.send_raw(raw_connect_bytes(6, "badlevel"))
    got = raw.until_closed(2.0)
    assert got, "no CONNACK before close"
    assert isinstance(got[0], Connack) and got[0].reason_code == 1, got


def test_311_empty_client_id_with_clean_0_gets_code_2(gateway: Gateway) -> None:
    raw = RawClient(gateway.port, level=4)
    raw.send_raw(raw_connect_bytes(4, "", flags=0x00))
    got = raw.until_closed(2.0)
    assert got and isinstance(got[0], Connack) and got[0].reason_code == 2, got


def test_311_empty_client_id_clean_1_gets_distinct_server_ids(gateway: Gateway, paho_factory: PahoFactory) -> None:
    # Two anonymous clients must get different ids: if they shared one, the second would take over the first.
    a = paho_factory(gateway.port, "", version=4)
    b = paho_factory(gateway.port, "", version=4)
    assert a.connect().reason_code == 0
    assert b.connect().reason_code == 0
    a.subscribe("anon/t", 1)
    b.publish("anon/t", b"x", qos=1)
    assert a.get().payload == b"x"
    assert a.disconnects.empty() and b.disconnects.empty()


def test_v5_connack_properties_are_right(gateway_factory: GatewayFactory, paho_factory: PahoFactory) -> None:
    gw = gateway_factory(env={"TIDEWIRE_MAX_PACKET_SIZE": "65536"})
    c = paho_factory(gw.port, "props-client", version=5)
    res = c.connect()
    p = res.properties
    assert res.session_present is False
    assert p.get("MaximumPacketSize") == 65536, p
    if "ReceiveMaximum" in p:
        assert 1 <= p["ReceiveMaximum"] <= 65535
    if "TopicAliasMaximum" in p:
        assert 0 <= p["TopicAliasMaximum"] <= 65535
    if "MaximumQoS" in p:
        assert p["MaximumQoS"] in (0, 1), "MaximumQoS 2 must not be sent"
    # Retained messages and wildcards are supported (other tests use them): never advertise otherwise.
    assert p.get("RetainAvailable", 1) == 1
    assert p.get("WildcardSubscriptionAvailable", 1) == 1
    for flag in ("SubscriptionIdentifierAvailable", "SharedSubscriptionAvailable"):
        assert p.get(flag, 1) in (0, 1)
    assert "AssignedClientIdentifier" not in p, "id was given by the client"


def test_v5_empty_client_id_gets_assigned_identifier(gateway: Gateway, paho_factory: PahoFactory) -> None:
    a = paho_factory(gateway.port, "", version=5)
    b = paho_factory(gateway.port, "", version=5)
    ida = a.connect().properties.get("AssignedClientIdentifier")
    idb = b.connect().properties.get("AssignedClientIdentifier")
    assert isinstance(ida, str) and ida
    assert isinstance(idb, str) and idb and idb != ida


def test_silent_client_closed_after_1_5_keepalive_and_will_published(
        gateway: Gateway, paho_factory: PahoFactory) -> None:
    from tidewire.gateway.protocols.mqtt.codec import Will

    watcher = paho_factory(gateway.port, "ka-watcher", version=4)
    watcher.connect()
    watcher.subscribe("ka/will", 1)
    raw = RawClient(gateway.port, level=4)
    raw.connect("ka-silent", keepalive=1, will=Will(topic="ka/will", payload=b"gone", qos=1))
    start = time.monotonic()
    raw.until_closed(8.0)
    elapsed = time.monotonic() - start
    # Mosquitto 2.0.11 checks keepalives only every few seconds; Tidewire must be close to 1.5 x keepalive.
    limit = 8.0 if TARGET == "mosquitto" else 3.0
    assert 1.0 <= elapsed <= limit, f"closed after {elapsed:.2f}s, expected ~1.5s"
    msg = watcher.get(2.0)
    assert (msg.topic, msg.payload) == ("ka/will", b"gone")


@pytest.mark.slow  # waits out a protocol timer (make test-slow)
def test_active_client_with_short_keepalive_stays_connected(gateway: Gateway, paho_factory: PahoFactory) -> None:
    c = paho_factory(gateway.port, "ka-active", version=5, keepalive=1)
    c.connect()  # paho sends PINGREQ every keepalive
    time.sleep(3.0)  # the behaviour under test: twice the 1.5 x keepalive a silent client would be closed after
    assert c.disconnects.empty()
    c.subscribe("ka/alive", 0)
    c.publish("ka/alive", b"ok")
    assert c.get().payload == b"ok"


def test_v5_max_keepalive_sent_as_server_keep_alive(gateway_factory: GatewayFactory,
                                                     paho_factory: PahoFactory) -> None:
    gw = gateway_factory(max_keepalive=10)
    c = paho_factory(gw.port, "ka-v5", version=5, keepalive=60)
    res = c.connect()
    assert res.properties.get("ServerKeepAlive") == 10


@pytest.mark.tidewire_only  # Mosquitto rejects a 3.1.1 keepalive above max_keepalive (and 0) instead
@pytest.mark.parametrize("keepalive", [60, 0])
def test_311_keepalive_above_max_is_accepted(gateway_factory: GatewayFactory, paho_factory: PahoFactory,
                                              keepalive: int) -> None:
    gw = gateway_factory(max_keepalive=10)
    c = paho_factory(gw.port, f"ka-311-{keepalive}", version=4, keepalive=keepalive)
    assert c.connect().reason_code == 0
    c.subscribe("ka/311", 0)
    c.publish("ka/311", b"ok")
    assert c.get().payload == b"ok"
