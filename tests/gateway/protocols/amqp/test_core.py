"""The sans-IO pieces without a socket: the connection core (handshake, channels, content assembly, faults,
heartbeats) driven with pamqp-marshalled client frames, and the name/key/property mapping."""

from __future__ import annotations

import struct

from hypothesis import given
from hypothesis import strategies as st
from pamqp import commands, frame, header
from pamqp.body import ContentBody

from tidewire.gateway.core.ingress import neutral_message
from tidewire.gateway.protocols.amqp.core import ConnectionCore
from tidewire.gateway.protocols.amqp.events import (
    Authenticate,
    ChannelClosed,
    ChannelCloseRequested,
    ChannelOpened,
    Command,
    Event,
    Limits,
    Opened,
    State,
)
from tidewire.gateway.protocols.amqp.mapping import (
    binding_filter,
    escape,
    origin,
    properties_in,
    properties_out,
    publish_topic,
    unescape,
)

HEADER = b"AMQP\x00\x00\x09\x01"
LIMITS = Limits(frame_max=4096, channel_max=8, heartbeat=10, max_body=100_000)


def m(channel: int, value: frame.FrameTypes) -> bytes:
    return frame.marshal(value, channel)


def decode_all(data: bytes) -> list[tuple[int, frame.FrameTypes]]:
    out = []
    while data:
        used, channel, value = frame.unmarshal(data)
        out.append((channel, value))
        data = data[used:]
    return out


def open_core(now: float = 0.0) -> ConnectionCore:
    core = ConnectionCore(LIMITS, {"product": "test"}, lambda: None, now)
    assert core.receive(HEADER, now) == []
    start = decode_all(core.data_to_send())
    assert isinstance(start[0][1], commands.Connection.Start) and start[0][1].mechanisms == "PLAIN"
    events = core.receive(m(0, commands.Connection.StartOk(
        client_properties={"capabilities": {"connection.blocked": True}}, mechanism="PLAIN",
        response="\0user\0pw")), now)
    assert events == [Authenticate("user", b"pw")]
    core.auth_accepted()
    tune = decode_all(core.data_to_send())[0][1]
    assert isinstance(tune, commands.Connection.Tune) and (tune.frame_max, tune.channel_max) == (4096, 8)
    events = core.receive(m(0, commands.Connection.TuneOk(8, 4096, 2)) + m(0, commands.Connection.Open("/")), now)
    assert events == [Opened("/")] and core.open and core.heartbeat == 2
    assert isinstance(decode_all(core.data_to_send())[0][1], commands.Connection.OpenOk)
    return core


def publish_bytes(channel: int, body: bytes, chunk: int = 4088) -> bytes:
    parts = [m(channel, commands.Basic.Publish(exchange="amq.topic", routing_key="a.b")),
             m(channel, header.ContentHeader(0, len(body), commands.Basic.Properties(content_type="t")))]
    parts += [m(channel, ContentBody(body[i:i + chunk])) for i in range(0, len(body), chunk)]
    return b"".join(parts)


def test_publish_content_is_reassembled_however_the_bytes_arrive() -> None:
    body = bytes(range(256)) * 50
    stream = m(1, commands.Channel.Open()) + publish_bytes(1, body, 1000) + publish_bytes(1, b"")
    for step in (1, 7, 4096, len(stream)):
        core = open_core()
        events: list[Event] = []
        for i in range(0, len(stream), step):
            events += core.receive(stream[i:i + step], 0.0)
        assert events[0] == ChannelOpened(1)
        assert [(type(e.method), e.body, e.properties.content_type) for e in events[1:]
                if isinstance(e, Command) and e.properties] == [(commands.Basic.Publish, body, "t"),
                                                                 (commands.Basic.Publish, b"", "t")]


def test_content_out_is_split_at_frame_max() -> None:
    core = open_core()
    core.send_content(1, commands.Basic.Deliver("ctag", 1, False, "amq.topic", "a"), commands.Basic.Properties(),
                      b"x" * 10_000)
    frames = decode_all(core.data_to_send())
    sizes = [len(v.value) for _, v in frames if isinstance(v, ContentBody)]
    assert sizes == [4088, 4088, 1824] and isinstance(frames[1][1], header.ContentHeader)


def test_body_over_the_limit_closes_the_channel_and_drops_the_rest() -> None:
    core = open_core()
    core.receive(m(1, commands.Channel.Open()), 0.0)
    core.data_to_send()
    events = core.receive(publish_bytes(1, b"y" * 100_001), 0.0)
    assert events == [ChannelClosed(1)]
    closing = decode_all(core.data_to_send())
    assert isinstance(closing[0][1], commands.Channel.Close) and closing[0][1].reply_code == 406
    assert core.receive(publish_bytes(1, b"z"), 0.0) == []  # ignored until the client's Close-Ok
    core.receive(m(1, commands.Channel.CloseOk()) + m(1, commands.Channel.Open()), 0.0)
    assert core.channel_open(1)


