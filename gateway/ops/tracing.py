"""The node's traces (`node.traces`), glue between `gateway.ops.trace` and the MQTT connections: start, stop,
list and delete traces, and tap the connections they follow.

A traced connection gets a `ChannelTap` on its channel (`MqttChannel.tap`, the one attribute the read path
tests) and its `ChannelIo` wrapped by `TracingIo`, which decodes what is written to record it. Untraced
connections pay nothing but that test on each read; a CONNECT pays one more (`running`) so a new connection
of a traced client id (or any, while a topic trace runs) is tapped from its first packet.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tidewire.gateway.core.clock import Clock
from tidewire.gateway.protocols.mqtt.channel import MqttChannel
from tidewire.gateway.protocols.mqtt.codec import Parser, PropertyId, ProtocolError, Publish
from tidewire.gateway.protocols.mqtt.lifecycle import Cancellable, ChannelIo
from tidewire.gateway.transport.tls import CertUsername

from .trace import RUNNING, Trace, TraceRefused, TraceSpec, describe, encode_fields

if TYPE_CHECKING:
    from tidewire.gateway.config import Settings
    from tidewire.gateway.protocols.mqtt.lifecycle import ChannelBase

log = logging.getLogger("tidewire.trace")


def publish_spans(data: bytes) -> list[tuple[int, int, str]]:
    """(start, end, topic) of each PUBLISH among the whole packets in `data`, read from the fixed header and the
    topic alone (the rest is decoded only for a packet a trace wants); a truncated or undecodable tail is left
    out."""
    spans: list[tuple[int, int, str]] = []
    pos, n = 0, len(data)
    while pos + 2 <= n:
        length, shift, p = 0, 0, pos + 1
        while p < n and shift < 28:
            byte = data[p]
            length |= (byte & 0x7F) << shift
            p += 1
            if byte < 0x80:
                break
            shift += 7
        else:
            return spans
        end = p + length
        if end > n:
            return spans
        if data[pos] >> 4 == 3 and p + 2 <= end:
            topic_end = p + 2 + ((data[p] << 8) | data[p + 1])
            try:
                spans.append((pos, end, data[p + 2:topic_end].decode("utf-8")))
            except UnicodeDecodeError:
                pass
        pos = end
    return spans


class ChannelTap:
    """What the running traces record of one connection: all of it for the client-id traces that follow it,
    the matching PUBLISH packets for the topic traces."""

    __slots__ = ("_aliases", "_out", "channel", "client_id", "clock", "follow", "node_id", "topics")

    def __init__(self, channel: MqttChannel, client_id: str, traces: list[Trace], node_id: str,
                 clock: Clock) -> None:
        self.channel = channel
        self.client_id = client_id  # as the CONNECT named it (the channel's is set once CONNECT is handled)
        self.node_id = node_id
        self.clock = clock
        self.follow = [t for t in traces if t.follows(client_id)]
        self.topics = [t for t in traces if t.spec.topic is not None]
        self._out: Parser | None = None  # decodes what is written; made at the first write (the level is known)
        self._aliases: dict[tuple[str, int], str] = {}  # (direction, topic alias) -> topic, as the packets set them

    def inbound(self, packets: list[Any]) -> None:
        for packet in packets:
            self._record("in", packet)

    def outbound(self, data: bytes) -> None:
        """Whole packets the channel writes (a write never splits one)."""
        if not self.follow:  # topic traces only: decode just the PUBLISH packets they may want
            for start, end, topic in publish_spans(data):
                if not topic or any(t.wants_publish(topic) for t in self.topics):  # no topic: an alias, resolved
                    self._decode_out(data[start:end])
            return
        self._decode_out(data)

    def _decode_out(self, data: bytes) -> None:
        parser = self._out
        if parser is None:
            parser = self._out = Parser(protocol_level=self.channel.level or 4)
        try:
            packets = parser.feed(data)
        except ProtocolError as exc:  # our own bytes: never expected; stop decoding them rather than fail the write
            log.warning("trace.undecodable_output", extra={"client_id": self.client_id, "error": str(exc)})
            self._out = Parser(protocol_level=self.channel.level or 4)
            return
        for packet in packets:
            self._record("out", packet)

    def _record(self, direction: str, packet: Any) -> None:
        targets = self.follow
        topic = ""
        if type(packet) is Publish:
            topic = packet.topic
            alias = packet.properties.get(PropertyId.TOPIC_ALIAS) if packet.properties else None
            if alias:
                topic = self._aliased(direction, alias, topic)
            if self.topics:
                topic_traces = [t for t in self.topics if t.wants_publish(topic)]
                if topic_traces:
                    targets = targets + topic_traces
        if not targets:
            return
        now_mono = self.clock.monotonic()
        now_wall = self.clock.time()
        bodies: dict[int, str] = {}  # by payload bytes recorded: one encoding for the traces that agree
        for trace in targets:
            cap = trace.spec.payload_bytes
            body = bodies.get(cap)
            if body is None:
                fields = describe(packet, cap)
                if topic and not packet.topic:
                    fields["topic"] = topic  # sent as a topic alias only
                fields["dir"] = direction
                fields["client"] = self.channel.client_id or self.client_id
                fields["node"] = self.node_id
                body = bodies[cap] = encode_fields(fields)
            trace.record(body, now_mono, now_wall)


    def _aliased(self, direction: str, alias: int, topic: str) -> str:
        """The topic a PUBLISH with a topic alias stands for: it sets the alias (a topic given) or uses one set
        earlier (seen by this tap, else, for a tap made mid-connection, as the channel or session holds it)."""
        key = (direction, alias)
        if topic:
            self._aliases[key] = topic
            return topic
        known = self._aliases.get(key)
        if known is not None:
            return known
        channel = self.channel
        if direction == "in":
            return (channel.aliases_in or {}).get(alias, "")
        outgoing = channel.session.aliases if channel.session is not None else None
        return next((t for t, a in (outgoing or {}).items() if a == alias), "")


class TracingIo:
    """A traced connection's `ChannelIo`: what the channel writes is recorded, then written."""

    __slots__ = ("inner", "tap")

    def __init__(self, inner: ChannelIo, tap: ChannelTap) -> None:
        self.inner = inner
        self.tap = tap

    def write(self, data: bytes) -> None:
        self.tap.outbound(data)
        self.inner.write(data)

    def writelines(self, chunks: list[bytes]) -> None:
        self.tap.outbound(b"".join(chunks))
        self.inner.writelines(chunks)

    def pause_reading(self) -> None:
        self.inner.pause_reading()

    def resume_reading(self) -> None:
        self.inner.resume_reading()

    def close(self) -> None:
        self.inner.close()

    def is_closing(self) -> bool:
        return self.inner.is_closing()

    def end_output(self) -> bool:
        return self.inner.end_output()

    def set_deadline(self, when: float | None) -> None:
        self.inner.set_deadline(when)

    def call_later(self, delay: float, callback: Callable[[], None]) -> Cancellable:
        return self.inner.call_later(delay, callback)

    def certificate_name(self, kind: CertUsername) -> str | None:
        return self.inner.certificate_name(kind)


