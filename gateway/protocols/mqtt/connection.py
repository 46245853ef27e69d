"""One MQTT connection: a thin asyncio Protocol over the sans-IO parser, handling each packet it yields.

Session state lives in `Session` and the node; this class keeps only what belongs to the socket: protocol
level, keepalive, the will, inbound QoS 2 packet ids, and flow control in both directions.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from tidewire.extensions.authn import AuthRequest, Identity, Refused
from tidewire.extensions.hooks import ClientInfo
from tidewire.gateway.core.ingress import INVALID_TOPIC, refuse_publish
from tidewire.gateway.protocols.mqtt.codec import (
    PINGRESP,
    Auth,
    Connack,
    ConnackCode311,
    Connect,
    Disconnect,
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
from tidewire.gateway.protocols.mqtt.connect import (
    Refusal,
    Terms,
    check_will,
    expires_at,
    negotiate,
    refusal_codes,
    stored_properties,
)
from tidewire.gateway.protocols.mqtt.lifecycle import (
    AUTHENTICATING,
    CLOSED,
    CONNECTED,
    CONNECTING,
    HOLD_CONNECT,
    HOLD_RATE,
    HOLD_STORE,
    NEW,
    ConnectionBase,
)
from tidewire.gateway.sessions.session import Session
from tidewire.gateway.transport.listeners import certificate_name
from tidewire.gateway.transport.ratelimit import InboundLimiter
from tidewire.pipeline.lake.event_names import DROPPED
from tidewire.store.base import Message, WillRecord

log = logging.getLogger("tidewire.conn")
_CONNACK_ACCEPTED_311 = encode(Connack(False, 0), 4)  # the answer to nearly every 3.1.1 CONNECT


class MqttConnection(ConnectionBase):
    __slots__ = ()

    def data_received(self, data: bytes) -> None:
        if self._state == CLOSED:
            return  # draining after our last packet: read and drop, so the kernel doesn't reset the socket
        self.last_rx = time.monotonic()
        try:
            packets = self.parser.feed(data)
        except ProtocolError as exc:
            self.abort(exc.reason_code, exc.message)
            return
        if self._backlog is not None and self._state == CONNECTED:
            self._backlog.extend(packets)  # over its inbound rate: these wait their turn behind the others
            return
        self._dispatch(packets)

    def _dispatch(self, packets: list[Any]) -> None:
        limiter = self.limiter
        for index, packet in enumerate(packets):
            state = self._state
            if state == CONNECTED:
                if limiter is not None and type(packet) is Publish:
                    wait = limiter.admit(time.monotonic(), len(packet.payload) + len(packet.topic))
                    if wait > 0:
                        # Over the client's rate: stop reading it and keep what was already read (one read's
                        # worth at most), so the rate holds within a read and nothing is dropped.
                        self._backlog = packets[index:]
                        self._hold(HOLD_RATE)
                        asyncio.get_running_loop().call_later(wait, self._metered_resume)
                        return
                self._handle(packet)
            elif state == AUTHENTICATING:
                if type(packet) is Auth:
                    self._on_auth(packet)
                else:
                    self.abort(ReasonCode.PROTOCOL_ERROR, f"{type(packet).__name__} during authentication")
            elif state == CONNECTING:
                if self._backlog is None:
                    self._backlog = []
                self._backlog.append(packet)
            elif state == NEW:
                assert isinstance(packet, Connect)  # the parser rejects anything else first
                self._on_connect(packet)
            else:
                return

    def _metered_resume(self) -> None:
        packets, self._backlog = self._backlog, None
        if self._state != CONNECTED or packets is None:
            return
        self._dispatch(packets)
        if self._backlog is None:
            self._release(HOLD_RATE)

    # --- CONNECT ------------------------------------------------------------------------------------------
    # A CONNECT that needs nothing to wait for (no credential to check elsewhere, a clean session nobody else
    # holds) is answered right here, in this call: no task, no store call. Anything else takes the same steps
    # through tasks.
    def _on_connect(self, packet: Connect) -> None:
        self.level = packet.protocol_level
        self._state = CONNECTING  # reading is held only if the CONNECT has to wait (HOLD_CONNECT, in a task)
        node = self.node
        self.client_id = packet.client_id
        try:
            node.admission.check(self.listener, time.monotonic(), packet.client_id in node.connections)
            terms = negotiate(packet, node.settings, self.peer)
        except Refusal as refusal:
            return self._refuse(refusal.code311, refusal.code5, refusal.detail)
        self.client_id = terms.client_id
        ban = node.bans.check(terms.client_id, None, self.peer)  # before any authentication work
        if ban is not None:
            return self._banned(ban)
        proof = self._credentials(packet, terms)
        if isinstance(proof, Refusal):
            return self._refuse(proof.code311, proof.code5, proof.detail)
        if isinstance(proof, AuthRequest):
            node.admission.pending += 1
            self._hold(HOLD_CONNECT)
            node.spawn(self._connect(packet, terms, proof))
            return None
        self._authenticated(packet, terms, proof)
        return None

    def _credentials(self, packet: Connect, terms: Terms) -> Identity | Refused | Refusal | AuthRequest | None:
        """Who the client is, when that is known at once: the certificate's name, or the answer of a chain with no
        source to ask (anonymous, or refused). Else the request for the chain (`_connect` awaits its answer), or
        None when MQTT 5 enhanced authentication (AUTH) decides, in its own exchange."""
        listener = self.listener
        if listener.cert_username is not None:
            assert self.transport is not None
            name = certificate_name(self.transport, listener.cert_username)
            if name is None:
                return Refusal(ConnackCode311.NOT_AUTHORIZED, ReasonCode.NOT_AUTHORIZED,
                               "no client certificate to take the user name from")
            return Identity(name, source="certificate")
        if PropertyId.AUTHENTICATION_METHOD in packet.properties:
            return None
        chain = self.node.auth
        if not chain.sources:  # no source to wait for: decided here, not in a task
            answer = self.node.admission.sourceless(chain, packet.username is not None or packet.password is not None)
            if answer is not None:
                return answer
        return AuthRequest(terms.client_id, packet.username, packet.password, self.peer, "mqtt", listener.name)

    async def _connect(self, packet: Connect, terms: Terms, request: AuthRequest) -> None:
        try:
            result = await self.node.auth.authenticate(request)
        finally:
            self.node.admission.pending -= 1
        if self._state != CLOSED:
            self._authenticated(packet, terms, result)

    def _authenticated(self, packet: Connect, terms: Terms, proof: Identity | Refused | None) -> None:
        """The chain (or the certificate) answered; None: the AUTH exchange starts now and proves who it is."""
        if isinstance(proof, Refused):
            code311, code5 = refusal_codes(proof.failure)
            return self._refuse(code311, code5, f"authentication failed ({proof.failure.value}, {proof.source})")
        node = self.node
        if proof is not None:
            terms.info = ClientInfo(terms.client_id, proof.username, self.peer, self.level, proof.superuser,
                                    proof.acl)
            # The user name only counts once proven; the id and address again: a ban may be newer than the CONNECT.
            ban = node.bans.check(terms.client_id, proof.username, self.peer)
            if ban is not None:
                return self._banned(ban)
            if proof.expires_at is not None:
                self.expiry_at(proof.expires_at)
            try:
                check_will(terms, node.authorizer)
            except Refusal as refusal:
                return self._refuse(refusal.code311, refusal.code5, refusal.detail)
            return self._open_session(packet, terms)
        method = packet.properties[PropertyId.AUTHENTICATION_METHOD]  # the will is checked once AUTH succeeded
        auth = node.enhanced_auth.begin(method, terms.client_id, packet.username) if node.enhanced_auth else None
        if auth is None:
            return self._refuse(0, ReasonCode.BAD_AUTHENTICATION_METHOD, f"unknown auth method {method!r}")
        self.auth = (auth, method, packet, terms)
        self._state = AUTHENTICATING
        self._on_auth(Auth(ReasonCode.CONTINUE_AUTHENTICATION,
                           {PropertyId.AUTHENTICATION_DATA: packet.properties.get(PropertyId.AUTHENTICATION_DATA)}))
        if self._state == AUTHENTICATING:
            self._release(HOLD_CONNECT)
        return None

    def _on_auth(self, packet: Auth) -> None:
        """One step of MQTT 5 enhanced authentication, at CONNECT or re-authentication (AUTH 0x19)."""
        if self._state == CONNECTED:
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
        if not result.success:  # one log line either way, from abort or _refuse
            if connect is None:
                return self.abort(ReasonCode.NOT_AUTHORIZED, f"re-authentication failed ({result.reason})")
            return self._refuse(0, ReasonCode.NOT_AUTHORIZED, f"authentication failed ({result.reason})")
        if connect is None:  # re-authenticated
            self._send(Auth(ReasonCode.SUCCESS, props))
            return None
        assert terms is not None
        terms.ack_properties.update(props)
        terms.info = ClientInfo(terms.client_id, result.username, self.peer, self.level)
        ban = self.node.bans.check(terms.client_id, result.username, self.peer)
        if ban is not None:
            return self._banned(ban)
        try:
            check_will(terms, self.node.authorizer)
        except Refusal as refusal:
            return self._refuse(refusal.code311, refusal.code5, refusal.detail)
        self._state = CONNECTING
        self._open_session(connect, terms)
        return None

    def _open_session(self, packet: Connect, terms: Terms) -> None:
        """Authenticated: a clean session the node can start at once is answered now; any other (a session to
        restore or take over, a store to ask first) in a task."""
        self._take_terms(terms)
        if packet.clean_start and not terms.expiry:
            opened = self.node.sessions.open_clean(self, terms.client_id, self.level, terms.window)
            if opened is not None:
                return self._established(packet, terms, opened, False, fresh=True)
        self._hold(HOLD_CONNECT)
        self.node.spawn(self._open(packet, terms))
        return None

    async def _open(self, packet: Connect, terms: Terms) -> None:
        """Take over or restore the session (or start one), then answer."""
        client_id = terms.client_id
        session, present = await self.node.sessions.open(self, client_id, self.level, packet.clean_start,
                                                        self.expiry, terms.window)
        if self._state == CLOSED:  # the socket died while we were restoring the session
            self.node.sessions.close(self, session)
            return None
        if self.will is not None and self.node.cluster is not None:
            # Stored before CONNACK: if this node dies from here on, a survivor publishes it.
            self.node.writes.save_will(WillRecord(client_id, self.will, self.will_delay, self.node.node_id))
            await self.node.writes.will_settled(client_id)
            if self._state == CLOSED:
                self.node.sessions.close(self, session)
                return None
        self._established(packet, terms, session, present)
        return None

    def _established(self, packet: Connect, terms: Terms, session: Session, present: bool, *,
                     fresh: bool = False) -> None:
        """The session is this connection's: CONNACK, then what waited for it. `fresh`: opened in this call."""
        node = self.node
        client_id = terms.client_id
        self.session = session
        self.clean_start = packet.clean_start
        self.listener.connections += 1
        if self.will is not None and node.cluster is None:
            node.writes.save_will(WillRecord(client_id, self.will, self.will_delay, node.node_id))
        ack = terms.ack_properties
        if self.level >= 5 or present or ack:
            self._send(Connack(present, 0, ack))
        elif self.transport is not None:
            self.transport.write(_CONNACK_ACCEPTED_311)
        self._state = CONNECTED
        keepalive = self.keepalive
        # At info up to a rate (a connect storm must not be a log storm: `activity` counts the rest), else at debug.
        at = logging.INFO if node.sys.activity.line("connected") else logging.DEBUG
        if log.isEnabledFor(at):
            log.log(at, "client.connected", extra={"client_id": client_id, "peer": self.peer, "level": self.level,
                                                      "keepalive": keepalive, "clean_start": packet.clean_start,
                                                      "session_present": present})
        node.sys.event(client_id, "connected", address=self.peer, proto_ver=self.level, keepalive=keepalive,
                       clean_start=packet.clean_start, expiry_interval=self.expiry, session_present=present)
        if keepalive:
            self._file(time.monotonic() + keepalive * 1.5)
        else:
            self._unfile()
        settings = node.settings
        if settings.max_inbound_rate or settings.max_inbound_bytes_rate:
            self.limiter = InboundLimiter(settings.max_inbound_rate, settings.max_inbound_bytes_rate,
                                          time.monotonic())
        session.attach(self, fresh=fresh)
        node.subscriptions.resume_groups(session)
        backlog, self._backlog = self._backlog or [], None
        for queued in backlog:
            if self._state != CONNECTED:
                break
            self._handle(queued)
        if self._state == CONNECTED:
            self._release(HOLD_CONNECT)

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
        refused = refuse_publish(self.node.settings, self.node.authorizer, self.info, topic)
        if refused == INVALID_TOPIC:
            log.info("client.topic_refused", extra={"client_id": self.client_id, "detail": "topic too long"})
            if qos:
                self._send((Puback if qos == 1 else Pubrec)(pid, ReasonCode.TOPIC_NAME_INVALID if v5 else 0))
            return None
        if v5 and props.get(PropertyId.PAYLOAD_FORMAT_INDICATOR) == 1 and qos:
            try:
                packet.payload.decode("utf-8")
            except UnicodeDecodeError:
                self._send((Puback if qos == 1 else Pubrec)(pid, ReasonCode.PAYLOAD_FORMAT_INVALID))
                return None
        if refused is not None:
            log.info("acl.denied", extra={"client_id": self.client_id, "topic": topic, "access": "publish"})
            self.node.counters.drop("not_authorized")
            if self.node.events is not None:
                self.node.events.add(DROPPED, int(time.time() * 1000), self.client_id, "mqtt", topic, None, qos,
                                     reason="not_authorized")
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
        if self.unacked_in > self.node.settings.max_inbound_qos2 and not self._holds & HOLD_STORE:
            # The store is behind: stop reading this client until its acks catch up (no unbounded buffer).
            self._hold(HOLD_STORE)
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
        codes, retained, registering = self.node.subscribe(session, self, packet.subscriptions,
                                                           ids[0] if ids else 0)
        log.info("client.subscribed", extra={"client_id": self.client_id,
                                             "filters": ",".join(s.topic_filter for s in packet.subscriptions)})
        if session.persistent:
            self.node.writes.save_session(session.snapshot())
        # In a cluster, SUBACK waits for what it acknowledges to be in the store: a new wildcard in the store's
        # set (what is published after it, on any node, is then indexed into the subscription's queue), and a
        # persistent session's record (a takeover by another node reads it from there). SUBACKs keep their order.
        saved = session.persistent and self.node.cluster is not None
        if registering or saved or self._subacks is not None:
            # Deliveries wait too: a client sees the SUBACK before anything of the new subscription.
            self.paused = True
            self._subacks = asyncio.get_running_loop().create_task(self._suback_later(
                self._subacks, registering, saved, Suback(packet.packet_id, codes), session, retained))
            return
        self._send(Suback(packet.packet_id, codes))
        if retained:
            self.node.spawn(self.node.send_retained(session, retained))

    async def _suback_later(self, previous: asyncio.Task[None] | None, registering: list[str], saved: bool,
                            suback: Suback, session: Session, retained: list[tuple[str, int, int]]) -> None:
        if previous is not None:
            await asyncio.wait([previous])
        await self.node.subscriptions.wildcards_registered(registering)
        if saved:
            await self.node.writes.session_settled(session.client_id)
        if self._subacks is asyncio.current_task():
            self._subacks = None
        if self.session is not session:
            return
        self._send(suback)
        if self._subacks is None and not self._socket_full:
            self.resume_writing()
        if retained:
            self.node.spawn(self.node.send_retained(session, retained))

    def _on_unsubscribe(self, packet: Unsubscribe) -> None:
        session = self.session
        assert session is not None
        codes = self.node.unsubscribe(session, packet.topic_filters)
        self._send(Unsuback(packet.packet_id, codes))
        if session.persistent:
            self.node.writes.save_session(session.snapshot())

    def _on_disconnect(self, packet: Disconnect) -> None:
        new_expiry = packet.properties.get(PropertyId.SESSION_EXPIRY_INTERVAL)
        if new_expiry is not None and self.session is not None:
            if self.expiry == 0 and new_expiry != 0:
                return self.abort(ReasonCode.PROTOCOL_ERROR, "session expiry set at DISCONNECT after 0")
            self.expiry = min(new_expiry, self.node.settings.max_session_expiry)
            self.session.record.expiry_interval = self.expiry
            self.session.persistent = self.expiry > 0
        with_will = packet.reason_code == ReasonCode.DISCONNECT_WITH_WILL
        self._closed(will=with_will, reason=f"client disconnect {packet.reason_code:#x}", drain=False)
        return None
