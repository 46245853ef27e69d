"""Packet traces, sans-IO: what one trace asks for (`TraceSpec`), which packets it records, how a packet reads as
one JSON line, and the bounded ring buffer that keeps the newest lines (`Trace`). Time is passed in.

A trace follows one client id (every packet in and out of its connections) or one topic filter (the PUBLISH
packets whose topic matches, in and out, of any client). Its buffer holds at most `max_packets` lines and
`max_bytes` bytes of them: past either, the oldest go and are counted as dropped. `gateway.ops.tracing` is the
glue that feeds it from the MQTT connections.
"""

from __future__ import annotations

import base64
import json
import re
from collections import deque
from dataclasses import dataclass
from typing import Any

from tidewire.errors import TidewireError
from tidewire.gateway.core.topics import matches
from tidewire.gateway.protocols.mqtt.codec import (
    Auth,
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
    Suback,
    Subscribe,
    Unsuback,
    Unsubscribe,
)

TRACE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
RUNNING, STOPPED = "running", "stopped"
MAX_LISTED = 32  # filters or reason codes of one SUBSCRIBE, UNSUBSCRIBE or their acks listed in a line

_TYPE_NAMES: dict[type, str] = {
    Connect: "CONNECT", Connack: "CONNACK", Publish: "PUBLISH", Puback: "PUBACK", Pubrec: "PUBREC",
    Pubrel: "PUBREL", Pubcomp: "PUBCOMP", Subscribe: "SUBSCRIBE", Suback: "SUBACK", Unsubscribe: "UNSUBSCRIBE",
    Unsuback: "UNSUBACK", Pingreq: "PINGREQ", Pingresp: "PINGRESP", Disconnect: "DISCONNECT", Auth: "AUTH",
}


# One encoder for every line (json.dumps with options makes a new one per call).
encode_fields = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


