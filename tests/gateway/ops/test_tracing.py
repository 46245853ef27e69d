"""The node's traces on live channels with no socket (gateway.ops.tracing): a connection nobody traces keeps its
own `ChannelIo` and no tap (the one attribute its reads test); a trace taps the connections it wants, records what
they read and write at the node's clock (moved by hand here, so the timings are exact) and lets go of them when it
stops. The node is real (embedded store in a temporary directory); the connections are recorders."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.gateway.fakeclock import FakeClock
from tests.gateway.protocols.mqtt.fakeio import FakeIo, channel
from tidewire.extensions.hooks import AllowAll
from tidewire.gateway.config import Settings
from tidewire.gateway.node import Node
from tidewire.gateway.ops.trace import TraceSpec
from tidewire.gateway.ops.tracing import publish_spans
from tidewire.gateway.protocols.mqtt.channel import MqttChannel
from tidewire.gateway.protocols.mqtt.codec import Connect, Pingreq, Pingresp, Publish, encode
from tidewire.lookup.base import InProcessLookup
from tidewire.notify.base import LocalNotifier
from tidewire.store.embedded.engine import EmbeddedStore


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[Node]:
    settings = Settings(data_dir=tmp_path, port=0, sys_events=False, node_id="n1")
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


def _connected(node: Node, client_id: str) -> tuple[MqttChannel, FakeIo]:
    assert isinstance(node.clock, FakeClock)
    chan, io = channel(node, node.clock)
    chan.receive(encode(Connect(client_id, protocol_level=5), 5))
    assert node.connections[client_id] is chan
    return chan, io


def _spec(name: str, client_id: str | None = None, topic: str | None = None) -> TraceSpec:
    return TraceSpec(name, client_id, topic, 60.0, 100, 1 << 20, 0)


def _lines(node: Node, name: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in node.traces.get(name).lines()]


async def test_untraced_connections_keep_their_io_and_a_trace_lets_go_when_it_stops(node: Node) -> None:
    clock = node.clock
    assert isinstance(clock, FakeClock)
    traced, traced_io = _connected(node, "dev-1")
    other, other_io = _connected(node, "dev-2")
    assert (traced.tap, traced.io, node.traces.running) == (None, traced_io, False)
    node.traces.start(_spec("t", client_id="dev-1"))
    assert traced.tap is not None and traced.io is not traced_io  # tapped mid-connection
    assert (other.tap, other.io) == (None, other_io)  # nothing for the others
    clock.advance(1.5)
    traced.receive(encode(Pingreq(), 5))
    other.receive(encode(Pingreq(), 5))
    lines = _lines(node, "t")
    assert [(line["dir"], line["type"], line["t"]) for line in lines] == [("in", "PINGREQ", 1.5),
                                                                          ("out", "PINGRESP", 1.5)]
    assert lines[0]["ts"] == clock.time() and lines[0]["client"] == "dev-1" and lines[0]["node"] == "n1"
    assert isinstance(traced_io.packets(5)[-1], Pingresp)  # and the PINGRESP still reached the connection
    node.traces.stop("t")
    assert (traced.tap, traced.io, node.traces.running) == (None, traced_io, False)
    traced.receive(encode(Pingreq(), 5))
    assert len(_lines(node, "t")) == 2


async def test_a_client_trace_taps_its_client_from_connect(node: Node) -> None:
    node.traces.start(_spec("t", client_id="late"))
    assert node.traces.running
    _connected(node, "someone-else")
    chan, _ = _connected(node, "late")
    assert chan.tap is not None
    assert [(line["dir"], line["type"]) for line in _lines(node, "t")] == [("in", "CONNECT"), ("out", "CONNACK")]
    node.traces.delete("t")
    assert chan.tap is None and not node.traces.running


async def test_a_topic_trace_taps_every_connection_and_records_matching_publishes(node: Node) -> None:
    a, _ = _connected(node, "a")
    node.traces.start(_spec("t", topic="x/+"))
    b, _ = _connected(node, "b")
    assert a.tap is not None and b.tap is not None
    a.receive(encode(Publish("x/1", b"hi", 0), 5) + encode(Publish("y/1", b"no", 0), 5) + encode(Pingreq(), 5))
    assert [(line["client"], line["type"], line["topic"]) for line in _lines(node, "t")] == [("a", "PUBLISH", "x/1")]
    node.traces.stop("t")
    assert a.tap is None and b.tap is None


def test_publish_spans_finds_each_publish_and_its_topic() -> None:
    packets = [encode(Pingresp(), 5), encode(Publish("a/b", b"x" * 300, 1, packet_id=3), 5),
               encode(Publish("", b"y", 0, properties={0x23: 2}), 5), encode(Pingresp(), 5)]
    data = b"".join(packets)
    first = len(packets[0])
    second = first + len(packets[1])
    assert publish_spans(data) == [(first, second, "a/b"), (second, second + len(packets[2]), "")]
    assert publish_spans(data[:-1]) == publish_spans(data)  # a cut tail is left out
    assert publish_spans(data[:first + 2]) == []
