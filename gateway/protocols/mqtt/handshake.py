"""CONNECT to CONNACK on an MQTT channel, sans-IO: admission, negotiation, bans, who the client is (certificate,
the authentication chain, or MQTT 5 enhanced authentication with AUTH, also for re-authentication), the will's
ACL check, then the session: opened at once when it is clean and nobody else holds it, else after the store.

A CONNECT that needs nothing to wait for is answered within the call that read it: no task, no store call.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from tidewire.extensions.authentication import AuthRequest, Identity, Refused
from tidewire.extensions.hooks import ClientInfo
from tidewire.gateway.core.subscriptions import Refusal as SubscribeRefusal
from tidewire.gateway.core.tenants import QUOTA, TenantConflict, mount_filter, mount_topic, reserved
from tidewire.gateway.protocols.mqtt.codec import (
    Auth,
    Connack,
    ConnackCode311,
    Connect,
    PropertyId,
    ReasonCode,
    SubscriptionRequest,
    encode,
)
from tidewire.gateway.protocols.mqtt.connect import (
    ADMISSION_CODES,
    Refusal,
    Terms,
    check_will,
    negotiate,
    refusal_codes,
)
from tidewire.gateway.protocols.mqtt.conveniences import auto_requests
from tidewire.gateway.protocols.mqtt.lifecycle import (
    AUTHENTICATING,
    CLOSED,
    CONNECTED,
    CONNECTING,
    HOLD_CONNECT,
    ChannelBase,
)
from tidewire.gateway.sessions.session import Session
from tidewire.gateway.transport.ratelimit import InboundLimiter
from tidewire.store.base import WillRecord

log = logging.getLogger("tidewire.conn")
_CONNACK_ACCEPTED_311 = encode(Connack(False, 0), 4)  # the answer to nearly every 3.1.1 CONNECT


def mount_requests(mount: str, requests: list[SubscriptionRequest]) -> list[SubscriptionRequest]:
    """A tenant client's subscriptions under its mount point (`gateway.core.tenants`)."""
    return [SubscriptionRequest(mount_filter(mount, r.topic_filter), r.qos, r.no_local, r.retain_as_published,
                                r.retain_handling) for r in requests]


