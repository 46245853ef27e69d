"""Session expiry on the node's clock, moved by hand: a persistent session whose client stays away past its
Session Expiry Interval is removed by housekeeping (`expire_sessions`), not a moment before; its disconnect time
is the node's clock's too. No socket, no sleep: an MQTT channel on a recorder, a real node and embedded store."""

from __future__ import annotations

from tests.gateway.fakeclock import FakeClock
from tests.gateway.protocols.mqtt.fakeio import channel, until
from tidewire.gateway.node import Node
from tidewire.gateway.ops.housekeeping import expire_sessions
from tidewire.gateway.protocols.mqtt.codec import Connack, Connect, PropertyId, encode

EXPIRY_S = 60


async def _park(node: Node, clock: FakeClock, client_id: str, expiry: int, clean_start: bool = False) -> bool:
    """Connect (5.0, this Session Expiry Interval), then lose the connection; returns CONNACK's session_present."""
    conn, io = channel(node, clock)
    conn.receive(encode(Connect(client_id, protocol_level=5, clean_start=clean_start,
                                properties={PropertyId.SESSION_EXPIRY_INTERVAL: expiry}), 5))
    await until(lambda: bool(io.out), "the CONNACK")
    [ack] = io.packets()
    assert isinstance(ack, Connack) and ack.reason_code == 0
    conn.connection_lost("connection lost")
    await node.writes.session_settled(client_id)
    return ack.session_present


async def test_a_persistent_session_past_its_expiry_interval_is_removed(clocked_node: Node,
                                                                         clock: FakeClock) -> None:
    node, store = clocked_node, clocked_node.store
    await _park(node, clock, "sleeper", EXPIRY_S)
    await _park(node, clock, "forever", 0xFFFFFFFF)  # never expires
    record = await store.get_session("sleeper")
    assert record is not None and record.disconnected_at_ms == int(clock.wall * 1000)  # the node's clock
    clock.advance(EXPIRY_S - 1)
    await expire_sessions(node)
    assert await store.get_session("sleeper") is not None  # not a moment early
    clock.advance(1)
    await expire_sessions(node)
    assert await store.get_session("sleeper") is None
    clock.advance(10 * 365 * 86400)
    await expire_sessions(node)
    assert await store.get_session("forever") is not None


async def test_a_client_back_before_its_session_expired_finds_it(clocked_node: Node, clock: FakeClock) -> None:
    node = clocked_node
    assert await _park(node, clock, "back", EXPIRY_S) is False
    clock.advance(EXPIRY_S - 1)
    assert await _park(node, clock, "back", EXPIRY_S) is True  # present: its expiry counts from this disconnect
    clock.advance(EXPIRY_S - 1)
    await expire_sessions(node)
    assert await node.store.get_session("back") is not None
    clock.advance(1)
    assert await _park(node, clock, "back", EXPIRY_S) is False  # expired when it came back: a new session
