"""Limits on what is kept for offline sessions, against a running node with paho clients: a returning session
gets only the newest `max_queued_messages` of its backlog (the older counted as dropped, reason queue_full), and
past `max_stored_sessions` the offline sessions nearest their expiry are expired early (counted as evicted)."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.conftest import Gateway, GatewayFactory, PahoFactory
from tests.waiting import wait_until

pytestmark = pytest.mark.tidewire_only

# The overload guard off: these tests count what the caps drop, not the 0x89s of a machine busy elsewhere.
STEADY = {"TIDEWIRE_OVERLOAD_LOOP_LAG_MS": "0"}


def metric(gateway: Gateway, name: str, **labels: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{gateway.admin_port}/metrics", timeout=5.0).text
    return sum(s.value for family in text_string_to_metric_families(text) for s in family.samples
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


@pytest.mark.parametrize("version", [4, 5])
def test_a_returning_session_gets_the_newest_of_its_backlog(gateway_factory: GatewayFactory,
                                                            paho_factory: PahoFactory, version: int) -> None:
    """50 messages published while a persistent session is away, cap 10: on its return it receives exactly the
    10 newest, in order, none twice, and the 40 older count as dropped. Before the cap it received all 50."""
    gw = gateway_factory(env={**STEADY, "TIDEWIRE_MAX_QUEUED_MESSAGES": "10"}, admin=True)
    expiry = 300 if version == 5 else None
    sub = paho_factory(gw.port, f"cap-sub-{version}", version=version, clean=False)
    sub.connect(session_expiry=expiry)
    sub.subscribe([("cap/a", 1), ("cap/b/+", 1)])  # two queues: the cut is over their merge
    sub.disconnect()
    pub = paho_factory(gw.port, f"cap-pub-{version}", version=version)
    pub.connect()
    for i in range(50):
        assert pub.publish("cap/a" if i % 2 else f"cap/b/{i}", f"m{i}".encode(), qos=1) == 0

    assert sub.connect(session_expiry=expiry).session_present is True
    got = [m.payload for m in sub.expect(10, timeout=10)]
    sub.assert_nothing(0.5)
    assert got == [f"m{i}".encode() for i in range(40, 50)]
    assert metric(gw, "tidewire_dropped_total", reason="queue_full") == 40
    # live traffic afterwards is not capped away
    pub.publish("cap/a", b"live", qos=1)
    assert sub.get().payload == b"live"
    # under the cap nothing is dropped: the session leaves and returns to 5 waiting
    sub.disconnect()
    for i in range(5):
        pub.publish("cap/a", f"n{i}".encode(), qos=1)
    sub.connect(session_expiry=expiry)
    got_back = [sub.get(timeout=10)]
    while got_back[-1].payload != b"n4":
        got_back.append(sub.get(timeout=10))
    # "live" again (DUP) if its PUBACK had not reached the node before the disconnect: at least once
    assert [m.payload for m in got_back if m.payload != b"live"] == [f"n{i}".encode() for i in range(5)]
    assert all(m.dup for m in got_back if m.payload == b"live")
    assert metric(gw, "tidewire_dropped_total", reason="queue_full") == 40


def test_stored_sessions_over_the_cap_lose_those_nearest_expiry(gateway_factory: GatewayFactory,
                                                               paho_factory: PahoFactory) -> None:
    """30 offline persistent sessions, cap 20: housekeeping expires early the 10 nearest their expiry (the
    shortest session expiry intervals), counts them, and the 20 others are still there. Before the cap all 30
    stayed stored."""
    gw = gateway_factory(env={**STEADY, "TIDEWIRE_MAX_STORED_SESSIONS": "20"}, admin=True)
    for i in range(30):
        c = paho_factory(gw.port, f"ev-{i:02d}", clean=False)
        c.connect(session_expiry=1000 + i * 10)  # ev-00 expires first
        c.subscribe(f"ev/{i}", 1)
        c.disconnect()
    wait_until(lambda: metric(gw, "tidewire_sessions_evicted_total") >= 10, timeout=15, interval=0.2)
    present = []
    for i in range(30):
        # session expiry 0 on the check: a session absent is not stored again by looking for it
        c = paho_factory(gw.port, f"ev-{i:02d}", clean=False)
        present.append(c.connect(clean_start=False, session_expiry=0).session_present)
        c.disconnect()
    assert present == [False] * 10 + [True] * 20
    assert metric(gw, "tidewire_sessions_evicted_total") == 10


@pytest.mark.slow
def test_evicted_sessions_wildcards_stop_being_held(gateway_factory: GatewayFactory,
                                                   paho_factory: PahoFactory) -> None:
    """10 offline sessions each with a wildcard filter of its own, cap 4: once the 6 nearest expiry are evicted,
    the node holds (indexes, keeps in memory) only the 4 survivors' filters, as `$SYS .../queues/wildcard` shows,
    and a survivor still gets what was published to its filter while it was away. Before, the evicted sessions'
    filters stayed held until the next restart."""
    gw = gateway_factory(env={**STEADY, "TIDEWIRE_MAX_STORED_SESSIONS": "4", "TIDEWIRE_SYS_INTERVAL": "0.2",
                              "TIDEWIRE_STORED_FILTERS_CHECK_INTERVAL": "0.2"}, admin=True)
    for i in range(10):
        c = paho_factory(gw.port, f"wf-{i}", clean=False)
        c.connect(session_expiry=1000 + i * 10)  # wf-0 expires first
        c.subscribe(f"wf/{i}/+/cmd", 1)
        c.disconnect()
    wait_until(lambda: metric(gw, "tidewire_sessions_evicted_total") >= 6, timeout=15, interval=0.2)
    watcher = paho_factory(gw.port, "wf-watch")
    watcher.connect()
    watcher.subscribe("$SYS/brokers/+/stats/queues/wildcard", 0)
    held: list[int] = []

    def survivors_held() -> bool:
        held.append(int(watcher.get(timeout=5).payload))
        return held[-1] == 4 + 1  # and the watcher's own

    wait_until(survivors_held, timeout=15, interval=0, what=lambda: f"5 filters held; the gauge read {held[-5:]}")
    pub = paho_factory(gw.port, "wf-pub")
    pub.connect()
    assert pub.publish("wf/9/x/cmd", b"kept", qos=1) == 0
    survivor = paho_factory(gw.port, "wf-9", clean=False)
    assert survivor.connect(clean_start=False, session_expiry=1090).session_present is True
    assert survivor.get(timeout=10).payload == b"kept"