class Handshake(ChannelBase):
    __slots__ = ()

    def _on_connect(self, packet: Connect) -> None:
        assert isinstance(packet, Connect)  # the parser rejects anything else first
        self.level = packet.protocol_level
        self._state = CONNECTING  # reading is held only if the CONNECT has to wait (HOLD_CONNECT)
        node = self.node
        self.client_id = packet.client_id
        refused = node.admission.refusal(self.listener, self.clock.monotonic(), packet.client_id in node.connections)
        if refused is not None:
            return self._refuse(*ADMISSION_CODES[refused.kind], refused.detail)
        try:
            terms = negotiate(packet, node.settings, self.peer, int(self.clock.time() * 1000))
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
            node.spawn(self._authenticate(packet, terms, proof))
            return None
        self._authenticated(packet, terms, proof)
        return None

    def _credentials(self, packet: Connect, terms: Terms) -> Identity | Refused | Refusal | AuthRequest | None:
        """Who the client is, when that is known at once: the certificate's name, or the answer of a chain with no
        source to ask (anonymous, or refused). Else the request for the chain (`_authenticate` awaits its
        answer), or None when MQTT 5 enhanced authentication (AUTH) decides, in its own exchange."""
        listener = self.listener
        if listener.cert_username is not None:
            name = self.io.certificate_name(listener.cert_username)
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

    async def _authenticate(self, packet: Connect, terms: Terms, request: AuthRequest) -> None:
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
            superuser = proof.superuser or (proof.username is not None and proof.username in node.tenants.superusers)
            terms.info = ClientInfo(terms.client_id, proof.username, self.peer, self.level, superuser, proof.acl)
            # The user name only counts once proven; the id and address again: a ban may be newer than the CONNECT.
            ban = node.bans.check(terms.client_id, proof.username, self.peer)
            if ban is not None:
                return self._banned(ban)
            if proof.expires_at is not None:
                self.expiry_at(proof.expires_at)
            try:
                check_will(terms, node.authorizer, node.rewriter)
                self._enter_tenant(terms, proof.tenant)
            except Refusal as refusal:
                return self._refuse(refusal.code311, refusal.code5, refusal.detail)
            if self.tenant is not None and (ban := node.bans.check(terms.client_id, None, None)) is not None:
                return self._banned(ban)  # a tenant's client banned by the scoped id operators see
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
        superuser = result.username is not None and result.username in self.node.tenants.superusers
        terms.info = ClientInfo(terms.client_id, result.username, self.peer, self.level, superuser)
        ban = self.node.bans.check(terms.client_id, result.username, self.peer)
        if ban is not None:
            return self._banned(ban)
        try:
            check_will(terms, self.node.authorizer, self.node.rewriter)
            self._enter_tenant(terms, None)
        except Refusal as refusal:
            return self._refuse(refusal.code311, refusal.code5, refusal.detail)
        if self.tenant is not None and (ban := self.node.bans.check(terms.client_id, None, None)) is not None:
            return self._banned(ban)
        self._state = CONNECTING
        self._open_session(connect, terms)
        return None

    def _enter_tenant(self, terms: Terms, identity_tenant: str | None) -> None:
        """Once authenticated and the will allowed (ACLs see the client's own topics): its tenant
        (`gateway.core.tenants`), that tenant's connection limits, and its terms mounted: the client id scoped by
        the mount, the will's topic under it. `Refusal` if the tenant refuses it."""
        try:
            tenant = self.node.tenants.tenant_for(self.listener.name, identity_tenant, terms.info.username)
        except TenantConflict as exc:
            raise Refusal(ConnackCode311.NOT_AUTHORIZED, ReasonCode.NOT_AUTHORIZED, str(exc)) from None
        will = terms.will
        if tenant is None:
            if terms.client_id[:1] == "$" and reserved(terms.client_id):
                raise Refusal(ConnackCode311.IDENTIFIER_REJECTED, ReasonCode.CLIENT_IDENTIFIER_NOT_VALID,
                              "client ids under $tenant/ are the tenants' own")
            if will is not None and will.topic[:1] == "$" and reserved(will.topic) and not terms.info.superuser:
                raise Refusal(ConnackCode311.NOT_AUTHORIZED, ReasonCode.NOT_AUTHORIZED, "will denied")
            return
        refused = tenant.admit_connection(self.clock.monotonic())
        if refused is not None:
            code5 = ReasonCode.QUOTA_EXCEEDED if refused == QUOTA else ReasonCode.CONNECTION_RATE_EXCEEDED
            raise Refusal(ConnackCode311.SERVER_UNAVAILABLE, code5, f"tenant {tenant.name}: connection {refused}")
        terms.info = replace(terms.info, tenant=tenant.name)
        self.tenant, self.mount = tenant, tenant.mount
        self.client_id = terms.client_id = tenant.mount + terms.client_id
        if will is not None:
            will.topic = mount_topic(tenant.mount, will.topic)
            will.publisher = terms.client_id

    def _take_terms(self, terms: Terms) -> None:
        """What CONNECT negotiated, for the life of the connection."""
        self.info = terms.info
        self.keepalive = terms.keepalive
        self.expiry = terms.expiry
        self.alias_max = terms.alias_max
        self.max_packet = terms.max_packet
        self.will = terms.will
        self.will_delay = terms.will_delay
        self.bridge = terms.bridge

    def _open_session(self, packet: Connect, terms: Terms) -> None:
        """Authenticated: a clean session the node can start at once is answered now; any other (a session to
        restore or take over, a store to ask first) after the store."""
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
        node = self.node
        session, present = await node.sessions.open(self, client_id, self.level, packet.clean_start, self.expiry,
                                                    terms.window)
        if self._state == CLOSED:  # the connection died while we were restoring the session
            node.sessions.close(self, session)
            return None
        if self.will is not None and node.topology.shared:
            # Stored before CONNACK: if this node dies from here on, a survivor publishes it.
            node.writes.save_will(WillRecord(client_id, self.will, self.will_delay, node.node_id))
            await node.writes.will_settled(client_id)
            if self._state == CLOSED:
                node.sessions.close(self, session)
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
        if session.persistent and session.record.inbound_qos2:  # PUBREC'd before a move (`SessionOpener.open`)
            self.inbound_qos2 = set(session.record.inbound_qos2)
        self.listener.connections += 1
        if self.tenant is not None:
            self.tenant.connections += 1
        if self.will is not None and not node.topology.shared:
            node.writes.save_will(WillRecord(client_id, self.will, self.will_delay, node.node_id))
        ack = terms.ack_properties
        if self.level >= 5 or present or ack:
            self._send(Connack(present, 0, ack))
        else:
            self.io.write(_CONNACK_ACCEPTED_311)
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
        now = self.clock.monotonic()
        self.io.set_deadline(now + keepalive * 1.5 if keepalive else None)
        settings = node.settings
        if settings.max_inbound_rate or settings.max_inbound_bytes_rate:
            self.limiter = InboundLimiter(settings.max_inbound_rate, settings.max_inbound_bytes_rate, now)
        session.attach(self, fresh=fresh)
        node.subscriptions.resume_groups(session)
        if settings.auto_subscribe:
            self._auto_subscribe(session)
        self.run_backlog()
        if self._state == CONNECTED:
            self._release(HOLD_CONNECT)

    def _auto_subscribe(self, session: Session) -> None:
        """`auto_subscribe`: as if the client had subscribed first thing (the ACL applies; retained messages
        follow), with no SUBACK."""
        node = self.node
        requests = auto_requests(node.settings.auto_subscribe, self.info.client_id, self.info.username)
        if self.mount:
            requests = mount_requests(self.mount, requests)
        granted, retained, _ = node.subscribe(session, self, requests)
        if any(isinstance(g, SubscribeRefusal) for g in granted):
            log.info("client.auto_subscribe_refused", extra={"client_id": self.client_id, "filters": ",".join(
                r.topic_filter for r, g in zip(requests, granted, strict=True) if isinstance(g, SubscribeRefusal))})
        if session.persistent:
            node.writes.save_session(session.snapshot())
        if retained:
            node.spawn(node.send_retained(session, retained))

    def run_backlog(self) -> None:
        """What was read while CONNECT was processed (MqttChannel)."""
