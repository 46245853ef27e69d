"""The sans-IO AMQP 0.9.1 connection: bytes in → events, calls → bytes out. No sockets, no clock of its own.

It runs the handshake (protocol header, Start/StartOk with SASL PLAIN, Tune/TuneOk, Open), opens and closes
channels, assembles a Basic.Publish with its content header and body frames into one `Command`, sends and
checks heartbeats (`tick`), and turns every framing problem into a Channel.Close or Connection.Close with the
right reply code. What a command means (exchanges, queues, consumers) is the caller's business.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pamqp import body, commands, header, heartbeat

from tidewire.gateway.protocols.amqp.codec import (
    CHANNEL_ERROR,
    COMMAND_INVALID,
    FRAME_ERROR,
    MIN_FRAME_MAX,
    NOT_ALLOWED,
    NOT_IMPLEMENTED,
    PRECONDITION_FAILED,
    PROTOCOL_HEADER,
    RESOURCE_ERROR,
    UNEXPECTED_FRAME,
    Fault,
    FrameReader,
    FrameValue,
    Method,
    Properties,
    content_frames,
    fault,
    method_frame,
    parse_plain,
)
from tidewire.gateway.protocols.amqp.codec import HEARTBEAT as HEARTBEAT_FRAME
from tidewire.gateway.protocols.amqp.events import (
    Authenticate,
    ChannelClosed,
    ChannelCloseRequested,
    ChannelOpened,
    ClientInfo,
    CloseRequested,
    Command,
    Event,
    Limits,
    Opened,
    State,
)

Connection = commands.Connection
Channel = commands.Channel
MAX_BUFFERED_BODIES = 4  # max-size bodies being received at once on one connection (memory bound per client)


class _Slot:
    """A channel as the framing layer sees it."""

    __slots__ = ("body", "client_closing", "closing", "method", "properties", "received", "size")

    def __init__(self) -> None:
        self.closing = False  # Channel.Close sent: frames are ignored until CloseOk, queued commands dropped
        self.client_closing = False  # Channel.Close received: later frames ignored, queued commands still run
        self.method: Method | None = None  # a Basic.Publish awaiting its content
        self.properties: Properties | None = None
        self.size = -1  # body size from the content header; -1: header not yet received
        self.received = 0
        self.body: list[bytes] = []


class ConnectionCore:
    """One connection's protocol state. `receive` returns events; output accumulates for `data_to_send`, and
    `wake` is called whenever output becomes pending (so the I/O layer can coalesce writes)."""

    def __init__(self, limits: Limits, server_properties: dict[str, Any], wake: Callable[[], None],
                 now: float) -> None:
        self.limits = limits
        self.server_properties = server_properties
        self.state = State.HEADER
        self.client = ClientInfo()
        self.frame_max = limits.frame_max
        self.channel_max = limits.channel_max
        self.heartbeat = 0
        self.vhost = ""
        # Which vhosts Connection.Open may name: the configured ones, until authentication says (tenants).
        self.vhost_allowed: Callable[[str], bool] = limits.vhosts.__contains__
        self.close_reason: Fault | None = None  # what closed the connection (ours or the client's)
        self._open_refusal: tuple[int, str] | None = None  # admission's answer to Connection.Open (`refuse_open`)
        self._wake = wake
        self._out: list[bytes] = []
        self._reader = FrameReader(max(MIN_FRAME_MAX, limits.frame_max))
        self._head = b""
        self._slots: dict[int, _Slot] = {}
        self._last_recv = self._last_send = now
        self._blocked = False
        self._buffered = 0  # body bytes announced by content headers and not yet complete, every channel

    # --- output ------------------------------------------------------------------------------------------
    def _write(self, data: bytes) -> None:
        if self.state is State.CLOSED:
            return
        if not self._out:
            self._wake()
        self._out.append(data)

    def data_to_send(self) -> bytes:
        out, self._out = self._out, []
        return b"".join(out)

    def send_method(self, channel: int, method: Method) -> None:
        self._write(method_frame(channel, method))

    def send_content(self, channel: int, method: Method, properties: Properties, payload: bytes) -> None:
        self._write(content_frames(channel, method, properties, payload, self.frame_max))

    # --- state for the caller ---------------------------------------------------------------------------
    @property
    def open(self) -> bool:
        return self.state is State.OPEN

    @property
    def closed(self) -> bool:
        return self.state is State.CLOSED

    def channel_open(self, channel: int) -> bool:
        slot = self._slots.get(channel)
        return self.state in (State.OPEN, State.CLIENT_CLOSING) and slot is not None and not slot.closing

    # --- input -------------------------------------------------------------------------------------------
    def receive(self, data: bytes, now: float) -> list[Event]:
        self._last_recv = now
        if self.state is State.CLOSED:
            return []
        if self.state is State.HEADER:
            self._head += data
            if len(self._head) < len(PROTOCOL_HEADER):
                return []
            data, head = self._head[len(PROTOCOL_HEADER):], self._head[:len(PROTOCOL_HEADER)]
            self._head = b""
            if head != PROTOCOL_HEADER:
                # Spec 4.2.2: answer with the protocol header we speak, then close.
                self._write(PROTOCOL_HEADER)
                self.close_reason = Fault(FRAME_ERROR, "bad protocol header")
                self.state = State.CLOSED
                return []
            self._start()
        frames, problem = self._reader.feed(data)
        events: list[Event] = []
        for channel, value in frames:
            self._frame(channel, value, events)
            if self.state is State.CLOSED:
                return events
        if problem is not None and self.state is not State.CLOSED:
            self.close_connection(problem)
            self._finish()  # nothing past a framing fault can be read: close once the Close is written
        return events

    def _start(self) -> None:
        self.state = State.START
        self.send_method(0, Connection.Start(0, 9, self.server_properties, "PLAIN", "en_US"))

    def _frame(self, channel: int, value: FrameValue, events: list[Event]) -> None:
        if isinstance(value, heartbeat.Heartbeat):
            return
        if self.state is State.CLIENT_CLOSING:
            return  # the client said Close: nothing may follow
        if self.state is State.CLOSING:
            # Spec: after sending Close, discard everything but Close/CloseOk.
            if isinstance(value, Connection.CloseOk | Connection.Close):
                if isinstance(value, Connection.Close):
                    self.send_method(0, Connection.CloseOk())
                self._finish()
            return
        if channel == 0:
            if isinstance(value, Method):
                self._connection_method(value, events)
            else:
                self.close_connection(Fault(UNEXPECTED_FRAME, "content frame on channel 0"))
            return
        if self.state is not State.OPEN:
            self.close_connection(Fault(CHANNEL_ERROR, f"frame on channel {channel} before the connection opened"))
            return
        slot = self._slots.get(channel)
        if isinstance(value, Channel.Open):
            if slot is not None:
                self.close_connection(fault(CHANNEL_ERROR, f"second 'channel.open' seen on {channel}", value))
            elif channel > self.channel_max:
                self.close_connection(fault(NOT_ALLOWED, f"channel {channel} above channel_max "
                                                         f"{self.channel_max}", value))
            else:
                self._slots[channel] = _Slot()
                self.send_method(channel, Channel.OpenOk())
                events.append(ChannelOpened(channel))
            return
        if slot is None:
            what = value.name if isinstance(value, Method) else "content"
            self.close_connection(Fault(CHANNEL_ERROR, f"expected 'channel.open' on channel {channel}, got {what}"))
            return
        if slot.client_closing:
            return
        if slot.closing:  # (its content was dropped when the Close was sent)
            if isinstance(value, Channel.CloseOk):
                del self._slots[channel]
            elif isinstance(value, Channel.Close):
                self.send_method(channel, Channel.CloseOk())  # both sides closed at once
            return
        if isinstance(value, Method):
            self._channel_method(channel, slot, value, events)
        elif isinstance(value, header.ContentHeader):
            self._content_header(channel, slot, value, events)
        elif isinstance(value, body.ContentBody):
            self._content_body(channel, slot, value.value, events)

    def _connection_method(self, method: Method, events: list[Event]) -> None:
        state = self.state
        if isinstance(method, Connection.Close):
            self.close_reason = Fault(method.reply_code or 0, str(method.reply_text or ""), method.class_id or 0,
                                      method.method_id or 0)
            events.append(CloseRequested())
            self.state = State.CLIENT_CLOSING
        elif state is State.START and isinstance(method, Connection.StartOk):
            self._start_ok(method, events)
        elif state is State.TUNE and isinstance(method, Connection.TuneOk):
            self._tune_ok(method)
        elif state is State.OPEN_WAIT and isinstance(method, Connection.Open):
            if self._open_refusal is not None:
                self.close_connection(fault(*self._open_refusal, method))
                return
            if not self.vhost_allowed(method.virtual_host):
                self.close_connection(fault(NOT_ALLOWED, f"vhost {method.virtual_host!r} not found", method))
                return
            self.vhost = method.virtual_host
            self.state = State.OPEN
            self.send_method(0, Connection.OpenOk())
            events.append(Opened(self.vhost))
        elif isinstance(method, Connection.UpdateSecret):
            self.close_connection(fault(NOT_IMPLEMENTED, "connection.update-secret", method))
        elif isinstance(method, Connection.Blocked | Connection.Unblocked) and state is State.OPEN:
            pass  # a client telling us it is blocked: nothing to do
        else:
            self.close_connection(fault(COMMAND_INVALID, f"unexpected {method.name} on channel 0", method))

    def _start_ok(self, method: Any, events: list[Event]) -> None:
        props = method.client_properties if isinstance(method.client_properties, dict) else {}
        caps = props.get("capabilities")
        self.client = ClientInfo(props, caps if isinstance(caps, dict) else {})
        if method.mechanism != "PLAIN":
            self.close_connection(fault(COMMAND_INVALID, f"unknown authentication mechanism "
                                                         f"{str(method.mechanism)[:40]!r}", method))
            return
        credentials = parse_plain(method.response)
        if credentials is None:
            self.close_connection(fault(403, "malformed PLAIN response", method))
            return
        events.append(Authenticate(*credentials))
        self.state = State.AUTH

    def auth_accepted(self) -> None:
        if self.state is not State.AUTH:
            return
        self._tune()

    def refuse_open(self, code: int, text: str) -> None:
        """Admission turned the connection away before authenticating it: the handshake goes on, unauthenticated,
        and Connection.Open is answered with Connection.Close `code` (where clients expect a connection limit,
        as RabbitMQ's; a Close answering Start-Ok reads to them as a failed login)."""
        if self.state is not State.AUTH:
            return
        self._open_refusal = (code, text)
        self._tune()

    def _tune(self) -> None:
        self.state = State.TUNE
        limits = self.limits
        self.send_method(0, Connection.Tune(limits.channel_max, limits.frame_max, limits.heartbeat))

    def auth_refused(self, text: str) -> None:
        if self.state is State.AUTH:
            self.close_connection(Fault(403, text, 10, 11))

    def _tune_ok(self, method: Any) -> None:
        frame_max = method.frame_max or self.limits.frame_max
        if frame_max < MIN_FRAME_MAX or frame_max > self.limits.frame_max:
            self.close_connection(fault(NOT_ALLOWED, f"frame_max={frame_max} outside "
                                                     f"[{MIN_FRAME_MAX}, {self.limits.frame_max}]", method))
            return
        channel_max = method.channel_max or self.limits.channel_max
        if channel_max > self.limits.channel_max:
            self.close_connection(fault(NOT_ALLOWED, f"channel_max={channel_max} above "
                                                     f"{self.limits.channel_max}", method))
            return
        self.frame_max = frame_max
        self._reader.frame_max = frame_max
        self.channel_max = channel_max
        self.heartbeat = method.heartbeat  # the client's choice, as RabbitMQ takes it (0: none)
        self.state = State.OPEN_WAIT

    def _channel_method(self, channel: int, slot: _Slot, method: Method, events: list[Event]) -> None:
        if slot.method is not None:
            self.close_connection(fault(UNEXPECTED_FRAME, f"expected content header for class 60, got "
                                                          f"{method.name}", method))
            return
        if isinstance(method, Channel.Close):
            slot.client_closing = True
            events.append(ChannelCloseRequested(channel))
        elif isinstance(method, Channel.CloseOk):
            self.close_connection(fault(CHANNEL_ERROR, "unexpected channel.close-ok", method))
        elif isinstance(method, Channel.Flow):
            if method.active:
                self.send_method(channel, Channel.FlowOk(True))
            else:
                self.close_connection(fault(NOT_IMPLEMENTED, "active=false", method))
        elif method.index >> 16 == Connection.frame_id:
            self.close_connection(fault(COMMAND_INVALID, f"{method.name} on channel {channel}", method))
        elif isinstance(method, commands.Basic.Publish):
            slot.method = method
        else:
            events.append(Command(channel, method))

    def _content_header(self, channel: int, slot: _Slot, value: header.ContentHeader, events: list[Event]) -> None:
        if slot.method is None or slot.size >= 0:
            self.close_connection(Fault(UNEXPECTED_FRAME, "content header without a method expecting it"))
            return
        if value.body_size > self.limits.max_body:
            self.close_channel(channel, fault(PRECONDITION_FAILED, f"message size {value.body_size} is larger "
                                                                   f"than max size {self.limits.max_body}",
                                              commands.Basic.Publish()))
            events.append(ChannelClosed(channel))
            return
        if self._buffered + value.body_size > MAX_BUFFERED_BODIES * self.limits.max_body:
            self.close_connection(Fault(RESOURCE_ERROR, f"more than {MAX_BUFFERED_BODIES} maximum-size messages "
                                                        "in progress at once"))
            return
        slot.properties = value.properties
        slot.size = value.body_size
        self._buffered += slot.size
        if slot.size == 0:
            self._content_done(channel, slot, events)

    def _content_body(self, channel: int, slot: _Slot, chunk: bytes, events: list[Event]) -> None:
        if slot.size < 0:
            self.close_connection(Fault(UNEXPECTED_FRAME, "content body without a content header"))
            return
        slot.body.append(chunk)
        slot.received += len(chunk)
        if slot.received > slot.size:
            self.close_connection(Fault(FRAME_ERROR, f"content body of {slot.received} bytes, header said "
                                                     f"{slot.size}"))
        elif slot.received == slot.size:
            self._content_done(channel, slot, events)

    def _content_done(self, channel: int, slot: _Slot, events: list[Event]) -> None:
        assert slot.method is not None
        events.append(Command(channel, slot.method, slot.properties, b"".join(slot.body)))
        self._drop_content(slot)

    def _drop_content(self, slot: _Slot) -> None:
        if slot.size > 0:
            self._buffered -= slot.size
        slot.method, slot.properties, slot.size, slot.received, slot.body = None, None, -1, 0, []

    # --- closing -----------------------------------------------------------------------------------------
    def close_channel(self, channel: int, reason: Fault) -> None:
        """Close one channel (a soft error); frames on it are dropped until the client's CloseOk."""
        slot = self._slots.get(channel)
        if slot is None or slot.closing or slot.client_closing or self.state is not State.OPEN:
            return  # (closing by the client: its Close is answered with CloseOk once cleaned up)
        slot.closing = True
        self._drop_content(slot)
        self.send_method(channel, Channel.Close(reason.code, reason.reply_text(), reason.class_id, reason.method_id))

    def channel_close_ok(self, channel: int) -> None:
        """After a ChannelCloseRequested: the channel is cleaned up, confirm and free its number."""
        slot = self._slots.pop(channel, None)
        if slot is not None:
            self._drop_content(slot)
            if self.state is State.OPEN:
                self.send_method(channel, Channel.CloseOk())

    def close_connection(self, reason: Fault) -> None:
        if self.state in (State.CLOSING, State.CLIENT_CLOSING, State.CLOSED):
            return
        self.close_reason = reason
        if self.state is State.HEADER:
            self.state = State.CLOSED
            return
        self.send_method(0, Connection.Close(reason.code, reason.reply_text(), reason.class_id, reason.method_id))
        self.state = State.CLOSING

    def close_ok(self) -> None:
        """After a CloseRequested: everything is cleaned up."""
        if self.state is State.CLIENT_CLOSING:
            self.send_method(0, Connection.CloseOk())
            self._finish()

    def _finish(self) -> None:
        self.state = State.CLOSED
        self._slots.clear()

    # --- flow and liveness -------------------------------------------------------------------------------
    def block(self, reason: str) -> None:
        """Connection.Blocked to a client that understands it (it advertised `connection.blocked`)."""
        if not self._blocked and self.state is State.OPEN and self.client.capabilities.get("connection.blocked"):
            self._blocked = True
            self.send_method(0, Connection.Blocked(reason))

    def unblock(self) -> None:
        if self._blocked:
            self._blocked = False
            if self.state is State.OPEN:
                self.send_method(0, Connection.Unblocked())

    def touch(self, now: float) -> None:
        """Reading resumes after a pause: the silence while paused was ours, not the client's."""
        self._last_recv = now

    def sent(self, now: float) -> None:
        self._last_send = now

    def tick(self, now: float) -> bool:
        """Heartbeats: send one when nothing was sent for half the interval. False: the client was silent for
        two intervals (close the transport)."""
        beat = self.heartbeat
        if not beat or self.state not in (State.OPEN_WAIT, State.OPEN):
            return True
        if now - self._last_recv > 2 * beat:
            self.close_reason = Fault(FRAME_ERROR, "missed heartbeats from client")
            self.state = State.CLOSED
            return False
        if now - self._last_send >= beat / 2:
            self._write(HEARTBEAT_FRAME)
            self._last_send = now
        return True
