"""Sessions end to end: persistence across reconnects, clean start, 5.0 session expiry, takeover."""

from __future__ import annotations

import time

import pytest

from tests.integration.conftest import Gateway, PahoFactory


@pytest.mark.parametrize("version", [4, 5])
def test_persistent_session_keeps_subscriptions_and_queues_messages(
        gateway: Gateway, paho_factory: PahoFactory, version: int) -> None:
    expiry = 300 if version == 5 else None
    sub = paho_factory(gateway.port, f"persist-{version}", version=version, clean=False)
    assert sub.connect(session_expiry=expiry).session_present is False
    sub.subscribe("sess/t", 1)
    sub.disconnect()

    pub = paho_factory(gateway.port, "persist-pub", version=version)
    pub.connect()
    for i in range(3):
        pub.publish("sess/t", f"m{i}".encode(), qos=1)

    res = sub.connect(session_expiry=expiry)
    assert res.session_present is True
    got = sub.expect(3)
    assert [m.payload for m in got] == [b"m0", b"m1", b"m2"]
    assert all(m.qos == 1 for m in got)
    # the subscription itself survived, not only the queue
    pub.publish("sess/t", b"live", qos=1)
    assert sub.get().payload == b"live"


@pytest.mark.parametrize("version", [4, 5])
def test_clean_start_discards_session(gateway: Gateway, paho_factory: PahoFactory, version: int) -> None:
    expiry = 300 if version == 5 else None
    sub = paho_factory(gateway.port, f"discard-{version}", version=version, clean=False)
    sub.connect(session_expiry=expiry)
    sub.subscribe("sess/d", 1)
    sub.disconnect()
    pub = paho_factory(gateway.port, "discard-pub", version=version)
    pub.connect()
    pub.publish("sess/d", b"queued", qos=1)

    fresh = paho_factory(gateway.port, f"discard-{version}", version=version, clean=True)
    assert fresh.connect(session_expiry=expiry).session_present is False
    fresh.assert_nothing(0.5)
    pub.publish("sess/d", b"after", qos=1)
    fresh.assert_nothing(0.5)


def test_v5_session_expiry_0_is_gone_at_disconnect(gateway: Gateway, paho_factory: PahoFactory) -> None:
    sub = paho_factory(gateway.port, "exp0", version=5, clean=False)
    sub.connect(session_expiry=0)
    sub.subscribe("sess/e0", 1)
    sub.disconnect()
    pub = paho_factory(gateway.port, "exp0-pub", version=5)
    pub.connect()
    pub.publish("sess/e0", b"lost", qos=1)
    res = sub.connect(clean_start=False, session_expiry=0)
    assert res.session_present is False
    sub.assert_nothing(0.5)


@pytest.mark.slow  # waits out a protocol timer (make test-slow)
def test_v5_session_expiry_2s(gateway: Gateway, paho_factory: PahoFactory) -> None:
    quick = paho_factory(gateway.port, "exp2-quick", version=5, clean=False)
    slow = paho_factory(gateway.port, "exp2-slow", version=5, clean=False)
    for c in (quick, slow):
        c.connect(session_expiry=2)
        c.subscribe("sess/e2", 1)
        c.disconnect()
    pub = paho_factory(gateway.port, "exp2-pub", version=5)
    pub.connect()
    pub.publish("sess/e2", b"m", qos=1)

    time.sleep(0.5)  # the behaviour under test: a while into the 2 s expiry, the session is still there
    res = quick.connect(clean_start=False, session_expiry=2)
    assert res.session_present is True, "session expired too early"
    assert quick.get().payload == b"m"

    time.sleep(2.6)  # the behaviour under test: past the 2 s expiry (slow disconnected ~3.1 s ago)
    res = slow.connect(clean_start=False, session_expiry=2)
    assert res.session_present is False, "session outlived its 2 s expiry"
    slow.assert_nothing(0.5)


@pytest.mark.tidewire_only  # Mosquitto 2.0.11 closes the old connection without a DISCONNECT packet
def test_v5_takeover_sends_disconnect_0x8e_to_old_client(gateway: Gateway, paho_factory: PahoFactory) -> None:
    old = paho_factory(gateway.port, "taken8e", version=5, clean=False)
    old.connect(session_expiry=300)
    new = paho_factory(gateway.port, "taken8e", version=5, clean=False)
    new.connect(clean_start=False, session_expiry=300)
    assert old.wait_disconnect(3.0) == 0x8E


def test_v5_takeover_new_client_gets_the_session(gateway: Gateway, paho_factory: PahoFactory) -> None:
    old = paho_factory(gateway.port, "taken", version=5, clean=False)
    old.connect(session_expiry=300)
    old.subscribe("sess/take", 1)

    new = paho_factory(gateway.port, "taken", version=5, clean=False)
    res = new.connect(clean_start=False, session_expiry=300)
    old.wait_disconnect(3.0)
    assert res.session_present is True
    pub = paho_factory(gateway.port, "take-pub", version=5)
    pub.connect()
    pub.publish("sess/take", b"to-new", qos=1)
    assert new.get().payload == b"to-new"
    old.assert_nothing(0.3)
    assert new.disconnects.empty()


def test_311_takeover_closes_old_connection(gateway: Gateway, paho_factory: PahoFactory) -> None:
    old = paho_factory(gateway.port, "taken311", version=4, clean=False)
    old.connect()
    old.subscribe("sess/take311", 1)
    new = paho_factory(gateway.port, "taken311", version=4, clean=False)
    res = new.connect()
    old.wait_disconnect(3.0)
    assert res.session_present is True
    pub = paho_factory(gateway.port, "take311-pub", version=4)
    pub.connect()
    pub.publish("sess/take311", b"to-new", qos=1)
    assert new.get().payload == b"to-new"
