"""Shared subscriptions `$share/<group>/<filter>` end to end (3.1.1 via amqtt, 5.0 via paho, raw members).

Each message goes to exactly one member of a group; unacked messages of a member that dies go to the others;
members with a small Receive Maximum and slow acks get less, never more than their window; an offline
persistent member receives the backlog; the distribution strategy is configurable.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field

import pytest
from amqtt.client import MQTTClient

from tests.integration.conftest import Gateway, GatewayFactory, PahoClient, PahoFactory
from tests.integration.rawmqtt import ConnectionClosed, RawClient
from tests.store.delaying import delaying_env
from tests.waiting import wait_until
from tidewire.gateway.protocols.mqtt.codec import Connack, Puback, Publish, Suback, Subscribe, SubscriptionRequest

RECEIVE_MAXIMUM = 0x21
SESSION_EXPIRY = 0x11


def paho_member(gateway: Gateway, paho_factory: PahoFactory, client_id: str, share: str, version: int = 5,
                clean: bool = True, session_expiry: int | None = None) -> PahoClient:
    c = paho_factory(gateway.port, client_id, version=version, clean=clean)
    c.connect(session_expiry=session_expiry)
    assert c.subscribe(share, 1) == [1]
    return c


def publish_numbered(gateway: Gateway, paho_factory: PahoFactory, topic: str, n: int, wait: bool = True) -> None:
    pub = paho_factory(gateway.port, f"pub-{topic.replace('/', '-')}", version=5)
    pub.connect()
    mids = [pub.publish(topic, str(i).encode(), qos=1, wait=False) for i in range(n)]
    if wait:
        for mid in mids:
            pub.wait_ack(mid, timeout=30.0)


def drain(c: PahoClient, quiet: float = 0.6) -> list[int]:
    out: list[int] = []
    while True:
        try:
            out.append(int(c.messages.get(timeout=quiet).payload))
        except queue.Empty:
            return out


def test_v5_each_message_to_exactly_one_member(gateway: Gateway, paho_factory: PahoFactory) -> None:
    members = [paho_member(gateway, paho_factory, f"sh5-{i}", "$share/g5/sh5/t") for i in range(3)]
    plain = paho_member(gateway, paho_factory, "sh5-plain", "sh5/t")
    other_group = paho_member(gateway, paho_factory, "sh5-other", "$share/other/sh5/+")
    publish_numbered(gateway, paho_factory, "sh5/t", 60)
    got = [drain(m) for m in members]
    flat = [x for g in got for x in g]
    assert sorted(flat) == list(range(60)), f"duplicates or losses: {Counter(flat).most_common(3)}"
    assert all(got), f"a member got nothing: {[len(g) for g in got]}"
    assert sorted(drain(plain)) == list(range(60)), "a plain subscription gets every message"
    assert sorted(drain(other_group)) == list(range(60)), "every group gets every message once"


def test_v5_member_sees_real_topic(gateway: Gateway, paho_factory: PahoFactory) -> None:
    m = paho_member(gateway, paho_factory, "shtopic", "$share/gt/shtopic/#")
    publish_numbered(gateway, paho_factory, "shtopic/a/b", 1)
    assert m.get().topic == "shtopic/a/b"


async def test_311_amqtt_each_message_to_exactly_one_member(gateway: Gateway) -> None:
    members = []
    for i in range(2):
        c = MQTTClient(client_id=f"sham-{i}", config={"auto_reconnect": False, "keep_alive": 10})
        await c.connect(f"mqtt://127.0.0.1:{gateway.port}/", cleansession=True)
        assert await c.subscribe([("$share/gam/sham/t", 1)]) == [1]
        members.append(c)
    pub = MQTTClient(client_id="sham-pub", config={"auto_reconnect": False})
    await pub.connect(f"mqtt://127.0.0.1:{gateway.port}/", cleansession=True)
    try:
        for i in range(20):
            await pub.publish("sham/t", str(i).encode(), qos=1)
        got: list[list[int]] = [[], []]
        for idx, c in enumerate(members):
            while True:
                try:
                    m = await c.deliver_message(timeout_duration=0.6)
                except TimeoutError:
                    break
                assert m is not None and m.topic == "sham/t"
                got[idx].append(int(bytes(m.data)))
        flat = got[0] + got[1]
        assert sorted(flat) == list(range(20)), f"duplicates or losses: {got}"
    finally:
        for c in [pub, *members]:
            await c.disconnect()


# -- raw members: withheld acks, abrupt death, speed ----------------------------------------------

def raw_member(gateway: Gateway, client_id: str, share: str, receive_max: int = 10) -> RawClient:
    raw = RawClient(gateway.port, level=5)
    raw.connect(client_id, properties={RECEIVE_MAXIMUM: receive_max})
    raw.send(Subscribe(packet_id=1, subscriptions=[SubscriptionRequest(share, 1)]))
    assert raw.expect(Suback).reason_codes == [1]
    return raw


def raw_drain(raw: RawClient, quiet: float = 0.6, ack: bool = True) -> list[Publish]:
    out: list[Publish] = []
    while True:
        try:
            p = raw.recv(quiet)
        except (AssertionError, ConnectionClosed):
            return out
        if isinstance(p, Publish):
            out.append(p)
            if ack:
                raw.send(Puback(packet_id=p.packet_id))


@pytest.mark.tidewire_only  # Mosquitto drops a clean member's unacked messages instead of re-dispatching
@pytest.mark.slow  # seconds long: `make test-slow` keeps `make test` under its 10 minutes
def test_killed_member_unacked_messages_go_to_the_others(gateway: Gateway, paho_factory: PahoFactory) -> None:
    # The doomed member is alone at first: it ends up holding its whole window (5) unacked, the rest waits.
    doomed = raw_member(gateway, "shk-doomed", "$share/gk/shk/t", receive_max=5)
    publish_numbered(gateway, paho_factory, "shk/t", 30)
    held = raw_drain(doomed, quiet=0.5, ack=False)
    assert len(held) == 5, f"the doomed member holds {len(held)} unacked, its receive maximum is 5"
    alive = [raw_member(gateway, f"shk-alive{i}", "$share/gk/shk/t", receive_max=50) for i in range(2)]
    doomed.sock.shutdown(2)  # abrupt: no DISCONNECT
    doomed.close()
    got = [raw_drain(a, quiet=1.5) for a in alive]
    flat = [int(p.payload) for g in got for p in g]
    assert sorted(flat) == list(range(30)), (
        f"survivors must get everything once; doomed held {[int(p.payload) for p in held]}; "
        f"duplicates {[k for k, v in Counter(flat).items() if v > 1]}; missing {set(range(30)) - set(flat)}")


@pytest.mark.slow  # waits out several of the groups' reclaim rounds (1 s)
def test_slow_but_connected_member_keeps_its_unacked_messages(gateway: Gateway, paho_factory: PahoFactory) -> None:
    """MQTT has no visibility timeout: what a connected member holds unacknowledged for longer than the groups'
    reclaim rounds stays its own; no other member gets it."""
    slow = raw_member(gateway, "shs-slow", "$share/gs/shs/t", receive_max=5)
    publish_numbered(gateway, paho_factory, "shs/t", 20)
    held = [int(p.payload) for p in raw_drain(slow, quiet=0.5, ack=False)]
    assert len(held) == 5, f"the slow member holds {held}, its receive maximum is 5"
    fast = raw_member(gateway, "shs-fast", "$share/gs/shs/t", receive_max=50)
    got = [int(p.payload) for p in raw_drain(fast, quiet=3.5)]
    assert sorted(got) == sorted(set(range(20)) - set(held)), f"the fast member got {sorted(got)}, held {held}"


@dataclass(slots=True)
class SpeedMember:
    """A raw member acking each message `delay` seconds after it arrived, counting its own unacked ones."""

    raw: RawClient
    delay: float
    got: list[int] = field(default_factory=list)
    max_unacked: int = 0
    _due: deque[tuple[float, int]] = field(default_factory=deque)

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set() or self._due:
            now = time.monotonic()
            while self._due and self._due[0][0] <= now:
                self.raw.send(Puback(packet_id=self._due.popleft()[1]))
            wait = min(0.05, max(0.0005, self._due[0][0] - now)) if self._due else 0.05
            try:
                p = self.raw.recv(wait)
            except (AssertionError, ConnectionClosed):
                continue
            if isinstance(p, Publish):
                self.got.append(int(p.payload))
                self._due.append((time.monotonic() + self.delay, p.packet_id))
                self.max_unacked = max(self.max_unacked, len(self._due))


def run_speed_group(gateway: Gateway, paho_factory: PahoFactory, name: str, n: int,
                    delays: tuple[float, ...], window: int) -> list[SpeedMember]:
    members = [SpeedMember(raw_member(gateway, f"{name}{i}", f"$share/{name}/{name}/t", window), d)
               for i, d in enumerate(delays)]
    stop = threading.Event()
    threads = [threading.Thread(target=m.run, args=(stop,), daemon=True) for m in members]
    for t in threads:
        t.start()
    try:
        publish_numbered(gateway, paho_factory, f"{name}/t", n)
        wait_until(lambda: sum(len(m.got) for m in members) >= n, timeout=45,
                   what=lambda: f"{n} messages over the members, got {[len(m.got) for m in members]}")
        time.sleep(0.3)  # absence: a duplicate would show up now (no event to wait on)
    finally:
        stop.set()
        for t in threads:
            t.join(5)
    return members


def test_many_messages_exactly_once_across_members_at_different_speeds(gateway: Gateway,
                                                                       paho_factory: PahoFactory) -> None:
    n = 3000
    members = run_speed_group(gateway, paho_factory, "shspeed", n, (0.0, 0.002, 0.02), window=10)
    flat = [x for m in members for x in m.got]
    dup = [k for k, v in Counter(flat).items() if v > 1]
    assert not dup and sorted(flat) == list(range(n)), (
        f"got {len(flat)} of {n}, duplicates {dup[:10]}, per member {[len(m.got) for m in members]}")


@pytest.mark.slow  # seconds: members of three speeds take a stream
@pytest.mark.tidewire_only  # Mosquitto round-robins regardless of readiness and overfills windows
def test_fast_members_get_more_and_no_member_exceeds_its_window(gateway: Gateway,
                                                                paho_factory: PahoFactory) -> None:
    n = 10_000
    members = run_speed_group(gateway, paho_factory, "shfair", n, (0.0, 0.002, 0.02), window=10)
    counts = [len(m.got) for m in members]
    flat = [x for m in members for x in m.got]
    assert sorted(flat) == list(range(n)), f"got {len(flat)} of {n} (per member {counts})"
    assert max(m.max_unacked for m in members) <= 10, \
        f"unacked in flight per member {[m.max_unacked for m in members]}, receive maximum 10"
    assert counts[0] > counts[1] > counts[2], f"per member {counts}: faster members must get more"
    assert counts[2] < n / 6, f"the slowest member (20 ms/ack) got {counts[2]} of {n}"


# -- offline members --------------------------------------------------------------------------------

def test_offline_persistent_member_gets_the_backlog(gateway: Gateway, paho_factory: PahoFactory) -> None:
    durable = paho_member(gateway, paho_factory, "shoff-dur", "$share/goff/shoff/t", clean=False,
                          session_expiry=60)
    transient = paho_member(gateway, paho_factory, "shoff-tr", "$share/goff/shoff/t")
    durable.disconnect()
    transient.disconnect()  # its subscription ends with its session
    publish_numbered(gateway, paho_factory, "shoff/t", 10)
    back = paho_factory(gateway.port, "shoff-dur", version=5, clean=False)
    assert back.connect(session_expiry=60).session_present
    assert sorted(drain(back, quiet=1.0)) == list(range(10))


@pytest.mark.tidewire_only  # Mosquitto splits the backlog between the offline members' session queues
def test_first_returning_member_gets_whole_backlog(gateway: Gateway, paho_factory: PahoFactory) -> None:
    for i in range(2):
        paho_member(gateway, paho_factory, f"shret{i}", "$share/gret/shret/t", clean=False,
                    session_expiry=60).disconnect()
    publish_numbered(gateway, paho_factory, "shret/t", 10)
    back = paho_factory(gateway.port, "shret1", version=5, clean=False)
    assert back.connect(session_expiry=60).session_present
    assert sorted(drain(back, quiet=1.0)) == list(range(10))


# -- strategy ---------------------------------------------------------------------------------------

@pytest.mark.tidewire_only
def test_round_robin_strategy_splits_evenly(gateway_factory: GatewayFactory, paho_factory: PahoFactory) -> None:
    gw = gateway_factory(env={"TIDEWIRE_SHARED_STRATEGY": "round_robin"})
    members = [paho_member(gw, paho_factory, f"shrr{i}", "$share/grr/shrr/t") for i in range(3)]
    publish_numbered(gw, paho_factory, "shrr/t", 31)
    got = [drain(m) for m in members]
    assert sorted(x for g in got for x in g) == list(range(31))
    counts = sorted(len(g) for g in got)
    assert counts[-1] - counts[0] <= 1, f"round robin split {counts}"


def test_shared_subscription_available_in_connack(gateway: Gateway) -> None:
    raw = RawClient(gateway.port, level=5)
    ack: Connack = raw.connect("shavail")
    assert ack.properties.get(0x2A, 1) == 1, f"Shared Subscription Available: {ack.properties}"


@pytest.mark.tidewire_only  # a store that answers late: the member's connection is bound after its group tried
def test_returning_member_gets_backlog_on_a_slow_store(gateway_factory: GatewayFactory,
                                                       paho_factory: PahoFactory) -> None:
    gw = gateway_factory(env=delaying_env(5))
    for i in range(2):
        paho_member(gw, paho_factory, f"shslow{i}", "$share/gslow/shslow/t", clean=False,
                    session_expiry=60).disconnect()
    publish_numbered(gw, paho_factory, "shslow/t", 10)
    back = paho_factory(gw.port, "shslow1", version=5, clean=False)
    assert back.connect(session_expiry=60).session_present
    assert sorted(drain(back, quiet=1.0)) == list(range(10))
