"""QoS end to end: downgrade to min(pub, sub), QoS 2 exactly once, full outbound QoS 2 flow, DUP redelivery."""

from __future__ import annotations

import time

import pytest

from tests.integration.conftest import Gateway, GatewayFactory, PahoFactory
from tests.integration.rawmqtt import RawClient
from tidewire.gateway.protocols.mqtt.codec import (
    Connack,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    SubscriptionRequest,
)


@pytest.mark.parametrize("version", [4, 5])
def test_outbound_qos_is_min_of_publish_and_subscription(gateway: Gateway, paho_factory: PahoFactory,
                                                         version: int) -> None:
    subs = {}
    for sub_qos in (0, 1, 2):
        s = paho_factory(gateway.port, f"qmin-sub{sub_qos}", version=version)
        s.connect()
        assert s.subscribe("qos/min", sub_qos) == [sub_qos]
        subs[sub_qos] = s
    pub = paho_factory(gateway.port, "qmin-pub", version=version)
    pub.connect()
    for pub_qos in (0, 1, 2):
        pub.publish("qos/min", f"p{pub_qos}".encode(), qos=pub_qos)
    for sub_qos, s in subs.items():
        got = sorted((m.payload, m.qos) for m in s.expect(3))
        assert got == [(f"p{q}".encode(), min(q, sub_qos)) for q in (0, 1, 2)], f"sub qos {sub_qos}: {got}"
        s.assert_nothing(0.2)


@pytest.mark.parametrize("level", [4, 5])
def test_inbound_qos2_exactly_once_with_dup_resend(gateway: Gateway, paho_factory: PahoFactory,
                                                   level: int) -> None:
    sub = paho_factory(gateway.port, f"q2once-sub{level}", version=5)
    sub.connect()
    sub.subscribe("qos/once", 2)
    raw = RawClient(gateway.port, level=level)
    raw.connect(f"q2once-raw{level}")
    raw.publish("qos/once", b"one", qos=2, packet_id=7)
    assert raw.expect(Pubrec).packet_id == 7
    raw.publish("qos/once", b"one", qos=2, packet_id=7, dup=True)  # as if PUBREC got lost
    assert raw.expect(Pubrec).packet_id == 7
    raw.send(Pubrel(packet_id=7))
    comp = raw.expect(Pubcomp)
    assert (comp.packet_id, comp.reason_code) == (7, 0)
    msg = sub.get()
    assert (msg.payload, msg.qos) == (b"one", 2)
    sub.assert_nothing(0.7)
    # the id is free again: a new message with id 7 is a new message
    raw.publish("qos/once", b"two", qos=2, packet_id=7)
    assert raw.expect(Pubrec).packet_id == 7
    raw.send(Pubrel(packet_id=7))
    assert raw.expect(Pubcomp).packet_id == 7
    assert sub.get().payload == b"two"


@pytest.mark.parametrize("level", [4, 5])
def test_inbound_qos1_and_qos0(gateway: Gateway, paho_factory: PahoFactory, level: int) -> None:
    sub = paho_factory(gateway.port, f"q01-sub{level}", version=5)
    sub.connect()
    sub.subscribe("qos/01", 2)
    raw = RawClient(gateway.port, level=level)
    raw.connect(f"q01-raw{level}")
    raw.publish("qos/01", b"zero", qos=0)
    raw.publish("qos/01", b"one", qos=1, packet_id=11)
    ack = raw.expect(Puback)
    assert (ack.packet_id, ack.reason_code) in ((11, 0), (11, 0x10))
    got = sorted((m.payload, m.qos) for m in sub.expect(2))
    assert got == [(b"one", 1), (b"zero", 0)]


def test_outbound_qos2_flow_completes_beyond_inflight_window(gateway_factory: GatewayFactory,
                                                             paho_factory: PahoFactory) -> None:
    # If PUBREC/PUBREL/PUBCOMP did not complete, the window (5) would fill and delivery would stall.
    gw = gateway_factory(env={"TIDEWIRE_MAX_INFLIGHT": "5"})
    sub = paho_factory(gw.port, "q2flow-sub", version=4)
    sub.connect()
    sub.subscribe("qos/flow", 2)
    pub = paho_factory(gw.port, "q2flow-pub", version=4)
    pub.connect()
    n = 60
    for i in range(n):
        pub.publish("qos/flow", str(i).encode(), qos=2)  # one at a time: only the outbound window is tested
    got = sub.expect(n, timeout=10.0)
    assert [int(m.payload) for m in got] == list(range(n))
    assert all(m.qos == 2 for m in got)


@pytest.mark.parametrize("level", [4, 5])
def test_unacked_qos1_redelivered_with_dup_on_reconnect(gateway: Gateway, paho_factory: PahoFactory,
                                                        level: int) -> None:
    props = {0x11: 300} if level == 5 else {}
    raw = RawClient(gateway.port, level=level)
    raw.connect(f"dup-raw{level}", clean_start=False, properties=props)
    raw.send(Subscribe(packet_id=1, subscriptions=[SubscriptionRequest("qos/dup", 1)]))
    assert raw.expect(Suback).reason_codes == [1]
    pub = paho_factory(gateway.port, f"dup-pub{level}", version=4)
    pub.connect()
    for i in range(3):
        pub.publish("qos/dup", f"d{i}".encode(), qos=1)
    first = [raw.expect(Publish) for _ in range(3)]
    assert [p.payload for p in first] == [b"d0", b"d1", b"d2"]
    assert not any(p.dup for p in first)
    raw.disconnect()  # without acking anything

    raw = RawClient(gateway.port, level=level)
    ack: Connack = raw.connect(f"dup-raw{level}", clean_start=False, properties=props)
    assert ack.session_present is True
    again = [raw.expect(Publish) for _ in range(3)]
    assert [p.payload for p in again] == [b"d0", b"d1", b"d2"]
    assert all(p.dup and p.qos == 1 for p in again), again
    for p in again:
        raw.send(Puback(packet_id=p.packet_id))
    raw.nothing(0.3)
    raw.disconnect()

    raw = RawClient(gateway.port, level=level)
    assert raw.connect(f"dup-raw{level}", clean_start=False, properties=props).session_present is True
    raw.nothing(0.7)


@pytest.mark.slow  # waits out a protocol timer (make test-slow)
@pytest.mark.tidewire_only  # Mosquitto 2.x never resends on a live connection
def test_311_unacked_qos1_retried_with_dup_on_same_connection(gateway_factory: GatewayFactory,
                                                              paho_factory: PahoFactory) -> None:
    gw = gateway_factory(env={"TIDEWIRE_RETRY_INTERVAL": "1"})
    raw = RawClient(gw.port, level=4)
    raw.connect("retry-raw")
    raw.send(Subscribe(packet_id=1, subscriptions=[SubscriptionRequest("qos/retry", 1)]))
    raw.expect(Suback)
    pub = paho_factory(gw.port, "retry-pub", version=4)
    pub.connect()
    pub.publish("qos/retry", b"r", qos=1)
    first = raw.expect(Publish)
    assert not first.dup
    start = time.monotonic()
    again = raw.expect(Publish, timeout=3.0)
    elapsed = time.monotonic() - start
    assert (again.payload, again.packet_id, again.dup) == (b"r", first.packet_id, True)
    assert 0.5 <= elapsed <= 2.5, f"resent after {elapsed:.2f}s with retry interval 1s"
    raw.send(Puback(packet_id=again.packet_id))
    raw.nothing(2.0)  # acked: no more retries