def test_framing_faults_close_the_connection_with_their_code() -> None:
    for data, code in ((m(3, commands.Basic.Qos()), 504),  # channel never opened
                       (m(1, commands.Channel.Open()) + m(1, commands.Channel.Open()), 504),
                       (m(9, commands.Channel.Open()), 530),  # above channel_max
                       (m(1, commands.Channel.Open()) + struct.pack(">BHI", 3, 1, 1) + b"x\xce", 505),
                       (struct.pack(">BHI", 1, 0, 4) + struct.pack(">HH", 99, 1) + b"\xce", 540),
                       (m(0, commands.Connection.Open("/")), 503)):
        core = open_core()
        core.receive(data, 0.0)
        closes = [v for _, v in decode_all(core.data_to_send()) if isinstance(v, commands.Connection.Close)]
        assert [c.reply_code for c in closes] == [code], data


def test_a_frame_of_frame_max_plus_its_overhead_is_tolerated_one_more_byte_is_not() -> None:
    # frame_max is 4096: a body frame with a 4096-byte payload is 4104 bytes, as AMQPStorm sends them
    core = open_core()
    events = core.receive(m(1, commands.Channel.Open()) + publish_bytes(1, b"a" * 4096, 4096), 0.0)
    assert [e.body for e in events if isinstance(e, Command)] == [b"a" * 4096] and core.open
    core.data_to_send()
    assert core.receive(publish_bytes(1, b"b" * 4097, 4097), 0.0) == []
    closes = [v for _, v in decode_all(core.data_to_send()) if isinstance(v, commands.Connection.Close)]
    assert [(c.reply_code, c.reply_text) for c in closes] == [
        (501, "FRAME_ERROR - frame size 4105 larger than negotiated maximum 4096")]


def test_a_connection_refused_by_admission_is_closed_at_open_without_logging_in() -> None:
    core = ConnectionCore(LIMITS, {"product": "test"}, lambda: None, 0.0)
    core.receive(HEADER, 0.0)
    core.data_to_send()
    events = core.receive(m(0, commands.Connection.StartOk(mechanism="PLAIN", response="\0user\0pw")), 0.0)
    assert events == [Authenticate("user", b"pw")]
    core.refuse_open(530, "connection refused: max connections on listener amqp")  # instead of authenticating
    assert isinstance(decode_all(core.data_to_send())[0][1], commands.Connection.Tune)
    events = core.receive(m(0, commands.Connection.TuneOk(8, 4096, 0)) + m(0, commands.Connection.Open("/")), 0.0)
    assert events == [] and not core.open  # never Opened: no channel, no command
    [(_, close)] = decode_all(core.data_to_send())
    assert isinstance(close, commands.Connection.Close)
    assert (close.reply_code, close.class_id, close.method_id) == (530, 10, 40)
    assert close.reply_text == "NOT_ALLOWED - connection refused: max connections on listener amqp"


def test_channel_close_waits_for_cleanup_then_confirms() -> None:
    core = open_core()
    core.receive(m(2, commands.Channel.Open()), 0.0)
    core.data_to_send()
    assert core.receive(m(2, commands.Channel.Close(200, "bye", 0, 0)), 0.0) == [ChannelCloseRequested(2)]
    assert core.data_to_send() == b""
    assert core.receive(m(2, commands.Basic.Qos(0, 1, False)), 0.0) == []  # nothing may follow the Close
    core.channel_close_ok(2)
    assert isinstance(decode_all(core.data_to_send())[0][1], commands.Channel.CloseOk)


def test_heartbeats_sent_at_half_interval_and_silence_kills() -> None:
    core = open_core(now=100.0)
    assert core.tick(100.5) and core.data_to_send() == b""
    assert core.tick(101.0) and core.data_to_send() == b"\x08\x00\x00\x00\x00\x00\x00\xce"
    core.receive(b"\x08\x00\x00\x00\x00\x00\x00\xce", 103.0)
    assert core.tick(106.9)  # two intervals of 2 s
    assert not core.tick(107.1) and core.state is State.CLOSED


def test_blocked_only_to_clients_that_understand_it() -> None:
    core = open_core()
    core.block("low on resources")
    core.block("again")
    core.unblock()
    kinds = [type(v) for _, v in decode_all(core.data_to_send())]
    assert kinds == [commands.Connection.Blocked, commands.Connection.Unblocked]


# --- mapping ---------------------------------------------------------------------------------------------
@given(st.text())
def test_escape_roundtrip_and_one_level(name: str) -> None:
    escaped = escape(name)
    assert unescape(escaped) == name
    assert not any(c in escaped for c in "/+#\x00")