class Tracing:
    """`node.traces`. `running` is True while any trace runs: the one test a CONNECT makes."""

    def __init__(self, settings: Settings, node_id: str, clock: Clock,
                 connections: dict[str, ChannelBase]) -> None:
        self.settings = settings
        self.node_id = node_id
        self.clock = clock
        self.connections = connections
        self.running = False
        self._traces: dict[str, Trace] = {}  # by name, oldest first
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._tapped: set[MqttChannel] = set()

    # --- operators ------------------------------------------------------------------------------------
    def start(self, spec: TraceSpec) -> Trace:
        """Start a trace now (its end is timed from here). `TraceRefused` 409: the name is in use, or the node
        holds `trace_max_traces` and none of them is stopped (the oldest stopped one makes room)."""
        if spec.name in self._traces:
            raise TraceRefused(409, f"a trace named {spec.name!r} exists (delete it first)")
        if len(self._traces) >= self.settings.trace_max_traces:
            stopped = next((name for name, t in self._traces.items() if t.status != RUNNING), None)
            if stopped is None:
                raise TraceRefused(409, f"{self.settings.trace_max_traces} traces are running (trace_max_traces)")
            del self._traces[stopped]
        trace = self._traces[spec.name] = Trace(spec, self.clock.monotonic(), self.clock.time())
        self._timers[spec.name] = asyncio.get_running_loop().call_later(spec.duration, self._expired, spec.name)
        log.info("trace.started", extra={"trace": spec.name, "client_id": spec.client_id, "topic": spec.topic,
                                         "duration": spec.duration})
        self._retap()
        return trace

    def stop(self, name: str, reason: str = "stopped") -> Trace:
        trace = self.get(name)
        if trace.status == RUNNING:
            trace.stop(self.clock.time(), reason)
            timer = self._timers.pop(name, None)
            if timer is not None:
                timer.cancel()
            log.info("trace.stopped", extra={"trace": name, "reason": reason, "recorded": trace.recorded,
                                             "dropped": trace.dropped})
            self._retap()
        return trace

    def delete(self, name: str) -> None:
        self.stop(name, "deleted")
        del self._traces[name]

    def get(self, name: str) -> Trace:
        trace = self._traces.get(name)
        if trace is None:
            raise TraceRefused(404, f"no trace named {name!r}")
        return trace

    def all(self) -> list[Trace]:
        return list(self._traces.values())

    def _expired(self, name: str) -> None:
        self._timers.pop(name, None)
        if name in self._traces:
            self.stop(name, "duration reached")

    # --- connections ----------------------------------------------------------------------------------
    def connecting(self, channel: MqttChannel, packets: list[Any]) -> None:
        """A CONNECT arrives (`packets[0]`, then what came with it): tap the connection if a trace wants it."""
        client_id = getattr(packets[0], "client_id", "")
        running = self._running()
        if not any(t.follows(client_id) or t.spec.topic is not None for t in running):
            return
        if len(self._tapped) > 2 * len(self.connections) + 64:  # taps of connections closed since the last retap
            self._tapped = {c for c in self._tapped if not c.closed}
        self._attach(channel, client_id, running)
        assert channel.tap is not None
        channel.tap.inbound(packets)

    def _running(self) -> list[Trace]:
        return [t for t in self._traces.values() if t.status == RUNNING]

    def _attach(self, channel: MqttChannel, client_id: str, running: list[Trace]) -> None:
        tap = ChannelTap(channel, client_id, running, self.node_id, self.clock)
        if not tap.follow and not tap.topics:
            self._detach(channel)
            return
        old = channel.tap
        channel.tap = tap
        io = channel.io
        if isinstance(io, TracingIo):
            io.tap = tap
        else:
            channel.io = TracingIo(io, tap)
        if old is None:
            self._tapped.add(channel)

    def _detach(self, channel: MqttChannel) -> None:
        channel.tap = None
        if isinstance(channel.io, TracingIo):
            channel.io = channel.io.inner
        self._tapped.discard(channel)

    def _retap(self) -> None:
        """After a start or a stop: tap exactly the connections the running traces want."""
        running = self._running()
        self.running = bool(running)
        channels = {c for c in self.connections.values() if isinstance(c, MqttChannel)} | self._tapped
        for channel in channels:
            if channel.closed:
                self._tapped.discard(channel)
            elif running:
                self._attach(channel, channel.tap.client_id if channel.tap is not None else channel.client_id,
                             running)
            elif channel.tap is not None:
                self._detach(channel)
