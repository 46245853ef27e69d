"""The bridge's MQTT client, sans-IO: bytes and time in, events out (as h11's `Connection`), on Tidewire's own codec.

`ClientCore` keeps one client's protocol state across connections: the CONNECT it sends, the packet ids and the
in-flight table of what it published (re-sent after a reconnect, MQTT 3.1.1 4.4), the incoming QoS 1/2 flows it
acknowledges only once the caller has stored a message (`incoming_stored`), the server's MQTT 5 limits (Receive
Maximum, Maximum QoS, Retain Available, Maximum Packet Size) and the keepalive. No socket, no clock, no asyncio:
`bridges/mqtt/link.py` runs it over one connection at a time.

Output: each call the caller makes returns the bytes to write (`connect`, `publish`, `subscribe`, ...); what a
received packet obliges us to send (PUBREL, PUBCOMP, a PUBREC repeated, the re-sends after a CONNACK) is collected
and taken with `data_to_send()` after `receive`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from tidewire.bridges.mqtt.events import (
    Acked,
    ClientProtocolError,
    ClientStateError,
    Connected,
    Event,
    Incoming,
    KeepaliveTimeout,
    PacketTooLarge,
    Refused,
    ServerDisconnect,
    Subscribed,
    Unsubscribed,
)
from tidewire.gateway.protocols.mqtt.codec import (
    PINGREQ,
    Connack,
    ConnackCode311,
    Connect,
    Disconnect,
    Packet,
    Parser,
    Pingresp,
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
    encode_properties,
    puback,
    pubcomp,
    publish_parts,
    pubrec,
    pubrel,
)
from tidewire.gateway.protocols.mqtt.codec import PropertyId as P
from tidewire.gateway.protocols.mqtt.codec import ProtocolError as CodecError
from tidewire.gateway.protocols.mqtt.connect import BRIDGE_PROPERTY, stored_properties

MAX_PACKET_ID = 0xFFFF


# --- options ---------------------------------------------------------------------------------------
@dataclass(slots=True)
class ClientOptions:
    client_id: str
    level: int = 4  # 3 (MQTT 3.1, "MQIsdp"), 4 (3.1.1) or 5
    clean_start: bool = True
    keepalive: int = 60  # seconds; 0: none
    username: str | None = None
    password: bytes | None = None
    # 3/4: the protocol level goes out with 0x80 set (Mosquitto's bridge bit); 5: the CONNECT carries the user
    # property BRIDGE_PROPERTY.
    try_private: bool = False
    session_expiry: int = 0  # 5 only
    will: Will | None = None
    receive_maximum: int = 65535  # 5: how many QoS 1/2 publishes we take in flight from the server
    max_inflight: int = 100  # our own cap on the unacknowledged QoS 1/2 publishes we send
    max_packet_size: int = 0  # a cap on what we send (0: none); 5: the server's Maximum Packet Size applies too

    def __post_init__(self) -> None:
        if self.level not in (3, 4, 5):
            raise ValueError(f"MQTT protocol level {self.level}: 3 (3.1), 4 (3.1.1) or 5")
        if self.password is not None and self.username is None and self.level != 5:
            raise ValueError("MQTT 3.x sends a password only with a user name")
        if not 1 <= self.receive_maximum <= 65535 or not 1 <= self.max_inflight <= 65535:
            raise ValueError("receive_maximum and max_inflight are 1..65535")
        if not 0 <= self.keepalive <= 65535 or self.max_packet_size < 0:
            raise ValueError("keepalive is 0..65535 s and max_packet_size >= 0")


@dataclass(slots=True)
class ServerLimits:
    """What the server's CONNACK allows (MQTT 5; the defaults are MQTT 3's: no limits)."""

    receive_maximum: int = 65535
    maximum_qos: int = 2
    retain_available: bool = True
    maximum_packet_size: int = 0  # 0: none
    keepalive: int | None = None  # Server Keep Alive: replaces ours


# --- state ----------------------------------------------------------------------------------------------------
class State(Enum):
    IDLE = "idle"  # no connection (before the first, or after one was lost)
    CONNECTING = "connecting"  # CONNECT sent, no CONNACK yet
    CONNECTED = "connected"
    CLOSED = "closed"  # refused, disconnected by either side: nothing more on this connection


@dataclass(slots=True)
class _Outgoing:
    """One of our QoS 1/2 publishes until its flow ends."""

    token: object
    topic: str
    payload: bytes
    qos: int
    retain: bool
    properties: bytes  # what goes into a level 5 PUBLISH (the stored block, plus the expiry if given)
    released: bool = False  # QoS 2: PUBREC received, PUBREL sent, waiting for PUBCOMP
    sent: bool = True  # on this connection (False: waiting for a slot after a reconnect)


def _describe(code: int, level: int) -> str:
    try:
        name = ConnackCode311(code).name if level < 5 else ReasonCode(code).name
    except ValueError:
        name = "unknown"
    return f"{name.lower().replace('_', ' ')} ({code})"


class ClientCore:
    """One MQTT client's protocol state (see the module). Not thread-safe; one connection at a time."""

    def __init__(self, options: ClientOptions) -> None:
        self.options = options
        self.state = State.IDLE
        self.server = ServerLimits()
        self.keepalive = options.keepalive  # in force: the server may set its own (MQTT 5)
        self.assigned_client_id: str | None = None
        self._parser = Parser(protocol_level=5 if options.level == 5 else 4)
        self._out: list[bytes] = []  # what receiving obliged us to send, for `data_to_send`
        self._next_id = 0
        self._outgoing: dict[int, _Outgoing] = {}  # packet id -> our publish in flight, in send order
        self._requests: dict[int, str] = {}  # packet id -> "subscribe" / "unsubscribe" awaiting its ack
        self._pending: dict[int, int] = {}  # packet id -> QoS of an Incoming not yet stored (`incoming_stored`)
        self._stale: dict[int, int] = {}  # packet id -> Incomings of a lost session still to be stored: ignored
        self._released: set[int] = set()  # incoming QoS 2 ids PUBREC'd, waiting for PUBREL
        self._last_send = 0.0
        self._ping_due: float | None = None  # a PINGREQ is out: its PINGRESP is due by then
        self._session_present = False  # of the connection: re-sends waiting for a slot then go with DUP

    # --- connection ----------------------------------------------------------------------------------------
    def connect(self, now: float) -> bytes:
        """A new connection: the CONNECT to send first. The parser starts afresh; the in-flight table stays."""
        o = self.options
        self._parser = Parser(protocol_level=5 if o.level == 5 else 4)
        self._out.clear()
        self._requests.clear()  # a SUBSCRIBE is not re-sent: its caller is told the connection was lost
        self.server = ServerLimits()
        self.keepalive = o.keepalive
        self._ping_due = None
        self._last_send = now
        self.state = State.CONNECTING
        properties: dict[int, Any] = {}
        if o.level == 5:
            if o.session_expiry:
                properties[P.SESSION_EXPIRY_INTERVAL] = o.session_expiry
            if o.receive_maximum != 65535:
                properties[P.RECEIVE_MAXIMUM] = o.receive_maximum
            if o.try_private:
                properties[P.USER_PROPERTY] = [BRIDGE_PROPERTY]
        will = o.will
        if will is not None and o.level != 5 and will.properties:
            will = Will(will.topic, will.payload, will.qos, will.retain)
        # The level byte goes as given (3 with "MQIsdp"); `bridge` sets its top bit.
        packet = Connect(o.client_id, o.level, o.clean_start, o.keepalive, will, o.username, o.password, properties,
                         "MQIsdp" if o.level == 3 else "MQTT", bridge=o.try_private and o.level != 5)
        return encode(packet, o.level)

    def connection_lost(self) -> None:
        """The connection is gone (whichever side ended it): nothing is sent until the next `connect`."""
        self.state = State.IDLE
        self._requests.clear()
        self._ping_due = None

    def disconnect(self, reason: int = 0) -> bytes:
        """The DISCONNECT to send (MQTT 5: with `reason`; >= 0x80 or 0x04 still has the server publish our will)."""
        if self.state not in (State.CONNECTING, State.CONNECTED):
            return b""
        self.state = State.CLOSED
        return encode(Disconnect(reason if self.options.level == 5 else 0), self.options.level)

    @property
    def connected(self) -> bool:
        return self.state is State.CONNECTED

    # --- bytes in ------------------------------------------------------------------------------------------
    def receive(self, data: bytes, now: float) -> list[Event]:
        """Bytes read from the connection -> events; raises ClientProtocolError when the server breaks MQTT."""
        if self.state not in (State.CONNECTING, State.CONNECTED):
            return []
        try:
            packets = self._parser.feed(data)
        except CodecError as exc:
            raise ClientProtocolError(exc.reason_code, exc.message) from None
        events: list[Event] = []
        for packet in packets:
            if self.state is State.CONNECTING:
                if type(packet) is not Connack:
                    raise ClientProtocolError(ReasonCode.PROTOCOL_ERROR, f"{type(packet).__name__} before CONNACK")
                self._on_connack(packet, events)
            elif self.state is State.CONNECTED:
                self._handle(packet, events)
            else:
                break  # refused or disconnected: what follows is of no use
        return events

    def data_to_send(self) -> bytes:
        """What the packets received so far oblige us to send (take it after every `receive`)."""
        out, self._out = self._out, []
        return b"".join(out)

    def _handle(self, packet: Packet, events: list[Event]) -> None:
        if isinstance(packet, Publish):
            self._on_publish(packet, events)
        elif isinstance(packet, Puback):
            entry = self._outgoing.get(packet.packet_id)
            if entry is not None and entry.qos == 1 and entry.sent:
                self._finish(packet.packet_id, packet.reason_code, events)
        elif isinstance(packet, Pubrec):
            self._on_pubrec(packet, events)
        elif isinstance(packet, Pubcomp):
            entry = self._outgoing.get(packet.packet_id)
            if entry is not None and entry.released:
                self._finish(packet.packet_id, packet.reason_code, events)
        elif isinstance(packet, Pubrel):
            pid = packet.packet_id
            if pid in self._released:
                self._released.discard(pid)
                self._out.append(pubcomp(pid))
            else:  # already completed (our PUBCOMP was lost) or never seen: complete it anyway
                self._out.append(encode(Pubcomp(pid, ReasonCode.PACKET_IDENTIFIER_NOT_FOUND), self.options.level))
        elif isinstance(packet, Pingresp):
            self._ping_due = None
        elif isinstance(packet, Suback):
            if self._requests.pop(packet.packet_id, None) == "subscribe":
                events.append(Subscribed(packet.packet_id, packet.reason_codes))
        elif isinstance(packet, Unsuback):
            if self._requests.pop(packet.packet_id, None) == "unsubscribe":
                events.append(Unsubscribed(packet.packet_id, packet.reason_codes))
        elif isinstance(packet, Disconnect) and self.options.level == 5:
            self.state = State.CLOSED
            events.append(ServerDisconnect(packet.reason_code, packet.properties.get(P.REASON_STRING)))
        else:  # CONNECT, a second CONNACK, SUBSCRIBE, PINGREQ, AUTH (we never offer enhanced authentication)
            raise ClientProtocolError(ReasonCode.PROTOCOL_ERROR, f"a server does not send {type(packet).__name__}")

    def _on_connack(self, packet: Connack, events: list[Event]) -> None:
        o = self.options
        if packet.reason_code:
            self.state = State.CLOSED
            reason = _describe(packet.reason_code, o.level)
            text = packet.properties.get(P.REASON_STRING)
            events.append(Refused(packet.reason_code, f"{reason}: {text}" if text else reason))
            return
        if packet.session_present and o.clean_start:
            raise ClientProtocolError(ReasonCode.PROTOCOL_ERROR, "CONNACK with a session present to a clean start")
        props = packet.properties
        if o.level == 5:
            self.server = ServerLimits(
                props.get(P.RECEIVE_MAXIMUM, 65535), props.get(P.MAXIMUM_QOS, 2),
                bool(props.get(P.RETAIN_AVAILABLE, 1)), props.get(P.MAXIMUM_PACKET_SIZE, 0),
                props.get(P.SERVER_KEEP_ALIVE))
            if self.server.receive_maximum == 0:
                raise ClientProtocolError(ReasonCode.PROTOCOL_ERROR, "CONNACK with Receive Maximum 0")
            if self.server.keepalive is not None:
                self.keepalive = self.server.keepalive
            self.assigned_client_id = props.get(P.ASSIGNED_CLIENT_IDENTIFIER)
        self.state = State.CONNECTED
        self._session_present = packet.session_present
        if not packet.session_present:
            # The server has no state of ours: incoming ids start afresh (an Incoming of the old session still
            # being stored must not acknowledge a new message that reuses its id), ours go out again as new.
            for pid in self._pending:
                self._stale[pid] = self._stale.get(pid, 0) + 1
            self._pending.clear()
            self._released.clear()
        events.append(Connected(packet.session_present, props))
        self._resend(packet.session_present, events)

    def _resend(self, present: bool, events: list[Event]) -> None:
        """After a CONNACK: the in-flight table again, in order, within the server's Receive Maximum (the rest as
        acknowledgements free slots). With the session present, unacknowledged publishes go with DUP and their
        ids and released QoS 2 as PUBREL (MQTT 3.1.1 4.4); without it each is a new publish, under the new
        limits: one the server's QoS cap makes QoS 0 goes and is over, one too large for it fails (`Acked`
        after the `Connected`)."""
        limit = self._window()
        for pid, entry in list(self._outgoing.items()):
            entry.sent = False
            if not present:
                entry.released = False
                entry.qos = min(entry.qos, self.server.maximum_qos)
                if not self.server.retain_available:
                    entry.retain = False
                problem = self._too_large(entry, pid)
                if problem is not None or entry.qos == 0:
                    if entry.qos == 0 and problem is None:
                        self._out.append(self._encode_publish(entry, 0, False))
                    del self._outgoing[pid]
                    self._report(events, entry.token, ReasonCode.PACKET_TOO_LARGE if problem is not None else 0)
                    continue
            if limit > 0:
                self._send_entry(pid, entry, dup=present)
                limit -= 1

    def _report(self, events: list[Event], token: object, code: int) -> None:
        if not events or not isinstance(events[-1], Acked):
            events.append(Acked([]))
        acked = events[-1]
        assert isinstance(acked, Acked)
        acked.tokens.append(token)
        if code >= 0x80:
            acked.failed[token] = code

    def _send_entry(self, pid: int, entry: _Outgoing, dup: bool) -> None:
        entry.sent = True
        self._out.append(pubrel(pid) if entry.released else self._encode_publish(entry, pid, dup))

    def _finish(self, pid: int, code: int, events: list[Event]) -> None:
        entry = self._outgoing.pop(pid)
        self._report(events, entry.token, code)
        # A slot freed: a re-send that waited for one goes now.
        for waiting_pid, waiting in self._outgoing.items():
            if not waiting.sent:
                self._send_entry(waiting_pid, waiting, dup=self._session_present)
                break

    def _on_pubrec(self, packet: Pubrec, events: list[Event]) -> None:
        pid = packet.packet_id
        entry = self._outgoing.get(pid)
        if entry is None or entry.qos != 2 or not entry.sent:
            if self.options.level == 5:
                self._out.append(encode(Pubrel(pid, ReasonCode.PACKET_IDENTIFIER_NOT_FOUND), 5))
            else:
                self._out.append(pubrel(pid))
            return
        if packet.reason_code >= 0x80:
            self._finish(pid, packet.reason_code, events)  # the flow ends here, refused (MQTT 5 4.3.3)
            return
        entry.released = True  # a PUBREC repeated (our PUBREL lost) is answered again
        self._out.append(pubrel(pid))

    def _on_publish(self, packet: Publish, events: list[Event]) -> None:
        pid = packet.packet_id
        qos = packet.qos
        props = packet.properties
        if props and P.TOPIC_ALIAS in props:
            raise ClientProtocolError(ReasonCode.TOPIC_ALIAS_INVALID, "a topic alias, and we allow none")
        if qos == 2 and pid in self._released:
            self._out.append(pubrec(pid))  # a re-send of one stored already: acknowledge again, not twice stored
            return
        if qos and pid in self._pending:
            return  # a re-send (new connection, same session) of one the caller is storing: acknowledged then
        if qos and self.options.level == 5 and len(self._pending) + len(self._released) >= self.options.receive_maximum:
            raise ClientProtocolError(ReasonCode.RECEIVE_MAXIMUM_EXCEEDED, "more QoS 1/2 publishes than allowed")
        block = b""
        expiry = None
        if props:
            expiry = props.get(P.MESSAGE_EXPIRY_INTERVAL)
            block = stored_properties(props)
        if qos:
            self._pending[pid] = qos
        events.append(Incoming(packet.topic, packet.payload, qos, packet.retain, pid, block, packet.dup, expiry))

    # --- what the caller does ------------------------------------------------------------------------------
    def incoming_stored(self, packet_id: int) -> bytes:
        """An `Incoming` QoS 1/2 publish is durable: the PUBACK / PUBREC to send (call once per such Incoming).
        Between connections the state still moves (a QoS 2 id becomes released) and b"" is returned."""
        stale = self._stale.get(packet_id)
        if stale:
            if stale == 1:
                del self._stale[packet_id]
            else:
                self._stale[packet_id] = stale - 1
            return b""
        qos = self._pending.pop(packet_id, 0)
        if not qos:
            return b""
        if qos == 2:
            self._released.add(packet_id)
        if self.state is not State.CONNECTED:
            return b""
        return puback(packet_id) if qos == 1 else pubrec(packet_id)

    def credit(self) -> int:
        """How many more QoS 1/2 publishes may go now: our cap and the server's Receive Maximum, less what is
        in flight (0 while not connected)."""
        if self.state is not State.CONNECTED:
            return 0
        return max(0, self._window() - len(self._outgoing))

    def _window(self) -> int:
        return min(self.options.max_inflight, self.server.receive_maximum)

    def qos_for(self, qos: int) -> int:
        """The QoS a publish asked with `qos` goes out with: the server's Maximum QoS caps it. At 0 there is no
        acknowledgement: the publish is done once written (no `Acked`)."""
        return min(qos, self.server.maximum_qos)

    def publish(self, topic: str, payload: bytes, qos: int, retain: bool, token: object,
                properties: bytes = b"", expiry: int | None = None) -> bytes:
        """A PUBLISH to send. `properties`: the stored MQTT 5 block (`Message.properties`), sent as it is at level
        5, dropped at 3/4; `expiry`: a Message Expiry Interval (seconds) to add (5). QoS (capped by `qos_for`)
        1/2 takes a packet id and a slot of `credit()` until `Acked` names `token`. Raises PacketTooLarge,
        ClientStateError (not connected, or no credit), ValueError (a topic that is not a topic name)."""
        if self.state is not State.CONNECTED:
            raise ClientStateError(f"publish while {self.state.value}")
        if not topic or "+" in topic or "#" in topic or "\x00" in topic or len(topic.encode()) > 0xFFFF:
            raise ValueError(f"not a topic name to publish to: {topic!r}")
        qos = self.qos_for(qos)
        if not self.server.retain_available:
            retain = False
        block = b""
        if self.options.level == 5:
            block = properties
            if expiry is not None:
                block += encode_properties({P.MESSAGE_EXPIRY_INTERVAL: expiry})
        entry = _Outgoing(token, topic, payload, qos, retain, block)
        problem = self._too_large(entry, 1 if qos else 0)
        if problem is not None:
            raise PacketTooLarge(problem)
        if qos == 0:
            return self._encode_publish(entry, 0, False)
        if self.credit() <= 0:
            raise ClientStateError("no credit: wait for an Acked (or a new connection)")
        pid = self._take_id()
        self._outgoing[pid] = entry
        return self._encode_publish(entry, pid, False)

    def _encode_publish(self, entry: _Outgoing, pid: int, dup: bool) -> bytes:
        head, tail = publish_parts(entry.topic, entry.payload, entry.qos, entry.retain, entry.properties,
                                   self.options.level)
        if dup:
            head = bytes((head[0] | 0x08,)) + head[1:]
        return head + pid.to_bytes(2, "big") + tail if entry.qos else head + tail

    def _too_large(self, entry: _Outgoing, pid: int) -> str | None:
        limits = [n for n in (self.options.max_packet_size, self.server.maximum_packet_size) if n]
        if not limits:
            return None
        size = len(self._encode_publish(entry, pid, False))
        if size > min(limits):
            return f"a PUBLISH of {size} bytes to {entry.topic!r}: the limit is {min(limits)} bytes"
        return None

    def subscribe(self, requests: list[tuple[str, int, bool, bool]]) -> tuple[int, bytes]:
        """(packet id, SUBSCRIBE) for (filter, qos, no_local, retain_as_published) each; `Subscribed` answers.
        No Local and Retain As Published exist in MQTT 5 only (a 3.x bridge gets both from Mosquitto by
        `try_private`)."""
        if self.state is not State.CONNECTED:
            raise ClientStateError(f"subscribe while {self.state.value}")
        pid = self._take_id()
        subs = [SubscriptionRequest(f, q, nl, rap) for f, q, nl, rap in requests]
        data = encode(Subscribe(pid, subs), self.options.level)
        self._check_size(data, "SUBSCRIBE")
        self._requests[pid] = "subscribe"
        return pid, data

    def unsubscribe(self, filters: list[str]) -> tuple[int, bytes]:
        """(packet id, UNSUBSCRIBE); `Unsubscribed` answers."""
        if self.state is not State.CONNECTED:
            raise ClientStateError(f"unsubscribe while {self.state.value}")
        pid = self._take_id()
        data = encode(Unsubscribe(pid, list(filters)), self.options.level)
        self._check_size(data, "UNSUBSCRIBE")
        self._requests[pid] = "unsubscribe"
        return pid, data

    def _check_size(self, data: bytes, what: str) -> None:
        limits = [n for n in (self.options.max_packet_size, self.server.maximum_packet_size) if n]
        if limits and len(data) > min(limits):
            raise PacketTooLarge(f"a {what} of {len(data)} bytes: the limit is {min(limits)} bytes")

    def _take_id(self) -> int:
        for _ in range(MAX_PACKET_ID):
            self._next_id = self._next_id % MAX_PACKET_ID + 1
            pid = self._next_id
            if pid not in self._outgoing and pid not in self._requests:
                return pid
        raise ClientStateError("every packet id is in use")

    def unacked(self) -> list[object]:
        """The tokens of our QoS 1/2 publishes not acknowledged yet, in the order they were first sent."""
        return [entry.token for entry in self._outgoing.values()]

    # --- keepalive -----------------------------------------------------------------------------------------
    def sent(self, now: float) -> None:
        """The caller wrote bytes at `now`: the next PINGREQ is due `keepalive` s later. (Without these calls the
        PINGREQ goes every `keepalive` s whatever else is sent: still correct.)"""
        self._last_send = now

    def tick(self, now: float) -> bytes:
        """A PINGREQ when one is due (`keepalive` s since the last send); raises KeepaliveTimeout when the last
        PINGREQ went unanswered for half the keepalive."""
        if self.state is not State.CONNECTED or not self.keepalive:
            return b""
        if self._ping_due is not None:
            if now >= self._ping_due:
                raise KeepaliveTimeout(f"no PINGRESP within {self.keepalive / 2:g} s")
            return b""
        if now >= self._last_send + self.keepalive:
            self._last_send = now
            self._ping_due = now + self.keepalive / 2
            return PINGREQ
        return b""

    def next_deadline(self) -> float | None:
        """When `tick` has something to do (None: nothing to time)."""
        if self.state is not State.CONNECTED or not self.keepalive:
            return None
        if self._ping_due is not None:
            return self._ping_due
        return self._last_send + self.keepalive
