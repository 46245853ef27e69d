"""A session started clean holds only what an idle client needs: its record, P2P subscription and in-flight table
are made when first needed (a subscription, a message sent to it, a save, a takeover, a delivery), as they would
have been at its start, and everything a client does later still works. A real node (embedded store, a clock
moved by hand) under channels with recorded connections."""

from __future__ import annotations

from typing import Any

import pytest

from tests.gateway.fakeclock import FakeClock
from tests.gateway.protocols.mqtt.fakeio import FakeIo, channel, until
from tidewire.gateway.node import Node
from tidewire.gateway.protocols.mqtt.channel import MqttChannel
from tidewire.gateway.protocols.mqtt.codec import (
    Connack,
    Connect,
    Disconnect,
    PropertyId,
    Puback,
    Publish,
    Pubrec,
    ReasonCode,
    Suback,
    Subscribe,
    SubscriptionRequest,
    Unsuback,
    Unsubscribe,
    encode,
)
from tidewire.gateway.sessions.session import Session
from tidewire.store.base import SessionRecord, SubscriptionRecord, p2p_queue


def connected(node: Node, clock: FakeClock, client_id: str, **connect: Any) -> tuple[MqttChannel, FakeIo]:
    conn, io = channel(node, clock)
    conn.receive(encode(Connect(client_id, protocol_level=5, **connect), 5))
    return conn, io


def session_of(conn: MqttChannel) -> Session:
    assert conn.session is not None
    return conn.session


async def publishes(io: FakeIo, n: int) -> list[Publish]:
    got: list[Any] = []

    def arrived() -> bool:
        got.extend(io.packets())
        return sum(isinstance(p, Publish) for p in got) >= n

    await until(arrived, f"{n} PUBLISH")
    return [p for p in got if isinstance(p, Publish)]


async def test_an_idle_clean_client_has_no_p2p_subscription_until_one_is_sent(clocked_node: Node,
                                                                              clock: FakeClock) -> None:
    start = clocked_node.store.last_seq()
    dev, dev_io = connected(clocked_node, clock, "dev")
    assert isinstance(dev_io.packets()[0], Connack)
    session = session_of(dev)
    assert session.p2p_sub is None and session.subscriptions == {} and session.inflight == {}
    assert session._record is None  # made when first needed: here, by the P2P message
    pub, _ = connected(clocked_node, clock, "pub")
    pub.receive(encode(Publish("app/p2p/dev", b"for you", qos=1, packet_id=1), 5))
    [got] = await publishes(dev_io, 1)
    assert (got.topic, got.payload) == ("app/p2p/dev", b"for you")
    assert session.p2p_sub is not None and session.p2p_sub.since_seq == start  # as if made at the start
    assert list(session.subscriptions) == [p2p_queue("dev")]


async def test_a_clean_client_that_subscribes_gets_its_topics_and_its_p2p_messages(clocked_node: Node,
                                                                                 clock: FakeClock) -> None:
    dev, dev_io = connected(clocked_node, clock, "dev")
    dev_io.packets()
    start = clocked_node.store.last_seq()
    dev.receive(encode(Unsubscribe(1, ["s/#"]), 5))
    assert dev_io.packets() == [Unsuback(1, [ReasonCode.NO_SUBSCRIPTION_EXISTED])]
    dev.receive(encode(Subscribe(2, [SubscriptionRequest("s/#", 1)]), 5))
    await until(lambda: any(isinstance(p, Suback) for p in dev_io.packets()), "the SUBACK")
    session = session_of(dev)
    assert session.p2p_sub is None
    # the record made at SUBSCRIBE is the one a clean start used to make at CONNECT
    assert session.record == SessionRecord("dev", 5, 0, {"s/#": SubscriptionRecord("s/#", 1, since_seq=start)},
                                           offset=start, sent_upto=start, owner=clocked_node.node_id)
    pub, _ = connected(clocked_node, clock, "pub")
    pub.receive(encode(Publish("s/1", b"topic", qos=1, packet_id=1), 5))
    [first] = await publishes(dev_io, 1)
    pub.receive(encode(Publish("app/p2p/dev", b"direct", qos=1, packet_id=2), 5))
    [second] = await publishes(dev_io, 1)
    assert [first.payload, second.payload] == [b"topic", b"direct"]


@pytest.mark.parametrize("expiry", [0, 600])
async def test_a_clean_session_taken_over_keeps_its_p2p_queue_from_its_start(clocked_node: Node, clock: FakeClock,
                                                                           expiry: int) -> None:
    start = clocked_node.store.last_seq()
    first, _ = connected(clocked_node, clock, "dev")
    assert session_of(first).p2p_sub is None
    pub, _ = connected(clocked_node, clock, "pub")
    pub.receive(encode(Publish("elsewhere", b"x", qos=1, packet_id=1), 5))
    await until(lambda: clocked_node.store.last_seq() > start, "the append")  # the log moved on meanwhile
    props = {PropertyId.SESSION_EXPIRY_INTERVAL: expiry}
    second, second_io = connected(clocked_node, clock, "dev", clean_start=False, properties=props)
    await until(lambda: bool(second_io.out), "the second CONNACK")
    assert second_io.packets()[0].session_present is True and first.closed
    p2p_sub = session_of(second).p2p_sub
    assert p2p_sub is not None and p2p_sub.since_seq == start
    if not expiry:
        return
    await clocked_node.writes.session_settled("dev")
    stored = await clocked_node.store.get_session("dev")
    assert stored is not None and stored.subscriptions[p2p_queue("dev")].since_seq == start
    second.receive(encode(Disconnect(), 5))
    before = clocked_node.store.last_seq()
    pub.receive(encode(Publish("app/p2p/dev", b"while away", qos=1, packet_id=2), 5))
    await until(lambda: clocked_node.store.last_seq() > before, "the P2P append")
    third, third_io = connected(clocked_node, clock, "dev", clean_start=False, properties=props)
    [got] = await publishes(third_io, 1)
    assert got.payload == b"while away" and third.session is not None


async def test_what_one_clean_client_has_in_flight_is_its_own(clocked_node: Node, clock: FakeClock) -> None:
    """Idle sessions share one empty in-flight table: a delivery to one of them must not show in another."""
    busy, busy_io = connected(clocked_node, clock, "busy")
    idle, _ = connected(clocked_node, clock, "idle")
    busy.receive(encode(Subscribe(1, [SubscriptionRequest("s/#", 2)]), 5))
    await until(lambda: any(isinstance(p, Suback) for p in busy_io.packets()), "the SUBACK")
    pub, _ = connected(clocked_node, clock, "pub")
    pub.receive(encode(Publish("s/1", b"one", qos=1, packet_id=1), 5) + encode(Publish("s/2", b"two", qos=2,
                                                                                       packet_id=2), 5))
    got = await publishes(busy_io, 2)
    assert sorted(p.qos for p in got) == [1, 2]
    assert sorted(session_of(busy).inflight) == sorted(p.packet_id for p in got)
    quiet = session_of(idle)
    assert quiet.inflight == {}
    busy.receive(b"".join(encode(Puback(p.packet_id) if p.qos == 1 else Pubrec(p.packet_id), 5) for p in got))
    await until(lambda: len(session_of(busy).inflight) == 1, "the QoS 1 ack")
    assert session_of(busy).snapshot().outbound_pubrel == [p.packet_id for p in got if p.qos == 2]
    assert quiet.inflight == {} and quiet.snapshot().outbound_pubrel == []
