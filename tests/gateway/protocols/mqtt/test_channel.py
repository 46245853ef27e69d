"""The MQTT channel with no socket and a clock moved by hand: every state, refusal and timer is driven through
`MqttChannel.receive`, `deadline_due` and the timers it asked its `ChannelIo` for, and read back from the bytes
it wrote. The node under it is real (embedded store in a temporary directory) and reads the same clock; only the
connection is a recorder."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.gateway.fakeclock import FakeClock
from tests.gateway.protocols.mqtt.fakeio import FakeIo, Timer, until
from tidewire.extensions.hooks import AllowAll, ClientInfo, SubscribeAccess
from tidewire.gateway.config import Settings
from tidewire.gateway.node import Node
from tidewire.gateway.protocols.mqtt.channel import MqttChannel
from tidewire.gateway.protocols.mqtt.codec import (
    PINGREQ,
    Connack,
    Connect,
    Disconnect,
    Pingreq,
    Pingresp,
    PropertyId,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    ReasonCode,
    Suback,
    Subscribe,
    SubscriptionRequest,
    Unsuback,
    Unsubscribe,
    Will,
    encode,
)
from tidewire.gateway.sessions.wills import DelayedWills
from tidewire.gateway.transport.listeners import Listener
from tidewire.gateway.transport.ratelimit import InboundLimiter
from tidewire.lookup.base import InProcessLookup
from tidewire.notify.base import LocalNotifier
from tidewire.store.embedded.engine import EmbeddedStore


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[Node]:
    settings = Settings(data_dir=tmp_path, port=0, sys_events=False, node_id="n1", connect_timeout=10,
                        close_drain_timeout=2, max_client_id_length=64, max_topic_length=256)
    store = EmbeddedStore(tmp_path, fsync="never")
    await store.open()
    lookup = InProcessLookup()
    made = Node(settings, store, lookup, LocalNotifier(lookup), AllowAll(), clock=FakeClock())
    await made.start()
    try:
        yield made
    finally:
        await made.stop()
        await store.close()


def _listener() -> Listener:
    return Listener("mqtt", max_connections=100, rate=None, proxy_protocol=False)


@dataclass
class Client:
    """One channel with its recorder and clock."""

    channel: MqttChannel
    io: FakeIo
    clock: FakeClock
    level: int = 5

    def send(self, *packets: Any) -> None:
        self.channel.receive(b"".join(encode(p, self.level) for p in packets))

    def got(self) -> list[Any]:
        return self.io.packets(self.level)


def _client(node: Node, level: int = 5, clock: FakeClock | None = None, listener: Listener | None = None) -> Client:
    if clock is None:  # the node's, as a listener's connections have
        assert isinstance(node.clock, FakeClock)
        clock = node.clock
    io = FakeIo(clock)
    return Client(MqttChannel(node, listener or _listener(), io, "10.0.0.7:50000", clock), io, clock, level)


# -- CONNECT ------------------------------------------------------------------------------------------------

def _connack(packets: list[Any]) -> Connack:
    assert len(packets) == 1 and isinstance(packets[0], Connack), packets
    return packets[0]


async def test_a_clean_connect_is_answered_in_the_same_call_and_arms_keepalive(node: Node) -> None:
    c = _client(node)
    assert c.io.deadline == c.clock.mono + node.settings.connect_timeout  # the CONNECT timeout
    c.send(Connect("dev-1", protocol_level=5, keepalive=20))
    ack = _connack(c.got())  # no await: answered within receive()
    assert (ack.session_present, ack.reason_code) == (False, 0)
    assert node.connections["dev-1"] is c.channel and c.io.reading
    assert c.io.deadline == c.clock.mono + 30  # keepalive 20 s * 1.5


async def test_no_connect_in_time_closes_without_an_answer(node: Node) -> None:
    c = _client(node)
    c.clock.advance(node.settings.connect_timeout)
    c.channel.deadline_due(c.clock.mono)
    assert c.channel.closed and c.got() == [] and "" not in node.connections


@pytest.mark.parametrize(("level", "connect", "code"), [
    (4, Connect("", protocol_level=4, clean_start=False), 2),  # 3.1.1: an empty id needs a clean session
    (5, Connect("x" * 65, protocol_level=5), ReasonCode.CLIENT_IDENTIFIER_NOT_VALID),  # over the node's 64
    (5, Connect("w", protocol_level=5, will=Will("a" * 257, b"x")), ReasonCode.TOPIC_NAME_INVALID),  # over 256
])
async def test_connect_refusals_by_code(node: Node, level: int, connect: Connect, code: int) -> None:
    c = _client(node, level)
    c.send(connect)
    ack = _connack(c.got())
    assert ack.reason_code == code
    assert c.channel.closed == (code != 0)
    if code:
        assert c.io.ended and not c.io.closed  # our side ended; the client's bytes are still read and dropped
        c.clock.advance(node.settings.close_drain_timeout)
        c.channel.deadline_due(c.clock.mono)
        assert c.io.closed  # the drain is over


async def test_an_unsupported_protocol_version_gets_the_311_answer(node: Node) -> None:
    c = _client(node)
    c.channel.receive(bytes([0x10, 10, 0, 4]) + b"MQTT" + bytes([9, 2, 0, 60]))  # level 9
    assert c.io.packets(4) == [Connack(False, 1)] and c.channel.closed


async def test_a_packet_before_connect_closes_silently(node: Node) -> None:
    c = _client(node)
    c.channel.receive(PINGREQ)
    assert c.channel.closed and c.got() == []


async def test_a_certificate_listener_refuses_a_client_without_one(node: Node) -> None:
    listener = Listener("mqtts", max_connections=10, rate=None, proxy_protocol=False, cert_username="cn")
    c = _client(node, listener=listener)
    c.send(Connect("nocert", protocol_level=5))
    assert _connack(c.got()).reason_code == ReasonCode.NOT_AUTHORIZED
    named = _client(node, listener=listener)
    named.io.cert = "device-42"
    named.send(Connect("withcert", protocol_level=5))
    assert _connack(named.got()).reason_code == 0 and named.channel.info.username == "device-42"


# -- keepalive --------------------------------------------------------------------------------------------

async def test_keepalive_closes_after_one_and_a_half_intervals_of_silence(node: Node) -> None:
    c = _client(node)
    c.send(Connect("k", protocol_level=5, keepalive=10))
    c.got()
    c.clock.advance(12)
    c.send(Pingreq())
    assert isinstance(c.got()[0], Pingresp)
    c.clock.advance(3)  # the deadline first filed (15 s) passes: 3 s of silence is not 15
    c.channel.deadline_due(c.clock.mono)
    assert not c.channel.closed and c.io.deadline == c.clock.mono - 3 + 15
    c.clock.advance(12)
    c.channel.deadline_due(c.clock.mono)
    assert c.channel.closed
    [gone] = c.got()
    assert isinstance(gone, Disconnect) and gone.reason_code == ReasonCode.KEEP_ALIVE_TIMEOUT


async def test_silence_while_we_hold_reading_is_ours(node: Node) -> None:
    c = _client(node)
    c.send(Connect("h", protocol_level=5, keepalive=10))
    c.got()
    c.channel.pause_publishes()  # the node's append queue is full: we stop reading the client
    assert not c.io.reading
    c.clock.advance(60)
    c.channel.deadline_due(c.clock.mono)
    assert not c.channel.closed
    c.channel.resume_publishes()
    assert c.io.reading


# -- after CONNECT ----------------------------------------------------------------------------------------

async def test_qos1_publish_is_acked_once_durable(node: Node) -> None:
    c = _client(node)
    c.send(Connect("p", protocol_level=5))
    c.got()
    c.send(Publish("t/1", b"x", qos=1, packet_id=7))
    await until(lambda: bool(c.io.out), "the PUBACK")
    assert c.got() == [Puback(7)]
    assert [m.payload for m in (await node.store.read("t/1", 0, 10)).messages] == [b"x"]


async def test_topic_alias_out_of_range_and_unknown(node: Node) -> None:
    c = _client(node)
    c.send(Connect("a", protocol_level=5))
    c.got()
    c.send(Publish("", b"x", properties={PropertyId.TOPIC_ALIAS: 1}))
    [gone] = c.got()
    assert isinstance(gone, Disconnect) and gone.reason_code == ReasonCode.PROTOCOL_ERROR and c.channel.closed
    d = _client(node)
    d.send(Connect("b", protocol_level=5))
    d.got()
    d.send(Publish("t", b"x", properties={PropertyId.TOPIC_ALIAS: 60000}))
    [gone] = d.got()
    assert gone.reason_code == ReasonCode.TOPIC_ALIAS_INVALID


async def test_takeover_hands_the_session_to_the_new_channel(node: Node) -> None:
    first = _client(node)
    first.send(Connect("same", protocol_level=5, clean_start=False,
                       properties={PropertyId.SESSION_EXPIRY_INTERVAL: 600}))
    await until(lambda: bool(first.io.out), "the first CONNACK")
    assert _connack(first.got()).session_present is False
    first.send(Subscribe(1, [SubscriptionRequest("s/#", 1)]))
    await until(lambda: bool(first.io.out), "the SUBACK")
    assert isinstance(first.got()[0], Suback)
    second = _client(node)
    second.send(Connect("same", protocol_level=5, clean_start=False,
                        properties={PropertyId.SESSION_EXPIRY_INTERVAL: 600}))
    await until(lambda: bool(second.io.out), "the second CONNACK")
    assert _connack(second.got()).session_present is True
    [gone] = first.got()
    assert isinstance(gone, Disconnect) and gone.reason_code == ReasonCode.SESSION_TAKEN_OVER
    assert first.channel.closed and node.connections["same"] is second.channel


class _NoSecrets(AllowAll):
    def subscribe_access(self, client: ClientInfo, topic_filter: str) -> SubscribeAccess:
        return SubscribeAccess.DENIED if topic_filter.startswith("secret/") else SubscribeAccess.GRANTED


@pytest.mark.parametrize("level", [4, 5])
async def test_refused_subscriptions_get_the_codes_of_the_clients_version(node: Node, level: int) -> None:
    node.authorizer.base = _NoSecrets()
    node.settings.max_subscriptions = 2
    c = _client(node, level)
    c.send(Connect("refused", protocol_level=level))
    c.got()
    c.send(Subscribe(1, [SubscriptionRequest("ok/#", 1), SubscriptionRequest("bad/#/x", 1),
                         SubscriptionRequest("secret/a", 1), SubscriptionRequest("$share/g/s", 0),
                         SubscriptionRequest("over/quota", 1)]))
    await until(lambda: bool(c.io.out), "the SUBACK")
    [suback] = c.got()
    refused = [ReasonCode.TOPIC_FILTER_INVALID, ReasonCode.NOT_AUTHORIZED] if level == 5 else [0x80, 0x80]
    quota = ReasonCode.QUOTA_EXCEEDED if level == 5 else 0x80
    assert isinstance(suback, Suback) and suback.reason_codes == [1, *refused, 0, quota]
    c.send(Unsubscribe(2, ["ok/#", "never/subscribed", "$share/g/s"]))
    [unsuback] = c.got()
    assert isinstance(unsuback, Unsuback)
    if level == 5:
        assert unsuback.reason_codes == [ReasonCode.SUCCESS, ReasonCode.NO_SUBSCRIPTION_EXISTED, ReasonCode.SUCCESS]


async def test_credentials_expire_on_their_timer(node: Node) -> None:
    c = _client(node)
    c.send(Connect("e", protocol_level=5))
    c.got()
    c.channel.expiry_at(c.clock.time() + 30)
    [timer] = c.io.timers
    assert timer.at == c.clock.mono + 30
    c.clock.advance(30)
    c.io.fire_timers()
    [gone] = c.got()
    assert gone.reason_code == ReasonCode.MAXIMUM_CONNECT_TIME and c.channel.closed


async def test_a_will_is_published_after_its_delay_unless_the_client_returns(node: Node) -> None:
    timers: list[Timer] = []
    clock = FakeClock()

    def later(delay: float, callback: Callable[..., None], *args: Any) -> Timer:
        timer = Timer(clock.mono + delay, lambda: callback(*args))
        timers.append(timer)
        return timer

    published: list[Any] = []
    node.wills = DelayedWills(published.append, node.writes, call_later=later)
    c = _client(node, clock=clock)
    c.send(Connect("w", protocol_level=5, will=Will("wills/w", b"gone", properties={PropertyId.WILL_DELAY_INTERVAL: 5}),
                   properties={PropertyId.SESSION_EXPIRY_INTERVAL: 60}, clean_start=False))
    await until(lambda: bool(c.io.out), "the CONNACK")
    c.got()
    c.channel.connection_lost("connection lost")
    [timer] = timers
    assert timer.at == clock.mono + 5 and published == []
    clock.advance(5)
    timer.callback()
    assert [m.payload for m in published] == [b"gone"]


async def test_qos2_is_stored_once_across_a_resend_before_pubrel(node: Node) -> None:
    c = _client(node)
    c.send(Connect("q2", protocol_level=5))
    c.got()
    c.send(Publish("t/2", b"once", qos=2, packet_id=3))
    await until(lambda: bool(c.io.out), "the PUBREC")
    assert c.got() == [Pubrec(3)]
    c.send(Publish("t/2", b"once", qos=2, packet_id=3, dup=True))  # the client did not see our PUBREC
    assert c.got() == [Pubrec(3)]  # at once: not stored again
    c.send(Pubrel(3))
    assert c.got() == [Pubcomp(3)]
    c.send(Pubrel(3))  # unknown now: 5.0 says so
    assert c.got() == [Pubcomp(3, ReasonCode.PACKET_IDENTIFIER_NOT_FOUND)]
    await until(lambda: node.store.last_seq() >= 1, "the append")
    assert [m.payload for m in (await node.store.read("t/2", 0, 10)).messages] == [b"once"]


async def test_over_its_inbound_rate_a_client_is_not_read_until_its_time(node: Node) -> None:
    c = _client(node)
    c.send(Connect("r", protocol_level=5))
    c.got()
    c.channel.limiter = InboundLimiter(1, 0, c.clock.mono)  # one publish a second
    c.send(*(Publish("t/r", str(i).encode()) for i in range(3)))
    assert not c.io.reading
    [timer] = c.io.timers
    c.clock.advance(timer.at - c.clock.mono)
    c.io.fire_timers()
    assert not c.io.reading and len(c.io.timers) == 1  # the third still waits its turn
    c.clock.advance(c.io.timers[0].at - c.clock.mono)
    c.io.fire_timers()
    assert c.io.reading and not c.io.timers
    await until(lambda: node.store.last_seq() >= 3, "the appends")
    assert [m.payload for m in (await node.store.read("t/r", 0, 10)).messages] == [b"0", b"1", b"2"]
