"""Another broker's bridge on an MQTT channel, sans-IO (a real node on an embedded store; the connection is a
recorder): the level byte's top bit (Mosquitto's try_private, 0x83/0x84) or an MQTT 5 CONNECT user property marks
the connection a bridge unless `accept_bridges` is off; a 3.x bridge's subscriptions get no-local and
retain-as-published; what a bridge publishes is stored with protocol `bridge`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from tests.gateway.fakeclock import FakeClock
from tests.gateway.protocols.mqtt.fakeio import FakeIo, channel, until
from tidewire.extensions.hooks import AllowAll
from tidewire.gateway.config import Settings
from tidewire.gateway.node import Node
from tidewire.gateway.protocols.mqtt.channel import MqttChannel
from tidewire.gateway.protocols.mqtt.codec import (
    Connack,
    Connect,
    PropertyId,
    Puback,
    Publish,
    ReasonCode,
    Suback,
    Subscribe,
    SubscriptionRequest,
    encode,
)
from tidewire.gateway.protocols.mqtt.connect import BRIDGE_PROPERTY
from tidewire.gateway.protocols.mqtt.subscribing import bridge_requests
from tidewire.lookup.base import InProcessLookup
from tidewire.notify.base import LocalNotifier
from tidewire.store.base import PROTOCOL_BRIDGE, PROTOCOL_MQTT, PROTOCOL_NAMES, SubscriptionRecord
from tidewire.store.embedded.engine import EmbeddedStore


@asynccontextmanager
async def running(tmp_path: Path, **settings: Any) -> AsyncIterator[Node]:
    store = EmbeddedStore(tmp_path, fsync="never")
    await store.open()
    lookup = InProcessLookup()
    node = Node(Settings(data_dir=tmp_path, port=0, sys_events=False, node_id="n1", **settings), store, lookup,
                LocalNotifier(lookup), AllowAll(), clock=FakeClock())
    await node.start()
    try:
        yield node
    finally:
        await node.stop()
        await store.close()


def connected(node: Node, connect: Connect) -> tuple[MqttChannel, FakeIo, Connack]:
    assert isinstance(node.clock, FakeClock)
    conn, io = channel(node, node.clock)
    conn.receive(encode(connect, connect.protocol_level))
    [ack] = io.packets(connect.protocol_level)
    assert isinstance(ack, Connack), ack
    return conn, io, ack


def subscriptions(conn: MqttChannel) -> dict[str, SubscriptionRecord]:
    assert conn.session is not None
    return {key: sub for key, sub in conn.session.subscriptions.items() if not key.startswith("p2p#")}


def test_the_level_bit_is_written_for_a_bridge_and_stored_protocols_name_it() -> None:
    assert encode(Connect("b", 4, bridge=True), 4)[8] == 0x84
    assert encode(Connect("b", 4, protocol_name="MQIsdp", bridge=True), 4)[10] == 0x83
    assert PROTOCOL_NAMES[PROTOCOL_BRIDGE] == "bridge"


async def test_a_311_bridge_subscribes_no_local_and_retain_as_published_and_publishes_as_bridge(
        tmp_path: Path) -> None:
    async with running(tmp_path) as node:
        bridge, io, ack = connected(node, Connect("mosq-bridge", 4, bridge=True))
        assert ack.reason_code == 0 and bridge.bridge and bridge.level == 4
        bridge.receive(encode(Subscribe(1, [SubscriptionRequest("t/#", 1), SubscriptionRequest("$share/g/s/#", 1)]),
                              4))
        await until(lambda: bool(io.out), "the SUBACK")
        assert io.packets(4) == [Suback(1, [1, 1])]
        subs = subscriptions(bridge)
        assert (subs["t/#"].no_local, subs["t/#"].retain_as_published) == (True, True)
        # The shared one keeps no-local off (MQTT 5 forbids it there); its retain flags still pass.
        shared = next(sub for key, sub in subs.items() if key.startswith("$share/"))
        assert (shared.no_local, shared.retain_as_published) == (False, True)

        bridge.receive(encode(Publish("t/from-bridge", b"b", 1, packet_id=3), 4))
        await until(lambda: bool(io.out), "the PUBACK")
        assert io.packets(4) == [Puback(3)]
        [stored] = (await node.store.read("t/from-bridge", 0, 10)).messages
        assert (stored.protocol, stored.publisher) == (PROTOCOL_BRIDGE, "mosq-bridge")
        assert node.counters.by_protocol()["bridge"] == (1, 1, 0, 0)

        # Its own message never comes back (no-local); another's retained one keeps its retain flag.
        device, _, _ = connected(node, Connect("dev", 4))
        device.receive(encode(Publish("t/state", b"on", 1, retain=True, packet_id=4), 4))
        await until(lambda: bool(io.out), "the retained message at the bridge")
        [got] = io.packets(4)
        assert isinstance(got, Publish) and (got.topic, got.retain) == ("t/state", True)
        [stored] = (await node.store.read("t/state", 0, 10)).messages
        assert stored.protocol == PROTOCOL_MQTT


async def test_mqisdp_0x83_is_a_31_bridge(tmp_path: Path) -> None:
    async with running(tmp_path) as node:
        bridge, _, ack = connected(node, Connect("b31", 4, protocol_name="MQIsdp", bridge=True))
        assert ack.reason_code == 0 and bridge.bridge


async def test_a_plain_311_client_keeps_its_subscription_options(tmp_path: Path) -> None:
    async with running(tmp_path) as node:
        client, io, ack = connected(node, Connect("plain", 4))
        assert ack.reason_code == 0 and not client.bridge
        client.receive(encode(Subscribe(1, [SubscriptionRequest("t/#", 1)]), 4))
        await until(lambda: bool(io.out), "the SUBACK")
        sub = subscriptions(client)["t/#"]
        assert (sub.no_local, sub.retain_as_published) == (False, False)


async def test_with_accept_bridges_off_a_311_bridge_is_refused_as_an_unacceptable_version(tmp_path: Path) -> None:
    async with running(tmp_path, accept_bridges=False) as node:
        bridge, _, ack = connected(node, Connect("mosq-bridge", 4, bridge=True))
        assert ack.reason_code == 1 and bridge.closed and "mosq-bridge" not in node.connections
        plain, _, ack = connected(node, Connect("mosq-bridge", 4))  # what Mosquitto's bridge tries next
        assert ack.reason_code == 0 and not plain.bridge


async def test_an_mqtt5_bridge_says_so_with_a_user_property(tmp_path: Path) -> None:
    marker: dict[int, Any] = {PropertyId.USER_PROPERTY: [("other", "x"), BRIDGE_PROPERTY]}
    async with running(tmp_path) as node:
        bridge, io, ack = connected(node, Connect("tw-bridge", 5, properties=marker))
        assert ack.reason_code == 0 and bridge.bridge
        # MQTT 5 subscription options are the bridge's own: nothing is added.
        bridge.receive(encode(Subscribe(1, [SubscriptionRequest("t/#", 1)]), 5))
        await until(lambda: bool(io.out), "the SUBACK")
        io.packets(5)
        sub = subscriptions(bridge)["t/#"]
        assert (sub.no_local, sub.retain_as_published) == (False, False)
        bridge.receive(encode(Publish("t/v5", b"5", 1, packet_id=1), 5))
        await until(lambda: bool(io.out), "the PUBACK")
        [stored] = (await node.store.read("t/v5", 0, 10)).messages
        assert stored.protocol == PROTOCOL_BRIDGE
        other, _, _ = connected(node, Connect("not-a-bridge", 5, properties={
            PropertyId.USER_PROPERTY: [("tidewire-bridge", "0")]}))
        assert not other.bridge


async def test_with_accept_bridges_off_the_mqtt5_property_is_ignored(tmp_path: Path) -> None:
    async with running(tmp_path, accept_bridges=False) as node:
        marker: dict[int, Any] = {PropertyId.USER_PROPERTY: [BRIDGE_PROPERTY]}
        conn, _, ack = connected(node, Connect("tw-bridge", 5, properties=marker))
        assert ack.reason_code == 0 and not conn.bridge
        refused, _, ack = connected(node, Connect("bit5", 5, bridge=True))  # 0x85: the bit is refused at any level
        assert ack.reason_code == ReasonCode.UNSUPPORTED_PROTOCOL_VERSION and refused.closed


def test_bridge_requests_keep_filter_and_qos() -> None:
    assert bridge_requests([SubscriptionRequest("a/+", 2)]) == [SubscriptionRequest("a/+", 2, True, True)]
