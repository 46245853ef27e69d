"""The life of one MQTT channel around its packets, sans-IO: its state, why reading is held, its one deadline
(CONNECT timeout, keepalive, close drain) and credential expiry, and every way it ends (abort, takeover, kick,
shutdown, graceful close). What it asks of the connection goes through `ChannelIo`; time comes from `Clock`.

`Handshake` (CONNECT) and `MqttChannel` (the packets after it) build on this class.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from tidewire.extensions.enhanced_auth import AuthSession
from tidewire.extensions.hooks import ClientInfo
from tidewire.gateway.core.clock import Clock
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
from tidewire.gateway.transport.listeners import Listener
from tidewire.gateway.transport.ratelimit import InboundLimiter
from tidewire.gateway.transport.tls import CertUsername
from tidewire.store.base import NEVER_EXPIRES, Ban, Message

if TYPE_CHECKING:
    from tidewire.gateway.core.tenants import Tenant
    from tidewire.gateway.node import Node
    from tidewire.gateway.sessions.session import Session

log = logging.getLogger("tidewire.conn")

NEW, CONNECTING, AUTHENTICATING, CONNECTED, CLOSED = range(5)
_NOBODY = ClientInfo("", None)
# Why reading from a client is paused (a bit each): while any is set, the socket is not read. HOLD_PIPELINE is the
# node's: its append queue is full (its own bit, so the acks that lift HOLD_STORE cannot lift it). HOLD_HOOKS: its
# lane of publishes waiting for the publish hooks is long (gateway.core.publish_hooks).
HOLD_CONNECT, HOLD_STORE, HOLD_RATE, HOLD_PIPELINE, HOLD_HOOKS = 1, 2, 4, 8, 16
HOLD_SUBSCRIBE = 32  # a SUBSCRIBE waits for exclusive subscriptions' locks (`MqttChannel._subscribe_exclusive`)


class Cancellable(Protocol):
    def cancel(self) -> None: ...


class ChannelIo(Protocol):
    """What a channel asks of its connection: the asyncio protocol under it (or a test's recorder)."""

    def write(self, data: bytes) -> None: ...

    def writelines(self, chunks: list[bytes]) -> None: ...

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def close(self) -> None:
        """Close now (what is queued is still sent)."""

    def is_closing(self) -> bool:
        """Closed, or closing (nothing more is read)."""

    def end_output(self) -> bool:
        """Start a graceful close: end our side after what is queued (a FIN, where the transport can half-close)
        and keep reading. False when the connection is closing already or the peer is gone (it is closed then)."""

    def set_deadline(self, when: float | None) -> None:
        """Call `deadline_due(now)` at `when` (the clock's monotonic time, up to one tick later); None: no deadline."""

    def call_later(self, delay: float, callback: Callable[[], None]) -> Cancellable: ...

    def certificate_name(self, kind: CertUsername) -> str | None:
        """The verified client certificate's CN (`kind` "cn") or RFC 4514 subject ("subject"); None: no certificate."""


class ChannelBase:
    __slots__ = (
        "_backlog", "_expiry_handle", "_holds", "_socket_full", "_state", "alias_max", "aliases_in", "auth", "bridge",
        "clean_start", "client_id", "clock", "connected_at", "expiry", "inbound_qos2", "info", "io", "keepalive",
        "last_rx", "level", "limiter", "listener", "max_packet", "mount", "node", "parser", "paused", "peer",
        "pending_qos1", "session", "tenant", "unacked_in", "will", "will_delay",
    )

    def __init__(self, node: Node, listener: Listener, io: ChannelIo, peer: str, clock: Clock) -> None:
        self.node = node
        self.listener = listener
        self.io = io
        self.clock = clock
        self.peer = peer
        self.parser = Parser(node.settings.max_packet_size)
        self.session: Session | None = None
        self.client_id = ""
        self.level = 4
        self.keepalive = 0
        self.expiry = 0
        self.last_rx = now = clock.monotonic()
        self.connected_at = clock.time()  # for operators (admin API, dashboard)
        self.clean_start = True  # as the CONNECT said (for operators: a 5.0 session's expiry is separate)
        self.bridge = False  # another broker's bridge (`Terms.bridge`), not a client
        self.paused = False
        self._holds = 0
        self._socket_full = False  # the transport asked us to stop writing
        self.limiter: InboundLimiter | None = None
        self.unacked_in = 0  # inbound QoS 1/2 publishes waiting for the store
        self.pending_qos1 = 0  # inbound QoS 1 publishes not yet acknowledged (counts against Receive Maximum)
        self.alias_max = 0  # the client's Topic Alias Maximum: outgoing aliases we may use
        self.max_packet = 0  # the client's Maximum Packet Size (0: no limit)
        self.tenant: Tenant | None = None  # None: the default tenant (gateway.core.tenants)
        self.mount = ""  # the tenant's mount point: on its topics below the channel, off those it is sent
        self.aliases_in: dict[int, str] | None = None
        # enhanced authentication in progress: (session, method, CONNECT and terms, or None when re-authenticating)
        self.auth: tuple[AuthSession, str, Connect | None, Terms | None] | None = None
        self.inbound_qos2: set[int] | None = None  # created on the first QoS 2 publish
        self.will: Message | None = None
        self.will_delay = 0
        self.info = _NOBODY
        self._state = NEW
        self._backlog: list[Any] | None = None  # read while CONNECT is processed, or over the inbound rate
        self._expiry_handle: Cancellable | None = None  # credentials (token) expiry
        io.set_deadline(now + node.settings.connect_timeout)

    @property
    def closed(self) -> bool:
        return self._state == CLOSED

    def connection_lost(self, reason: str) -> None:
        """The connection is gone (the client closed it, or it broke)."""
        if self._state != CLOSED:
            self._closed(will=True, reason=reason)
        else:  # the client closed while we drained
            self.io.set_deadline(None)

    # --- reading holds ------------------------------------------------------------------------------------
    def _hold(self, why: int) -> None:
        if not self._holds:
            self.io.pause_reading()
        self._holds |= why

    def _release(self, why: int) -> None:
        if self._holds & why:
            self._holds &= ~why
            if not self._holds and self._state != CLOSED:
                self.io.resume_reading()

    def pause_publishes(self) -> None:
        """The node's append queue is full: stop reading this publisher; nothing it sent is dropped."""
        self._hold(HOLD_PIPELINE)

    def resume_publishes(self) -> None:
        self._release(HOLD_PIPELINE)

    # --- writing ------------------------------------------------------------------------------------------
    def write_chunks(self, chunks: list[bytes]) -> None:
        """The session's deliveries."""
        if self._state != CLOSED:
            if len(chunks) == 1:
                self.io.write(chunks[0])
            else:
                self.io.writelines(chunks)

    def durable(self, acks: list[bytes]) -> None:
        """The node's `DurableSink` call: PUBACK/PUBREC packets whose messages are now durable."""
        self.unacked_in -= len(acks)
        self.pending_qos1 -= sum(1 for ack in acks if ack[0] == 0x40)
        if self._state == CLOSED:
            return
        self.io.writelines(acks)
        if self._holds & HOLD_STORE and self.unacked_in <= self.node.settings.max_inbound_qos2 // 2:
            self._release(HOLD_STORE)

    def failed(self, acks: list[bytes], reason: str) -> None:
        """Never stored (the node is stopping): no ack, so the client publishes them again after reconnecting."""
        self.unacked_in -= len(acks)
        self.pending_qos1 -= sum(1 for ack in acks if ack[0] == 0x40)

    def _send(self, packet: Any) -> None:
        if self._state != CLOSED:
            self.io.write(encode(packet, self.level))

    # --- closing ------------------------------------------------------------------------------------------
    def abort(self, reason: int, message: str) -> None:
        """Close because of a protocol violation: 5.0 gets a DISCONNECT with the reason first; will is sent."""
        log.warning("client.protocol_error", extra={"client_id": self.client_id, "peer": self.peer,
                                                    "reason_code": hex(reason), "detail": message})
        if self.level >= 5 and self._state == CONNECTED:
            self._send(Disconnect(reason, {PropertyId.REASON_STRING: message[:200]}))
        elif self._state == NEW and reason == ReasonCode.UNSUPPORTED_PROTOCOL_VERSION:
            # the 3.1.1 form: the only one a client of any level can read
            self.io.write(encode(Connack(False, ConnackCode311.UNACCEPTABLE_PROTOCOL_VERSION), 4))
        elif self._state == NEW and self.parser.protocol_level == 5:
            self.level = 5
            self._send(Connack(False, reason))  # a malformed 5.0 CONNECT is answered with a CONNACK
        self._closed(will=True, reason=message)

    def shutdown(self, reason: int, properties: dict[int, Any] | None = None) -> None:
        """The node stops (`gateway.ops.drain`): 5.0 gets DISCONNECT `reason` with `properties` (0x8B, or 0x9C with
        a Server Reference), 3.1.1 a closed connection; the session is parked. The client sent no DISCONNECT, so
        its will is due (MQTT 5 3.1.2.5): published now when its delay is 0 or the session ends with the
        connection; a delayed one stays stored, for the client to cancel by coming back in time (here or on
        another node), else the next start publishes it."""
        if self.level >= 5 and self._state == CONNECTED:
            self._send(Disconnect(reason, properties if properties is not None
                                  else {PropertyId.REASON_STRING: "server shutting down"}))
        self._closed(will=self._will_delay() <= 0, reason="server shutdown", keep_will=True)

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

    def fence(self, detail: str) -> Session | None:
        """This node has not reached the store for a member TTL: the others may have declared it dead and will
        hand the session to whichever node the client reaches next (and publish its will from the store). 5.0
        gets DISCONNECT 0x9C Use another server (0x88 is a CONNACK code only); no will here, the session is not
        parked (the store is out of reach, and no longer this node's to write)."""
        session = self.session
        if self.level >= 5 and self._state == CONNECTED:
            self._send(Disconnect(ReasonCode.USE_ANOTHER_SERVER, {PropertyId.REASON_STRING: detail[:200]}))
        self._closed(will=False, keep_will=True, reason=detail, transfer=True)
        return session

    def _will_delay(self) -> int:
        """The will's delay, never past the session's end (MQTT 5 3.1.3.2.2)."""
        return min(self.will_delay, self.expiry) if self.expiry < NEVER_EXPIRES else self.will_delay

    def _closed(self, *, will: bool, reason: str, transfer: bool = False, keep_will: bool = False,
                drain: bool = True) -> None:
        """`drain`: we sent a last packet the client must read (see `_close_gracefully`); not when the client
        ended the connection itself."""
        was_connected = self._state == CONNECTED
        self._state = CLOSED
        self.io.set_deadline(None)
        if self._expiry_handle is not None:
            self._expiry_handle.cancel()
            self._expiry_handle = None
        if drain:
            self._close_gracefully()
        else:
            self.io.close()
        if not was_connected or self.session is None:
            return
        node = self.node
        self.listener.connections -= 1
        if self.tenant is not None:
            self.tenant.connections -= 1
        session, self.session = self.session, None
        node.sessions.close(self, session, transfer=transfer)
        if self.will is not None and will:
            node.wills.publish_after(self.client_id, self.will, self._will_delay())
        elif self.will is not None and not keep_will:
            node.writes.drop_will(self.client_id)
        at = logging.INFO if node.sys.activity.line("disconnected") else logging.DEBUG  # as client.connected
        if log.isEnabledFor(at):
            log.log(at, "client.disconnected", extra={"client_id": self.client_id, "peer": self.peer,
                                                         "reason": reason})
        node.sys.event(self.client_id, "disconnected", address=self.peer, proto_ver=self.level, reason=reason)

    def _close_gracefully(self) -> None:
        """Our last packet (CONNACK refusal, DISCONNECT) must reach a client that may still be sending: closing
        a socket with unread input makes the kernel send a reset, which can destroy our packet before the
        client reads it. So: end our side (FIN after the queued bytes), keep reading and dropping what the
        client still sends, and close when it closes or after `close_drain_timeout`."""
        timeout = self.node.settings.close_drain_timeout
        if timeout <= 0:
            self.io.close()
            return
        if not self.io.end_output():
            return
        # TLS and WebSocket cannot half-close: the client closes after reading our packet, or the deadline does.
        self._holds = 0
        self.io.resume_reading()
        self.io.set_deadline(self.clock.monotonic() + timeout)

    def _refuse(self, code311: int, code5: int, detail: str) -> None:
        log.info("client.refused", extra={"client_id": self.client_id, "peer": self.peer, "detail": detail})
        self._send(Connack(False, code5 if self.level >= 5 else code311))
        self._closed(will=False, reason=detail)

    def _banned(self, ban: Ban) -> None:
        """Refused by a ban (`gateway.ops.bans`): 5.0 CONNACK 0x8A, 3.1.1 code 5."""
        self.node.bans.banned_refused += 1
        return self._refuse(ConnackCode311.NOT_AUTHORIZED, ReasonCode.BANNED, f"banned ({ban.kind})")

    def expiry_at(self, when: float | None) -> None:
        """Close the connection when its credentials expire (the clock's epoch seconds; None: never)."""
        if self._expiry_handle is not None:
            self._expiry_handle.cancel()
            self._expiry_handle = None
        if when is not None:
            self._expiry_handle = self.io.call_later(max(0.0, when - self.clock.time()), self._credentials_expired)

    def _credentials_expired(self) -> None:
        self._expiry_handle = None
        if self._state != CONNECTED:
            return
        if self.level >= 5:
            self._send(Disconnect(ReasonCode.MAXIMUM_CONNECT_TIME, {PropertyId.REASON_STRING: "credentials expired"}))
        log.info("client.credentials_expired", extra={"client_id": self.client_id, "peer": self.peer})
        self._closed(will=True, reason="credentials expired")

    # --- deadlines ----------------------------------------------------------------------------------------
    def deadline_due(self, now: float) -> None:
        """Our deadline passed: CONNECT timeout, keepalive or the end of a close drain, by state."""
        state = self._state
        if state == CONNECTED:
            if self.keepalive:
                self._keepalive_check(now)
        elif state == NEW:
            log.info("client.connect_timeout", extra={"peer": self.peer})
            self._closed(will=False, reason="no CONNECT")
        elif state == CLOSED:
            self.io.close()  # the drain is over

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
        self.io.set_deadline(now - idle + limit)