class TraceRefused(TidewireError):
    """A trace cannot be started (a name in use, too many traces) or is unknown; `status` is the HTTP answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class TraceSpec:
    """One trace as asked for. Exactly one of `client_id` and `topic` is set."""

    name: str
    client_id: str | None
    topic: str | None  # a topic filter (wildcards allowed)
    duration: float  # s until it stops itself
    max_packets: int
    max_bytes: int
    payload_bytes: int  # PUBLISH payload bytes recorded per packet (0: sizes only)


def describe(packet: Any, payload_bytes: int) -> dict[str, Any]:
    """A packet's fields an operator debugs with: its type, packet id, topic, QoS, flags, payload size (and up to
    `payload_bytes` of the payload), reason codes, subscription filters; never a password."""
    kind = type(packet)
    out: dict[str, Any] = {"type": _TYPE_NAMES.get(kind, kind.__name__)}
    if kind is Publish:
        out.update(topic=packet.topic, qos=packet.qos, retain=packet.retain, dup=packet.dup,
                   size=len(packet.payload))
        if packet.qos:
            out["packet_id"] = packet.packet_id
        if packet.properties and PropertyId.TOPIC_ALIAS in packet.properties:
            out["topic_alias"] = packet.properties[PropertyId.TOPIC_ALIAS]
        if payload_bytes and packet.payload:
            kept = bytes(packet.payload[:payload_bytes])
            try:
                out["payload"] = kept.decode("utf-8")
            except UnicodeDecodeError:
                out["payload_b64"] = base64.b64encode(kept).decode("ascii")
            if len(packet.payload) > payload_bytes:
                out["payload_truncated"] = True
    elif kind in (Puback, Pubrec, Pubrel, Pubcomp):
        out.update(packet_id=packet.packet_id, reason_code=packet.reason_code)
    elif kind is Subscribe:
        out.update(packet_id=packet.packet_id,
                   filters=[[s.topic_filter, s.qos] for s in packet.subscriptions[:MAX_LISTED]])
        _count_if_cut(out, len(packet.subscriptions))
    elif kind in (Suback, Unsuback):
        out.update(packet_id=packet.packet_id, reason_codes=list(packet.reason_codes[:MAX_LISTED]))
        _count_if_cut(out, len(packet.reason_codes))
    elif kind is Unsubscribe:
        out.update(packet_id=packet.packet_id, filters=list(packet.topic_filters[:MAX_LISTED]))
        _count_if_cut(out, len(packet.topic_filters))
    elif kind is Connect:
        out.update(client_id=packet.client_id, proto_ver=packet.protocol_level, clean_start=packet.clean_start,
                   keepalive=packet.keepalive, username=packet.username, will=packet.will is not None)
    elif kind is Connack:
        out.update(session_present=packet.session_present, reason_code=packet.reason_code)
    elif kind in (Disconnect, Auth):
        out["reason_code"] = packet.reason_code
    return out


def _count_if_cut(out: dict[str, Any], count: int) -> None:
    if count > MAX_LISTED:
        out["count"] = count  # only the first MAX_LISTED are listed


class Trace:
    """One trace: its spec, its ring buffer of JSON lines, and whether it still runs."""

    __slots__ = ("_lines", "dropped", "ended_at", "held_bytes", "recorded", "spec", "started_mono",
                 "started_wall", "status", "stop_reason")

    def __init__(self, spec: TraceSpec, now_mono: float, now_wall: float) -> None:
        self.spec = spec
        self.started_mono = now_mono
        self.started_wall = now_wall
        self._lines: deque[tuple[str, int]] = deque()  # each line with its size in bytes (its newline included)
        self.held_bytes = 0
        self.recorded = 0  # lines ever added
        self.dropped = 0  # lines the buffer let go to stay within its bounds
        self.status = RUNNING
        self.ended_at: float | None = None  # wall clock
        self.stop_reason = ""

    @property
    def ends_at_mono(self) -> float:
        return self.started_mono + self.spec.duration

    def follows(self, client_id: str) -> bool:
        """Every packet of this client's connections is recorded (a client-id trace of it)."""
        return self.spec.client_id is not None and self.spec.client_id == client_id

    def wants_publish(self, topic: str) -> bool:
        """A topic trace records this PUBLISH."""
        return self.spec.topic is not None and bool(topic) and matches(self.spec.topic, topic)

    def record(self, body: str, now_mono: float, now_wall: float) -> None:
        """Add one packet at the given times: `body` is its fields as a JSON object (`encode_fields`), which the
        line gets after its `t` (s since the trace started, monotonic) and `ts` (epoch s)."""
        if self.status != RUNNING:
            return
        t = round(now_mono - self.started_mono, 6)
        self.add(f'{{"t":{t!r},"ts":{round(now_wall, 6)!r},{body[1:]}' if len(body) > 2 else
                 f'{{"t":{t!r},"ts":{round(now_wall, 6)!r}}}')

    def add(self, line: str) -> None:
        size = (len(line) if line.isascii() else len(line.encode())) + 1
        lines = self._lines
        lines.append((line, size))
        self.held_bytes += size
        self.recorded += 1
        spec = self.spec
        while len(lines) > spec.max_packets or (self.held_bytes > spec.max_bytes and len(lines) > 1):
            self.held_bytes -= lines.popleft()[1]
            self.dropped += 1

    def stop(self, now_wall: float, reason: str) -> None:
        if self.status == RUNNING:
            self.status = STOPPED
            self.ended_at = now_wall
            self.stop_reason = reason

    def lines(self) -> list[str]:
        return [line for line, _ in self._lines]

    def summary(self, now_mono: float) -> dict[str, Any]:
        spec = self.spec
        left = max(0.0, self.ends_at_mono - now_mono) if self.status == RUNNING else 0.0
        return {"name": spec.name, "client_id": spec.client_id, "topic": spec.topic, "status": self.status,
                "started_at": self.started_wall, "ended_at": self.ended_at, "stop_reason": self.stop_reason or None,
                "duration": spec.duration, "seconds_left": round(left, 3), "max_packets": spec.max_packets,
                "max_bytes": spec.max_bytes, "payload_bytes": spec.payload_bytes, "packets": len(self._lines),
                "bytes": self.held_bytes, "recorded": self.recorded, "dropped": self.dropped}


def merge_lines(parts: list[list[str]]) -> list[str]:
    """Lines of one trace from several nodes as one list in wall-clock order (each node's own order kept for
    equal times)."""
    keyed: list[tuple[float, int, int, str]] = []
    for node_index, lines in enumerate(parts):
        for index, line in enumerate(lines):
            try:
                ts = float(json.loads(line).get("ts", 0.0))
            except (ValueError, AttributeError):
                ts = 0.0
            keyed.append((ts, node_index, index, line))
    keyed.sort()
    return [line for *_, line in keyed]
