"""One MQTT connection: a thin asyncio Protocol over the sans-IO parser, handling each packet it yields.

Session state lives in `Session` and the node; this class keeps only what belongs to the socket: protocol
level, keepalive, the will, inbound QoS 2 packet ids, and flow control in both directions.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, cast

from extensions.auth import AuthSession
from extensions.hooks import ClientInfo
from gateway.codec import (
    PINGRESP,
    Auth,
    Connack,
    ConnackCode311,
    Connect,
    Disconnect,
    Parser,
    Pingreq,
    PropertyId,
    ProtocolError,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    ReasonCode,
    Suback,
    Subscribe,
    Unsuback,
    Unsubscribe,
    encode,
    puback,
    pubcomp,
    pubrec,
)
from gateway.connect import Refusal, Terms, expires_at, negotiate, stored_properties
from gateway.node import Node
from gateway.session import Session
from store.base import NEVER_EXPIRES, Message

log = logging.getLogger("tidewire.conn")

_NEW, _CONNECTING, _AUTHENTICATING, _CONNECTED, _CLOSED = range(5)
_NOBODY = ClientInfo("", None)



class MqttConnection(asyncio.Protocol):
    __slots__ = (
        "_backlog", "_deadline_handle", "_state", "alias_max", "aliases_in", "auth", "client_id", "expiry",
        "inbound_qos2", "info", "keepalive", "last_rx", "level", "max_packet", "node", "parser", "paused", "peer",
        "pending_qos1", "reading_paused", "session", "transport", "unacked_in", "will", "will_delay",
    )

    def __init__(self, node: Node) -> None:
        self.node = node
        self.parser = Parser(node.settings.max_packet_size)
        self.transport: asyncio.Transport | None = None
        self.session: Session | None = None
        self.client_id = ""
        self.level = 4
        self.keepalive = 0
        self.expiry = 0
        self.last_rx = 0.0
        self.paused = False
        self.reading_paused = False
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
        self.peer = ""
        self.info = _NOBODY
        self._state = _NEW
        self._backlog: list[Any] | None = None  # packets that arrive while CONNECT is processed
        self._deadline_handle: asyncio.TimerHandle | None = None

    # --- asyncio.Protocol ---------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports aren't asyncio subclasses
        peer = self.transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self.transport.set_write_buffer_limits(high=self.node.settings.write_buffer_high)
        self.last_rx = time.monotonic()
        self._deadline_handle = asyncio.get_running_loop().call_later(
            self.node.settings.connect_timeout, self._connect_timeout)

    def data_received(self, data: bytes) -> None:
        self.last_rx = time.monotonic()
        try:
            packets = self.parser.feed(data)
        except ProtocolError as exc:
            self.abort(exc.reason_code, exc.message)
            return
        for packet in packets:
            if self._state == _CONNECTED:
                self._handle(packet)
            elif self._state == _AUTHENTICATING:
                if type(packet) is Auth:
                    self._on_auth(packet)
                else:
                    self.abort(ReasonCode.PROTOCOL_ERROR, f"{type(packet).__name__} during authentication")
            elif self._state == _CONNECTING:
                if self._backlog is None:
                    self._backlog = []
                self._backlog.append(packet)
            elif self._state == _NEW:
                assert isinstance(packet, Connect)  # the parser rejects anything else first
                self._on_connect(packet)
            else:
                return

    def eof_received(self) -> bool | None:
        return None  # close our side too: a half-closed MQTT connection is of no use

    def connection_lost(self, exc: Exception | None) -> None:
        if self._state != _CLOSED:
            self._closed(will=True, reason="connection lost" if exc is None else str(exc))

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        if self.session is not None:
            self.session.resume_writing()

    # --- writing ------------------------------------------------------------------------------------------
    def write_chunks(self, chunks: list[bytes]) -> None:
        if self._state != _CLOSED and self.transport is not None:
            if len(chunks) == 1:
                self.transport.write(chunks[0])
            else:
                self.transport.writelines(chunks)

    def write_acks(self, acks: list[bytes], qos1: int) -> None:
        """PUBACK/PUBREC packets whose messages are now durable (`qos1` of them are PUBACKs)."""
        self.unacked_in -= len(acks)
        self.pending_qos1 -= qos1
        if self._state == _CLOSED or self.transport is None:
            return
        self.transport.writelines(acks)
        if self.reading_paused and self.unacked_in <= self.node.settings.max_inbound_qos2 // 2:
            self.reading_paused = False
            self.transport.resume_reading()

    def _send(self, packet: Any) -> None:
        if self.transport is not None and self._state != _CLOSED:
            self.transport.write(encode(packet, self.level))

    # --- closing ------------------------------------------------------------------------------------------
    def abort(self, reason: int, message: str) -> None:
        """Close because of a protocol violation: 5.0 gets a DISCONNECT with the reason first; will is sent."""
        log.warning("client.protocol_error", extra={"client_id": self.client_id, "peer": self.peer,
                                                    "reason_code": hex(reason), "detail": message})
        if self.level >= 5 and self._state == _CONNECTED:
            self._send(Disconnect(reason, {PropertyId.REASON_STRING: message[:200]}))
        elif self._state == _NEW and reason == ReasonCode.UNSUPPORTED_PROTOCOL_VERSION:
            if self.transport is not None:  # 3.1.1 form: the only one a client of any level can read
                self.transport.write(encode(Connack(False, ConnackCode311.UNACCEPTABLE_PROTOCOL_VERSION), 4))
        elif self._state == _NEW and self.parser.protocol_level == 5:
            self.level = 5
            self._send(Connack(False, reason))  # a malformed 5.0 CONNECT is answered with a CONNACK
        self._closed(will=True, reason=message)

    def shutdown(self, reason: int) -> None:
        """Server-initiated close (shutdown): the session is parked, the will stays for the next start."""
        if self.level >= 5 and self._state == _CONNECTED:
            self._send(Disconnect(reason, {PropertyId.REASON_STRING: "server shutting down"}))
        self._closed(will=False, reason="server shutdown", keep_will=True)

    def take_over(self) -> Session | None:
        """Another connection claims this client id: close this one and hand its session over."""
        session = self.session
        self.node.sys.event(self.client_id, "takeover", address=self.peer, proto_ver=self.level)
        if self.level >= 5 and self._state == _CONNECTED:
            self._send(Disconnect(ReasonCode.SESSION_TAKEN_OVER,
                                  {PropertyId.REASON_STRING: "another connection took over this client id"}))
        self._closed(will=True, reason="session taken over", transfer=True)
        return session

    def _closed(self, *, will: bool, reason: str, transfer: bool = False, keep_will: bool = False) -> None:
        was_connected = self._state == _CONNECTED
        self._state = _CLOSED
        if self._deadline_handle is not None:
            self._deadline_handle.cancel()
            self._deadline_handle = None
        if self.transport is not None:
            self.transport.close()
        if not was_connected or self.session is None:
            return
        session, self.session = self.session, None
        self.node.close_session(self, session, transfer=transfer)
        if self.will is not None and will:
            delay = min(self.will_delay, self.expiry) if self.expiry < NEVER_EXPIRES else self.will_delay
            self.node.schedule_will(self.client_id, self.will, delay)
        elif self.will is not None and not keep_will:
            self.node.spawn(self.node.store.delete_will(self.client_id))
        log.info("client.disconnected", extra={"client_id": self.client_id, "peer": self.peer,
                                               "reason": reason})
        self.node.sys.event(self.client_id, "disconnected", address=self.peer, proto_ver=self.level, reason=reason)

    def _connect_timeout(self) -> None:
        self._deadline_handle = None
        if self._state == _NEW:
            log.info("client.connect_timeout", extra={"peer": self.peer})
            self._closed(will=False, reason="no CONNECT")

    def _keepalive_check(self) -> None:
        self._deadline_handle = None
        if self._state != _CONNECTED:
            return
        limit = self.keepalive * 1.5
        idle = time.monotonic() - self.last_rx
        if idle >= limit:
            if self.level >= 5:
                self._send(Disconnect(ReasonCode.KEEP_ALIVE_TIMEOUT,
                                      {PropertyId.REASON_STRING: f"no packet for {idle:.1f} s"}))
            log.info("client.keepalive_timeout", extra={"client_id": self.client_id, "idle_s": round(idle, 2)})
            self._closed(will=True, reason="keepalive timeout")
            return
        self._deadline_handle = asyncio.get_running_loop().call_later(limit - idle, self._keepalive_check)

    # --- CONNECT ------------------------------------------------------------------------------------------
    def _on_connect(self, packet: Connect) -> None:
        self.level = packet.protocol_level
        self._state = _CONNECTING
        assert self.transport is not None
        self.transport.pause_reading()
        self.node.spawn(self._connect(packet))

    def _refuse(self, code311: int, code5: int, detail: str) -> None:
        log.info("client.refused", extra={"client_id": self.client_id, "peer": self.peer, "detail": detail})
        self._send(Connack(False, code5 if self.level >= 5 else code311))
        self._closed(will=False, reason=detail)

    async def _connect(self, packet: Connect) -> None:
        node = self.node
        try:
            terms = negotiate(packet, node.settings, self.peer, node.authorizer, len(node.connections),
                              packet.client_id in node.connections)
        except Refusal as refusal:
            self.client_id = packet.client_id
            return self._refuse(refusal.code311, refusal.code5, refusal.detail)
        self.client_id = terms.client_id
        method = packet.properties.get(PropertyId.AUTHENTICATION_METHOD)
        if method is not None:
            auth = node.enhanced_auth.begin(method, terms.client_id, packet.username) if node.enhanced_auth else None
            if auth is None:
                return self._refuse(0, ReasonCode.BAD_AUTHENTICATION_METHOD, f"unknown auth method {method!r}")
            self.auth = (auth, method, packet, terms)
            self._state = _AUTHENTICATING
            self._on_auth(Auth(ReasonCode.CONTINUE_AUTHENTICATION,
                               {PropertyId.AUTHENTICATION_DATA: packet.properties.get(PropertyId.AUTHENTICATION_DATA)}))
            if self._state == _AUTHENTICATING and self.transport is not None:
                self.transport.resume_reading()
            return None
        return await self._open(packet, terms)

    def _on_auth(self, packet: Auth) -> None:
        """One step of MQTT 5 enhanced authentication, at CONNECT or re-authentication (AUTH 0x19)."""
        if self._state == _CONNECTED:
            method = packet.properties.get(PropertyId.AUTHENTICATION_METHOD)
            if packet.reason_code != ReasonCode.REAUTHENTICATE or method is None or self.auth is not None:
                return self.abort(ReasonCode.PROTOCOL_ERROR, "unexpected AUTH")
            auth = self.node.enhanced_auth.begin(method, self.client_id, self.info.username) \
                if self.node.enhanced_auth else None
            if auth is None:
                return self.abort(ReasonCode.BAD_AUTHENTICATION_METHOD, "re-authentication method changed")
            self.auth = (auth, method, None, None)
        if self.auth is None or packet.reason_code not in (ReasonCode.CONTINUE_AUTHENTICATION,
                                                           ReasonCode.REAUTHENTICATE):
            return self.abort(ReasonCode.PROTOCOL_ERROR, "unexpected AUTH")
        auth, method, connect, terms = self.auth
        result = auth.step(packet.properties.get(PropertyId.AUTHENTICATION_DATA))
        props: dict[int, Any] = {PropertyId.AUTHENTICATION_METHOD: method}
        if result.data is not None:
            props[PropertyId.AUTHENTICATION_DATA] = result.data
        if not result.done:
            self._send(Auth(ReasonCode.CONTINUE_AUTHENTICATION, props))
            return None
        self.auth = None
        if not result.success:
            log.info("client.auth_failed", extra={"client_id": self.client_id, "peer": self.peer,
                                                  "detail": result.reason})
            if connect is None:
                return self.abort(ReasonCode.NOT_AUTHORIZED, "re-authentication failed")
            return self._refuse(0, ReasonCode.NOT_AUTHORIZED, result.reason or "authentication failed")
        if connect is None:  # re-authenticated
            self._send(Auth(ReasonCode.SUCCESS, props))
            return None
        assert terms is not None
        terms.ack_properties.update(props)
        if result.username:
            terms.info = ClientInfo(terms.client_id, result.username, self.peer, self.level)
        self._state = _CONNECTING
        if self.transport is not None:
            self.transport.pause_reading()
        self.node.spawn(self._open(connect, terms))
        return None

    async def _open(self, packet: Connect, terms: Terms) -> None:
        """Authenticated: take over or restore the session and answer CONNACK."""
        client_id = terms.client_id
        self.info = terms.info
        self.keepalive = keepalive = terms.keepalive
        self.expiry = expiry = terms.expiry
        self.alias_max = terms.alias_max
        self.max_packet = terms.max_packet
        self.will = terms.will
        self.will_delay = terms.will_delay
        window = terms.window
        ack_props = terms.ack_properties
        session, present = await self.node.open_session(self, client_id, self.level, packet.clean_start,
                                                        expiry, window)
        if self._state == _CLOSED:  # the socket died while we were restoring the session
            self.node.close_session(self, session)
            return None
        self.session = session
        if self.will is not None:
            self.node.store_will(client_id, self.will, self.will_delay)
        self._send(Connack(present, 0, ack_props))
        self._state = _CONNECTED
        log.info("client.connected", extra={"client_id": client_id, "peer": self.peer, "level": self.level,
                                            "keepalive": keepalive, "clean_start": packet.clean_start,
                                            "session_present": present})
        self.node.sys.event(client_id, "connected", address=self.peer, proto_ver=self.level, keepalive=keepalive,
                            clean_start=packet.clean_start, expiry_interval=expiry, session_present=present)
        if self._deadline_handle is not None:
            self._deadline_handle.cancel()
            self._deadline_handle = None
        if keepalive:
            self._deadline_handle = asyncio.get_running_loop().call_later(keepalive * 1.5,
                                                                          self._keepalive_check)
        session.attach(self)
        backlog, self._backlog = self._backlog or [], None
        for queued in backlog:
            if self._state != _CONNECTED:
                break
            self._handle(queued)
        if self._state == _CONNECTED and self.transport is not None:
            self.transport.resume_reading()
        return None

    # --- packets after CONNECT ----------------------------------------------------------------------------
    def _handle(self, packet: Any) -> None:
        kind = type(packet)
        if kind is Publish:
            self._on_publish(packet)
        elif kind is Puback:
            assert self.session is not None
            self.session.on_puback(packet.packet_id)
        elif kind is Pubrec:
            assert self.session is not None
            if not self.session.on_pubrec(packet.packet_id, packet.reason_code >= 0x80) and self.level >= 5:
                self._send(Pubrel(packet.packet_id, ReasonCode.PACKET_IDENTIFIER_NOT_FOUND))
        elif kind is Pubcomp:
            assert self.session is not None
            self.session.on_pubcomp(packet.packet_id)
        elif kind is Pubrel:
            self._on_pubrel(packet)
        elif kind is Pingreq:
            assert self.transport is not None
            self.transport.write(PINGRESP)
        elif kind is Subscribe:
            self._on_subscribe(packet)
        elif kind is Unsubscribe:
            self._on_unsubscribe(packet)
        elif kind is Disconnect:
            self._on_disconnect(packet)
        elif kind is Auth and self.level >= 5:
            self._on_auth(packet)
        else:
            self.abort(ReasonCode.PROTOCOL_ERROR, f"unexpected {kind.__name__}")

    def _on_publish(self, packet: Publish) -> None:
        v5 = self.level >= 5
        qos = packet.qos
        pid = packet.packet_id
        topic = packet.topic
        props = packet.properties
        if props and PropertyId.TOPIC_ALIAS in props:
            alias = props[PropertyId.TOPIC_ALIAS]
            if not 0 < alias <= self.node.settings.topic_alias_maximum:
                return self.abort(ReasonCode.TOPIC_ALIAS_INVALID, f"topic alias {alias} out of range")
            if self.aliases_in is None:
                self.aliases_in = {}
            if topic:
                self.aliases_in[alias] = topic
            else:
                known = self.aliases_in.get(alias)
                if known is None:
                    return self.abort(ReasonCode.PROTOCOL_ERROR, f"topic alias {alias} was never set")
                topic = known
        if v5 and props.get(PropertyId.PAYLOAD_FORMAT_INDICATOR) == 1 and qos:
            try:
                packet.payload.decode("utf-8")
            except UnicodeDecodeError:
                self._send((Puback if qos == 1 else Pubrec)(pid, ReasonCode.PAYLOAD_FORMAT_INVALID))
                return None
        if topic.startswith("$SYS") or not self.node.authorizer.allow_publish(self.info, topic):
            log.info("acl.denied", extra={"client_id": self.client_id, "topic": topic, "access": "publish"})
            code = ReasonCode.NOT_AUTHORIZED if v5 else 0
            if qos == 1:
                self._send(Puback(pid, code))
            elif qos == 2:
                self._send(Pubrec(pid, code))
            return None
        if qos == 2 and self.inbound_qos2 is not None and pid in self.inbound_qos2:
            assert self.transport is not None
            self.transport.write(pubrec(pid))  # a resend before PUBREL: acknowledge, don't store twice
            return None
        now_ms = int(time.time() * 1000)
        message = Message(topic, packet.payload, qos, packet.retain, stored_properties(props) if v5 else b"",
                          now_ms, expires_at(props, now_ms) if v5 else 0, self.client_id)
        if qos == 0:
            self.node.publish(message)
            return None
        if qos == 2:
            if self.inbound_qos2 is None:
                self.inbound_qos2 = set()
            if len(self.inbound_qos2) >= self.node.settings.max_inbound_qos2:
                return self.abort(ReasonCode.RECEIVE_MAXIMUM_EXCEEDED, "too many QoS 2 publishes in flight")
            self.inbound_qos2.add(pid)
        self.unacked_in += 1
        if qos == 1:
            self.pending_qos1 += 1
            if v5 and self.pending_qos1 + len(self.inbound_qos2 or ()) > self.node.settings.max_inbound_qos2:
                return self.abort(ReasonCode.RECEIVE_MAXIMUM_EXCEEDED, "more unacknowledged publishes than allowed")
        if self.unacked_in > self.node.settings.max_inbound_qos2 and not self.reading_paused:
            # The store is behind: stop reading this client until its acks catch up (no unbounded buffer).
            self.reading_paused = True
            assert self.transport is not None
            self.transport.pause_reading()
        self.node.publish(message, self, puback(pid) if qos == 1 else pubrec(pid))
        return None

    def _on_pubrel(self, packet: Pubrel) -> None:
        pid = packet.packet_id
        known = self.inbound_qos2 is not None and pid in self.inbound_qos2
        if known:
            self.inbound_qos2.discard(pid)  # type: ignore[union-attr]
        code = 0 if known or self.level < 5 else ReasonCode.PACKET_IDENTIFIER_NOT_FOUND
        assert self.transport is not None
        self.transport.write(pubcomp(pid) if code == 0 else encode(Pubcomp(pid, code), self.level))

    def _on_subscribe(self, packet: Subscribe) -> None:
        session = self.session
        assert session is not None
        if any(s.no_local and s.topic_filter.startswith("$share/") for s in packet.subscriptions):
            return self.abort(ReasonCode.PROTOCOL_ERROR, "no local on a shared subscription")
        ids = packet.properties.get(PropertyId.SUBSCRIPTION_IDENTIFIER) if packet.properties else None
        codes, retained = self.node.subscribe(session, self, packet.subscriptions, ids[0] if ids else 0)
        self._send(Suback(packet.packet_id, codes))
        log.info("client.subscribed", extra={"client_id": self.client_id,
                                             "filters": ",".join(s.topic_filter for s in packet.subscriptions)})
        if session.persistent:
            self.node.spawn(self.node.store.put_session(session.snapshot()))
        if retained:
            self.node.spawn(self.node.send_retained(session, retained))

    def _on_unsubscribe(self, packet: Unsubscribe) -> None:
        session = self.session
        assert session is not None
        codes = self.node.unsubscribe(session, packet.topic_filters)
        self._send(Unsuback(packet.packet_id, codes))
        if session.persistent:
            self.node.spawn(self.node.store.put_session(session.snapshot()))

    def _on_disconnect(self, packet: Disconnect) -> None:
        new_expiry = packet.properties.get(PropertyId.SESSION_EXPIRY_INTERVAL)
        if new_expiry is not None and self.session is not None:
            if self.expiry == 0 and new_expiry != 0:
                return self.abort(ReasonCode.PROTOCOL_ERROR, "session expiry set at DISCONNECT after 0")
            self.expiry = min(new_expiry, self.node.settings.max_session_expiry)
            self.session.record.expiry_interval = self.expiry
            self.session.persistent = self.expiry > 0
        with_will = packet.reason_code == ReasonCode.DISCONNECT_WITH_WILL
        self._closed(will=with_will, reason=f"client disconnect {packet.reason_code:#x}")
        return None