def test_topics_and_filters_per_exchange_type() -> None:
    assert publish_topic("amq.topic", "topic", "a.b/c") == "a/b.c"
    assert binding_filter("amq.topic", "topic", "a.*.#") == "a/+/#"
    assert binding_filter("amq.topic", "topic", "#.a") is None and binding_filter("x", "topic", "a*") is None
    assert publish_topic("ex", "topic", "eu.fr") == "$exchange/ex/eu/fr"
    assert binding_filter("ex", "topic", "eu.*") == "$exchange/ex/eu/+"
    assert publish_topic("d", "direct", "a/b+#") == binding_filter("d", "direct", "a/b+#") == "$exchange/d/a%2Fb%2B%23"
    assert publish_topic("f", "fanout", "any") == binding_filter("f", "fanout", "other") == "$exchange/f"
    assert publish_topic("", "direct", "q/1") == "$queue/q%2F1"
    assert publish_topic("p2p", "topic", "x") == "$exchange/%702p/x"  # never an MQTT P2P topic
    kinds = {"ex": "topic", "d": "direct", "f": "fanout", "p2p": "topic"}
    for exchange, kind, key in (("ex", "topic", "eu.fr"), ("d", "direct", "a/b+#"), ("", "direct", "q/1"),
                                ("amq.topic", "topic", "a.b"), ("p2p", "topic", "x")):
        assert origin(publish_topic(exchange, kind, key), kinds) == (exchange, key)
    assert origin(publish_topic("f", "fanout", "k"), kinds) == ("f", "")
    assert origin("$exchange/bad!name/x", kinds) == ("amq.topic", "$exchange.bad!name.x")


def test_properties_both_ways() -> None:
    props = commands.Basic.Properties(content_type="application/json", correlation_id="c-1", reply_to="r.k",
                                      expiration="1500", delivery_mode=2, message_id="m", priority=4,
                                      headers={"n": 1, "b": b"raw", "t": True}, app_id="app")
    mapped = properties_in(props, "alice")
    assert not isinstance(mapped, str)
    neutral, qos = mapped
    assert qos == 1 and neutral.expiry_interval == 2 and neutral.response_topic == "r/k"
    assert ("n", "1") in neutral.user and ("b", "raw") in neutral.user and ("t", "true") in neutral.user
    message = neutral_message("t", b"", qos=qos, properties=neutral, now_ms=1_000_000)
    back = properties_out(message, 1_000_500)
    assert (back.content_type, back.correlation_id, back.reply_to, back.delivery_mode) == (
        "application/json", "c-1", "r.k", 2)
    assert (back.message_id, back.priority, back.app_id, back.expiration) == ("m", 4, "app", "2000")
    assert back.headers == {"n": "1", "b": "raw", "t": "true"}
    assert properties_in(commands.Basic.Properties(expiration="soon"), None) == "invalid expiration 'soon'"
    assert isinstance(properties_in(commands.Basic.Properties(user_id="bob"), "alice"), str)


def test_commands_read_before_a_close_still_run() -> None:
    core = open_core()
    core.receive(m(1, commands.Channel.Open()), 0.0)
    events = core.receive(publish_bytes(1, b"last") + m(1, commands.Channel.Close(200, "", 0, 0))
                          + m(0, commands.Connection.Close(200, "bye", 0, 0)), 0.0)
    assert [type(e).__name__ for e in events] == ["Command", "ChannelCloseRequested", "CloseRequested"]
    assert core.channel_open(1)  # the worker still runs the publish
    core.channel_close_ok(1)
    core.close_ok()
    kinds = [type(v) for _, v in decode_all(core.data_to_send())]
    assert kinds[-1] == commands.Connection.CloseOk and commands.Channel.CloseOk not in kinds and core.closed


@given(st.lists(st.binary(max_size=64), max_size=8), st.booleans())
def test_garbage_never_raises_and_ends_in_a_close(chunks: list[bytes], opened: bool) -> None:
    core = open_core() if opened else ConnectionCore(LIMITS, {}, lambda: None, 0.0)
    for chunk in chunks:
        core.receive(chunk, 0.0)  # bad input is a Close frame, never an exception
    out = core.data_to_send()
    if core.closed and opened:
        assert any(isinstance(v, commands.Connection.Close) for _, v in decode_all(out))


def test_bodies_in_progress_are_bounded_per_connection() -> None:
    core = open_core()
    for channel in range(1, 6):
        core.receive(m(channel, commands.Channel.Open()), 0.0)
    head = b"".join(m(ch, commands.Basic.Publish(exchange="amq.topic", routing_key="k"))
                    + m(ch, header.ContentHeader(0, 100_000, commands.Basic.Properties())) for ch in range(1, 5))
    core.receive(head, 0.0)  # four maximum-size bodies announced: allowed
    core.data_to_send()
    core.receive(m(5, commands.Basic.Publish(exchange="amq.topic", routing_key="k"))
                 + m(5, header.ContentHeader(0, 1, commands.Basic.Properties())), 0.0)
    closes = [v for _, v in decode_all(core.data_to_send()) if isinstance(v, commands.Connection.Close)]
    assert [c.reply_code for c in closes] == [506]
