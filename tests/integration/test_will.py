"""Will messages end to end: abnormal close vs DISCONNECT, 5.0 reason 0x04, will delay, will retain."""

from __future__ import annotations

import time

import pytest
from paho.mqtt.packettypes import PacketTypes

from tests.integration.conftest import TARGET, Gateway, PahoClient, PahoFactory, v5_props


def watcher(gateway: Gateway, paho_factory: PahoFactory, topic: str) -> PahoClient:
    w = paho_factory(gateway.port, f"watch-{topic.replace('/', '-')}", version=5)
    w.connect()
    w.subscribe(topic, 1)
    return w


@pytest.mark.parametrize("version", [4, 5])
def test_will_published_on_abnormal_close(gateway: Gateway, paho_factory: PahoFactory, version: int) -> None:
    w = watcher(gateway, paho_factory, f"will/abn{version}")
    c = paho_factory(gateway.port, f"will-abn-{version}", version=version)
    c.client.will_set(f"will/abn{version}", b"died", qos=1)
    c.connect()
    c.drop()
    msg = w.get(3.0)
    assert (msg.topic, msg.payload, msg.qos) == (f"will/abn{version}", b"died", 1)
    w.assert_nothing(0.3)


@pytest.mark.parametrize("version", [4, 5])
def test_no_will_after_normal_disconnect(gateway: Gateway, paho_factory: PahoFactory, version: int) -> None:
    w = watcher(gateway, paho_factory, f"will/norm{version}")
    c = paho_factory(gateway.port, f"will-norm-{version}", version=version)
    c.client.will_set(f"will/norm{version}", b"died", qos=1)
    c.connect()
    c.disconnect()
    w.assert_nothing(1.0)


def test_v5_disconnect_with_will_0x04_sends_will(gateway: Gateway, paho_factory: PahoFactory) -> None:
    w = watcher(gateway, paho_factory, "will/x04")
    c = paho_factory(gateway.port, "will-x04", version=5)
    c.client.will_set("will/x04", b"asked", qos=1)
    c.connect()
    c.disconnect(reason_code=0x04)
    assert w.get(3.0).payload == b"asked"


@pytest.mark.slow  # waits out a protocol timer (make test-slow)
def test_v5_will_delay_interval_delays_the_will(gateway: Gateway, paho_factory: PahoFactory) -> None:
    w = watcher(gateway, paho_factory, "will/delay")
    c = paho_factory(gateway.port, "will-delay", version=5, clean=False)
    c.client.will_set("will/delay", b"late", qos=1,
                      properties=v5_props(PacketTypes.WILLMESSAGE, WillDelayInterval=2))
    c.connect(session_expiry=30)
    c.drop()
    start = time.monotonic()
    msg = w.get(5.0)
    elapsed = time.monotonic() - start
    assert msg.payload == b"late"
    assert 1.5 <= elapsed <= 4.0, f"will after {elapsed:.2f}s, delay was 2s"


@pytest.mark.slow  # waits out a protocol timer (make test-slow)
def test_v5_will_delay_cancelled_by_reconnect(gateway: Gateway, paho_factory: PahoFactory) -> None:
    w = watcher(gateway, paho_factory, "will/cancel")
    c = paho_factory(gateway.port, "will-cancel", version=5, clean=False)
    c.client.will_set("will/cancel", b"late", qos=1,
                      properties=v5_props(PacketTypes.WILLMESSAGE, WillDelayInterval=2))
    c.connect(session_expiry=30)
    if TARGET == "tidewire":
        gone = paho_factory(gateway.port, "will-cancel-sys", version=5)
        gone.connect()
        gone.subscribe("$SYS/brokers/+/clients/will-cancel/disconnected", 0)
    c.drop()
    if TARGET == "tidewire":
        gone.get(3.0)  # the node saw the connection drop: the will's delay runs
    else:
        time.sleep(0.5)  # Mosquitto reports no such event: time for it to see the drop
    again = paho_factory(gateway.port, "will-cancel", version=5, clean=False)
    assert again.connect(session_expiry=30).session_present is True
    w.assert_nothing(3.0)


def test_will_retain_flag_honoured(gateway: Gateway, paho_factory: PahoFactory) -> None:
    w = watcher(gateway, paho_factory, "will/ret")
    c = paho_factory(gateway.port, "will-ret", version=4)
    c.client.will_set("will/ret", b"retained-will", qos=1, retain=True)
    c.connect()
    c.drop()
    assert w.get(3.0).retain is False  # live delivery to an existing subscriber: retain=0
    late = paho_factory(gateway.port, "will-ret-late", version=4)
    late.connect()
    late.subscribe("will/ret", 1)
    msg = late.get(3.0)
    assert (msg.payload, msg.retain) == (b"retained-will", True)
