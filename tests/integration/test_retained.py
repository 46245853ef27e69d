"""Retained messages end to end: set, replace, delete, delivery on subscribe, retain flags, restart."""

from __future__ import annotations

import pytest

from tests.integration.conftest import Gateway, GatewayFactory, PahoFactory
from tests.store.delaying import delaying_env


@pytest.mark.parametrize("version", [4, 5])
def test_retained_set_replace_delete(gateway: Gateway, paho_factory: PahoFactory, version: int) -> None:
    pub = paho_factory(gateway.port, "ret-pub", version=version)
    pub.connect()
    pub.publish("ret/a", b"v1", qos=1, retain=True)
    pub.publish("ret/a", b"v2", qos=1, retain=True)  # replaces v1
    pub.publish("ret/b", b"b1", qos=1, retain=True)

    exact = paho_factory(gateway.port, "ret-exact", version=version)
    exact.connect()
    exact.subscribe("ret/a", 1)
    m = exact.get()
    assert (m.topic, m.payload, m.retain, m.qos) == ("ret/a", b"v2", True, 1)
    exact.assert_nothing(0.3)

    wild = paho_factory(gateway.port, "ret-wild", version=version)
    wild.connect()
    wild.subscribe("ret/+", 1)
    got = sorted((m.topic, m.payload, m.retain) for m in wild.expect(2))
    assert got == [("ret/a", b"v2", True), ("ret/b", b"b1", True)]

    pub.publish("ret/a", b"", qos=1, retain=True)  # delete
    late = paho_factory(gateway.port, "ret-late", version=version)
    late.connect()
    late.subscribe("ret/#", 1)
    assert [(m.topic, m.payload) for m in late.expect(1)] == [("ret/b", b"b1")]
    late.assert_nothing(0.3)


def test_live_delivery_has_retain_0_and_qos0_retained_kept(gateway: Gateway, paho_factory: PahoFactory) -> None:
    sub = paho_factory(gateway.port, "ret-live-sub", version=4)
    sub.connect()
    sub.subscribe("ret/live", 1)
    pub = paho_factory(gateway.port, "ret-live-pub", version=4)
    pub.connect()
    pub.publish("ret/live", b"x", qos=0, retain=True)
    m = sub.get()
    assert (m.payload, m.retain) == (b"x", False)
    late = paho_factory(gateway.port, "ret-live-late", version=4)
    late.connect()
    late.subscribe("ret/live", 1)
    m = late.get()
    assert (m.payload, m.retain, m.qos) == (b"x", True, 0)


def test_non_retained_publish_does_not_replace_retained(gateway: Gateway, paho_factory: PahoFactory) -> None:
    pub = paho_factory(gateway.port, "ret-nr-pub", version=5)
    pub.connect()
    pub.publish("ret/nr", b"kept", qos=1, retain=True)
    pub.publish("ret/nr", b"transient", qos=1, retain=False)
    late = paho_factory(gateway.port, "ret-nr-late", version=5)
    late.connect()
    late.subscribe("ret/nr", 1)
    assert late.get().payload == b"kept"
    late.assert_nothing(0.3)


def test_retained_survive_restart(gateway: Gateway, paho_factory: PahoFactory) -> None:
    pub = paho_factory(gateway.port, "ret-rs-pub", version=4)
    pub.connect()
    pub.publish("ret/rs/1", b"one", qos=1, retain=True)
    pub.publish("ret/rs/2", b"two", qos=0, retain=True)
    pub.publish("ret/rs/3", b"gone", qos=1, retain=True)
    pub.publish("ret/rs/3", b"", qos=1, retain=True)
    pub.disconnect()
    gateway.restart()
    sub = paho_factory(gateway.port, "ret-rs-sub", version=4)
    sub.connect()
    sub.subscribe("ret/rs/#", 1)
    got = sorted((m.topic, m.payload, m.retain) for m in sub.expect(2))
    assert got == [("ret/rs/1", b"one", True), ("ret/rs/2", b"two", True)]
    sub.assert_nothing(0.3)


@pytest.mark.tidewire_only  # a store that answers late: retained messages found while the session reads the store
def test_retained_reach_a_new_subscriber_on_a_slow_store(gateway_factory: GatewayFactory,
                                                         paho_factory: PahoFactory) -> None:
    gw = gateway_factory(env=delaying_env(5))
    pub = paho_factory(gw.port, "ret-slow-pub", version=5)
    pub.connect()
    for i in range(3):
        pub.publish(f"ret/slow/{i}", str(i).encode(), qos=1, retain=True)
    for attempt in range(3):  # each a new session: the retained lookup races its first store read
        sub = paho_factory(gw.port, f"ret-slow-sub{attempt}", version=5)
        sub.connect()
        sub.subscribe("ret/slow/#", 1)
        assert sorted(m.payload for m in sub.expect(3)) == [b"0", b"1", b"2"]
        sub.disconnect()
