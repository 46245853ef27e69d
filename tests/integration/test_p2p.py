"""P2P messages end to end: a PUBLISH to `<first>/p2p/<clientId>` reaches only that client, with no
subscription, now or when its persistent session next connects; wildcard subscribers never see it."""

from __future__ import annotations

import pytest

from tests.integration.conftest import Gateway, PahoClient, PahoFactory

pytestmark = pytest.mark.tidewire_only  # P2P addressing is a Tidewire feature
# Every publish is asserted accepted (reason code 0): a refused one would make a test's "nothing arrives" pass.


def connect(gateway: Gateway, paho_factory: PahoFactory, client_id: str, version: int = 5,
            clean: bool = True, session_expiry: int | None = None) -> PahoClient:
    c = paho_factory(gateway.port, client_id, version=version, clean=clean)
    c.connect(session_expiry=session_expiry)
    return c


@pytest.mark.parametrize("version", [4, 5])
def test_p2p_reaches_only_the_addressed_client(gateway: Gateway, paho_factory: PahoFactory, version: int) -> None:
    target = connect(gateway, paho_factory, f"p2p-dev-{version}", version)
    bystander = connect(gateway, paho_factory, f"p2p-other-{version}", version)
    pub = connect(gateway, paho_factory, f"p2p-pub-{version}")
    assert pub.publish(f"app/p2p/p2p-dev-{version}", b"for you", qos=1) == 0
    msg = target.get()
    assert (msg.topic, msg.payload, msg.qos) == (f"app/p2p/p2p-dev-{version}", b"for you", 1)
    target.assert_nothing(0.3)
    bystander.assert_nothing(0.3)


def test_p2p_not_delivered_to_wildcard_or_exact_subscribers(gateway: Gateway, paho_factory: PahoFactory) -> None:
    target = connect(gateway, paho_factory, "p2p-dev-w")
    watchers: dict[str, PahoClient] = {}
    for flt in ("app/#", "#", "app/p2p/+", "app/p2p/p2p-dev-w"):
        w = connect(gateway, paho_factory, f"p2p-watch-{len(watchers)}")
        w.subscribe(flt, 1)
        watchers[flt] = w
    pub = connect(gateway, paho_factory, "p2p-pub-w")
    assert pub.publish("app/p2p/p2p-dev-w", b"private", qos=1) == 0
    pub.publish("app/other", b"public", qos=1)  # control: the watchers do receive ordinary traffic
    assert target.get().payload == b"private"
    target.assert_nothing(0.3)
    for flt in ("app/#", "#"):
        assert [m.payload for m in watchers[flt].expect(1)] == [b"public"], flt
    for flt, w in watchers.items():
        w.assert_nothing(0.3 if flt in ("app/#", "#") else 0.1)


def test_p2p_queued_for_persistent_session(gateway: Gateway, paho_factory: PahoFactory) -> None:
    dev = connect(gateway, paho_factory, "p2p-sleepy", clean=False, session_expiry=300)
    dev.disconnect()
    pub = connect(gateway, paho_factory, "p2p-pub-q")
    for i in range(3):
        assert pub.publish("fleet/p2p/p2p-sleepy", f"cmd{i}".encode(), qos=1) == 0
    back = paho_factory(gateway.port, "p2p-sleepy", version=5, clean=False)
    assert back.connect(session_expiry=300).session_present
    assert [m.payload for m in back.expect(3)] == [b"cmd0", b"cmd1", b"cmd2"]
    back.assert_nothing(0.3)
    # a different client that connects later does not get them
    connect(gateway, paho_factory, "p2p-sleepy2").assert_nothing(0.3)


def test_p2p_for_a_clean_session_is_not_kept(gateway: Gateway, paho_factory: PahoFactory) -> None:
    dev = connect(gateway, paho_factory, "p2p-gone")
    dev.disconnect()
    pub = connect(gateway, paho_factory, "p2p-pub-gone")
    assert pub.publish("app/p2p/p2p-gone", b"late", qos=1) == 0
    connect(gateway, paho_factory, "p2p-gone").assert_nothing(0.5)
