"""One MQTT connection's life around its packets: the socket, reading holds, writing, its deadlines (CONNECT
timeout, keepalive, close drain: on the listener's shared `Deadlines`) and credential expiry, and every way it
ends (abort, takeover, shutdown, graceful close).

`MqttConnection` (gateway/protocols/mqtt/connection.py) adds the packets; this class keeps only what belongs to
the socket: protocol level, keepalive, the will, inbound QoS 2 packet ids, and flow control in both directions.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, cast

from tidewire.extensions.auth import AuthSession
from tidewire.extensions.hooks import ClientInfo
from tidewire.gateway.node import Node
from tidewire.gateway.protocols.mqtt.codec import (
    Connack,
    ConnackCode311,
    Connect,
    Disconnect,
    Parser,
    PropertyId,
    ReasonCode,
    encode,
)
from tidewire.gateway.protocols.mqtt.connect import Terms
from tidewire.gateway.sessions.session import Session
from tidewire.gateway.transport.listeners import Bucket, Listener
from tidewire.gateway.transport.ratelimit import InboundLimiter
from tidewire.store.base import NEVER_EXPIRES, Ban, Message

log = logging.getLogger("tidewire.conn")

NEW, CONNECTING, AUTHENTICATING, CONNECTED, CLOSED = range(5)
_NOBODY = ClientInfo("", None)
# Why reading from a client is paused (a bit each): while any is set, the socket is not read. HOLD_PIPELINE is the
# node's: its append queue is full (its own bit, so the acks that lift HOLD_STORE cannot lift it).
HOLD_CONNECT, HOLD_STORE, HOLD_RATE, HOLD_PIPELINE = 1, 2, 4, 8


class ConnectionBase(asyncio.Protocol):
    __slots__ = (
        "_backlog", "_bucket", "_expiry_handle", "_holds", "_socket_full", "_state", "_subacks", "alias_max",
        "aliases_in", "auth", "clean_start", "client_id", "connected_at", "expiry", "inbound_qos2", "info",
        "keepalive", "last_rx", "level", "limiter", "listener", "max_packet", "node", "parser", "paused", "peer",
        "pending_qos1", "session", "transport", "unacked_in", "will", "will_delay",
    )

    def __init__(self, node: Node, listener: Listener, peer: tuple[str, int] | None = None) -> None:
        self.node = node
        self.listener = listener
        self.parser = Parser(node.settings.max_packet_size)
        self.transport: asyncio.Transport | None = None
        self.session: Session | None = None
        self.client_id = ""
        self.level = 4
        self.keepalive = 0
        self.expiry = 0
        self.last_rx = 0.0
        self.connected_at = 0.0
        self.clean_start = True  # as the CONNECT said (for operators: a 5.0 session's expiry is separate)
        self.paused = False
        self._holds = 0
        self._subacks: asyncio.Task[None] | None = None  # SUBACKs waiting for the store, sent in order
        self._socket_full = False  # the transport asked us to stop writing
        self.limiter: InboundLimiter | None = None
        self.unacked_in = 0  # inbound QoS 1/2 publishes waiting for the store
        self.pending_qos1 = 0  # inbound QoS 1 publishes not yet acknowledged (counts against Receive Maximum)
        self.alias_max = 0  # the client's Topic Alias Maximum: outgoing aliases we may use
        self.max_packet = 0  # the client's Maximum Packet Size (0: no limit)
        self.aliases_in: dict[int, str] | None = None
        # enhanced authentication in progress: (session, method, CONNECT and terms, or None when re-authenticating)
        self.auth: tuple[AuthSession, str, Connect | None, Terms | None] | None = None
        self.inbound_qos2: set[int] | None = None  # created on the first QoS 2 publish
        self.will: Message | None = None
        self.will_delay = 0
        self.peer = f"{peer[0]}:{peer[1]}" if peer is not None else ""  # the real client behind a PROXY header
        self.info = _NOBODY
        self._state = NEW
        self._backlog: list[Any] | None = None  # read while CONNECT is processed, or over the inbound rate
        self._bucket: Bucket | None = None  # where its deadline is filed: CONNECT timeout, keepalive, close drain
        self._expiry_handle: asyncio.TimerHandle | None = None  # credentials (token) expiry

    # --- asyncio.Protocol ---------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports aren't asyncio subclasses
        if not self.peer:
            peer = self.transport.get_extra_info("peername")
            self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self.transport.set_write_buffer_limits(high=self.node.settings.write_buffer_high)
        self.last_rx = now = time.monotonic()
        self.connected_at = time.time()  # for operators (admin API, dashboard)
        self._bucket = self.listener.deadlines.file(self, now + self.node.settings.connect_timeout)

    def eof_received(self) -> bool | None:
        return None  # close our side too: a half-closed MQTT connection is of no use

    def connection_lost(self, exc: Exception | None) -> None:
        if self._state != CLOSED:
            self._closed(will=True, reason="connection lost" if exc is None else str(exc))
        else:  # the client closed while we drained
            self._unfile()

    def _hold(self, why: int) -> None:
        if not self._holds and self.transport is not None:
            self.transport.pause_reading()
        self._holds |= why

    def _release(self, why: int) -> None:
        if self._holds & why:
            self._holds &= ~why
            if not self._holds and self.transport is not None and self._state != CLOSED:
                self.transport.resume_reading()

    def pause_publishes(self) -> None:
        """The node's append queue is full: stop reading this publisher; nothing it sent is dropped."""
        self._hold(HOLD_PIPELINE)

    def resume_publishes(self) -> None:
        self._release(HOLD_PIPELINE)

    def pause_writing(self) -> None:
        self.paused = True
        self._socket_full = True

    def resume_writing(self) -> None:
        self._socket_full = False
        if self._subacks is None:  # deliveries also wait for a SUBACK still owed (see `_suback_later`)
            self.paused = False
            if self.session is not None:
                self.session.resume_writing()

    # --- writing ------------------------------------------------------------------------------------------
    def write_chunks(self, chunks: list[bytes]) -> None:
        if self._state != CLOSED and self.transport is not None:
            if len(chunks) == 1:
                self.transport.write(chunks[0])
            else:
                self.transport.writelines(chunks)

    def durable(self, acks: list[bytes]) -> None:
        """The node's `DurableSink` call: PUBACK/PUBREC packets whose messages are now durable."""
        self.unacked_in -= len(acks)
        self.pending_qos1 -= sum(1 for ack in acks if ack[0] == 0x40)
        if self._state == CLOSED or self.transport is None:
            return
        self.transport.writelines(acks)
        if self._holds & HOLD_STORE and self.unacked_in <= self.node.settings.max_inbound_qos2 // 2:
            self._release(HOLD_STORE)

    def failed(self, acks: list[bytes], reason: str) -> None:
        """Never stored (the node is stopping): no ack, so the client publishes them again after reconnecting."""
        self.unacked_in -= len(acks)
        self.pending_qos1 -= sum(1 for ack in acks if ack[0] == 0x40)

    def _send(self, packet: Any) -> None:
        if self.transport is not None and self._state != CLOSED:
            self.transport.write(encode(packet, self.level))

    # --- closing ------------------------------------------------------------------------------------------
    def abort(self, reason: int, message: str) -> None:
        """Close because of a protocol violation: 5.0 gets a DISCONNECT with the reason first; will is sent."""
        log.warning("client.protocol_error", extra={"client_id": self.client_id, "peer": self.peer,
                                                    "reason_code": hex(reason), "detail": message})
        if self.level >= 5 and self._state == CONNECTED:
            self._send(Disconnect(reason, {PropertyId.REASON_STRING: message[:200]}))
        elif self._state == NEW and reason == ReasonCode.UNSUPPORTED_PROTOCOL_VERSION:
            if self.transport is not None:  # 3.1.1 form: the only one a client of any level can read
                self.transport.write(encode(Connack(False, ConnackCode311.UNACCEPTABLE_PROTOCOL_VERSION), 4))
        elif self._state == NEW and self.parser.protocol_level == 5:
            self.level = 5
            self._send(Connack(False, reason))  # a malformed 5.0 CONNECT is answered with a CONNACK
        self._closed(will=True, reason=message)

    def shutdown(self, reason: int, properties: dict[int, Any] | None = None) -> None:
        """The node stops (`gateway.ops.drain`): 5.0 gets DISCONNECT `reason` with `properties` (0x8B, or 0x9C with a
        Server Reference), 3.1.1 a closed connection; the session is parked. The client sent no DISCONNECT, so
        its will is due (MQTT 5 3.1.2.5): published now when its delay is 0 or the session ends with the
        connection; a delayed one stays stored, for the client to cancel by coming back in time (here or on
        another node), else the next start publishes it."""
        if self.level >= 5 and self._state == CONNECTED:
            self._send(Disconnect(reason, properties if properties is not None
                                  else {PropertyId.REASON_STRING: "server shutting down"}))
        delay = min(self.will_delay, self.expiry) if self.expiry < NEVER_EXPIRES else self.will_delay
        self._closed(will=delay <= 0, reason="server shutdown", keep_will=True)

    def kick(self, detail: str) -> None:
        """Closed by an operator (a ban): 5.0 gets DISCONNECT 0x98 Administrative action (0x8A Banned is not a
        DISCONNECT code). The will is published, as for any end the client did not ask for."""
        if self._state == CLOSED:
            return
        log.info("client.kicked", extra={"client_id": self.client_id, "peer": self.peer, "detail": detail})
        if self.level >= 5 and self._state == CONNECTED:
            self._send(Disconnect(ReasonCode.ADMINISTRATIVE_ACTION, {PropertyId.REASON_STRING: detail[:200]}))
        self._closed(will=True, reason=detail)

    def take_over(self) -> Session | None:
        """Another connection claims this client id: close this one and hand its session over."""
        session = self.session
        self.node.sys.event(self.client_id, "takeover", address=self.peer, proto_ver=self.level)
        if self.level >= 5 and self._state == CONNECTED:
            self._send(Disconnect(ReasonCode.SESSION_TAKEN_OVER,
                                  {PropertyId.REASON_STRING: "another connection took over this client id"}))
        self._closed(will=True, reason="session taken over", transfer=True)
        return session

    def _closed(self, *, will: bool, reason: str, transfer: bool = False, keep_will: bool = False,
                drain: bool = True) -> None:
        """`drain`: we sent a last packet the client must read (see `_close_gracefully`); not when the client
        ended the connection itself."""
        was_connected = self._state == CONNECTED
        self._state = CLOSED
        self._unfile()
        if self._expiry_handle is not None:
            self._expiry_handle.cancel()
            self._expiry_handle = None
        if drain:
            self._close_gracefully()
        elif self.transport is not None:
            self.transport.close()
        if not was_connected or self.session is None:
            return
        self.listener.connections -= 1
        session, self.session = self.session, None
        self.node.sessions.close(self, session, transfer=transfer)
        if self.will is not None and will:
            delay = min(self.will_delay, self.expiry) if self.expiry < NEVER_EXPIRES else self.will_delay
            self.node.wills.publish_after(self.client_id, self.will, delay)
        elif self.will is not None and not keep_will:
            self.node.writes.drop_will(self.client_id)
        at = logging.INFO if self.node.sys.activity.line("disconnected") else logging.DEBUG  # as client.connected
        if log.isEnabledFor(at):
            log.log(at, "client.disconnected", extra={"client_id": self.client_id, "peer": self.peer,
                                                         "reason": reason})
        self.node.sys.event(self.client_id, "disconnected", address=self.peer, proto_ver=self.level, reason=reason)

    def _close_gracefully(self) -> None:
        """Our last packet (CONNACK refusal, DISCONNECT) must reach a client that may still be sending: closing
        a socket with unread input makes the kernel send a reset, which can destroy our packet before the
        client reads it. So: end our side (FIN after the queued bytes), keep reading and dropping what the
        client still sends, and close when it closes or after `close_drain_timeout`."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        timeout = self.node.settings.close_drain_timeout
        if timeout <= 0:
            transport.close()
            return
        if transport.can_write_eof():
            try:
                transport.write_eof()
            except OSError:  # the peer is already gone (ENOTCONN): nothing left to drain
                transport.close()
                return
        # TLS and WebSocket cannot half-close: the client closes after reading our packet, or the deadline does.
        self._holds = 0
        transport.resume_reading()
        self._file(time.monotonic() + timeout)

    def _refuse(self, code311: int, code5: int, detail: str) -> None:
        log.info("client.refused", extra={"client_id": self.client_id, "peer": self.peer, "detail": detail})
        self._send(Connack(False, code5 if self.level >= 5 else code311))
        self._closed(will=False, reason=detail)

    def _banned(self, ban: Ban) -> None:
        """Refused by a ban (`gateway.ops.bans`): 5.0 CONNACK 0x8A, 3.1.1 code 5."""
        self.node.bans.banned_refused += 1
        return self._refuse(ConnackCode311.NOT_AUTHORIZED, ReasonCode.BANNED, f"banned ({ban.kind})")

    def _take_terms(self, terms: Terms) -> None:
        """What CONNECT negotiated, for the life of the connection."""
        self.info = terms.info
        self.keepalive = terms.keepalive
        self.expiry = terms.expiry
        self.alias_max = terms.alias_max
        self.max_packet = terms.max_packet
        self.will = terms.will
        self.will_delay = terms.will_delay

    def expiry_at(self, when: float | None) -> None:
        """Close the connection when its credentials expire (epoch seconds; None: never)."""
        if self._expiry_handle is not None:
            self._expiry_handle.cancel()
            self._expiry_handle = None
        if when is not None:
            delay = max(0.0, when - time.time())
            self._expiry_handle = asyncio.get_running_loop().call_later(delay, self._credentials_expired)

    def _credentials_expired(self) -> None:
        self._expiry_handle = None
        if self._state != CONNECTED:
            return
        if self.level >= 5:
            self._send(Disconnect(ReasonCode.MAXIMUM_CONNECT_TIME, {PropertyId.REASON_STRING: "credentials expired"}))
        log.info("client.credentials_expired", extra={"client_id": self.client_id, "peer": self.peer})
        self._closed(will=True, reason="credentials expired")

    # --- deadlines ----------------------------------------------------------------------------------------
    def _file(self, when: float) -> None:
        """Our (one) deadline is now `when` (time.monotonic())."""
        self._unfile()
        self._bucket = self.listener.deadlines.file(self, when)

    def _unfile(self) -> None:
        if self._bucket is not None:
            self._bucket.discard(self)
            self._bucket = None

    def deadline_due(self, now: float) -> None:
        """`Deadlines` calls this when our deadline passed: CONNECT timeout, keepalive or the end of a close drain,
        by state."""
        self._bucket = None
        state = self._state
        if state == CONNECTED:
            if self.keepalive:
                self._keepalive_check(now)
        elif state == NEW:
            log.info("client.connect_timeout", extra={"peer": self.peer})
            self._closed(will=False, reason="no CONNECT")
        elif state == CLOSED and self.transport is not None:
            self.transport.close()  # the drain is over

    def _keepalive_check(self, now: float) -> None:
        limit = self.keepalive * 1.5
        idle = now - self.last_rx
        if self._holds:  # we are not reading it: its silence is ours, not a dead client's
            idle = 0.0
        if idle >= limit:
            if self.level >= 5:
                self._send(Disconnect(ReasonCode.KEEP_ALIVE_TIMEOUT,
                                      {PropertyId.REASON_STRING: f"no packet for {idle:.1f} s"}))
            log.info("client.keepalive_timeout", extra={"client_id": self.client_id, "idle_s": round(idle, 2)})
            self._closed(will=True, reason="keepalive timeout")
            return
        self._file(now - idle + limit)
