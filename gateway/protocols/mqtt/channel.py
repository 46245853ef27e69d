"""One MQTT connection's rules, sans-IO: bytes and time in, packets and decisions out (as EMQX's `emqx_channel`
under `emqx_connection`, or an `h11.Connection` under uvicorn's protocol).

The channel holds the connection's state (NEW → CONNECTING → [AUTHENTICATING] → CONNECTED → CLOSED), the
packets after CONNECT, flow control in both directions, the deadlines (CONNECT timeout, keepalive, close drain)
and every way a connection ends (abort, takeover, kick, shutdown, credential expiry, graceful close). It never
touches a socket, an event loop or the system clock: what it needs of its connection goes through `ChannelIo`
(write, pause and resume reading, close, one deadline, a timer), time through the `Clock` it is given, and
the node's work through the node's own calls. `MqttProtocol` (gateway/protocols/mqtt/connection.py) is the
asyncio side that moves the bytes.

CONNECT and enhanced authentication are in `Handshake` (gateway/protocols/mqtt/handshake.py), SUBSCRIBE and
UNSUBSCRIBE in `Subscribing` (gateway/protocols/mqtt/subscribing.py): the bases of this class.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from tidewire.extensions.dynsec.model import CONTROL_TOPIC
from tidewire.gateway.core.ingress import INVALID_TOPIC, refuse_publish
from tidewire.gateway.core.tenants import mount_topic
from tidewire.gateway.protocols.mqtt.codec import (
    PINGRESP,
    Auth,
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
    Subscribe,
    Unsubscribe,
    encode,
    puback,
    pubcomp,
    pubrec,
)
from tidewire.gateway.protocols.mqtt.connect import expires_at, stored_properties
from tidewire.gateway.protocols.mqtt.conveniences import (
    publish_topic,
)
from tidewire.gateway.protocols.mqtt.lifecycle import (
    AUTHENTICATING,
    CLOSED,
    CONNECTED,
    CONNECTING,
    HOLD_HOOKS,
    HOLD_RATE,
    HOLD_STORE,
    HOLD_SUBSCRIBE,
    NEW,
    ChannelIo,
)
from tidewire.gateway.protocols.mqtt.subscribing import Subscribing
from tidewire.pipeline.lake.event_names import DROPPED
from tidewire.store.base import PROTOCOL_BRIDGE, Message

if TYPE_CHECKING:
    from tidewire.gateway.core.clock import Clock
    from tidewire.gateway.node import Node
    from tidewire.gateway.ops.tracing import ChannelTap
    from tidewire.gateway.transport.listeners import Listener

log = logging.getLogger("tidewire.conn")

class MqttChannel(Subscribing):
    __slots__ = ("_pubcomps", "tap")

    def __init__(self, node: Node, listener: Listener, io: ChannelIo, peer: str, clock: Clock) -> None:
        self._pubcomps: list[int] | None = None  # PUBCOMPs waiting for their keys' release (persistent sessions)
        self.tap: ChannelTap | None = None  # set while a trace records this connection (gateway.ops.tracing)
        super().__init__(node, listener, io, peer, clock)

    # --- bytes in -----------------------------------------------------------------------------------------
    def receive(self, data: bytes) -> None:
        """Bytes read from the connection."""
        if self._state == CLOSED:
            return  # draining after our last packet: read and drop, so the kernel doesn't reset the socket
        self.last_rx = self.clock.monotonic()
        try:
            packets = self.parser.feed(data)
        except ProtocolError as exc:
            self.abort(exc.reason_code, exc.message)
            return
        if self.tap is not None:
            self.tap.inbound(packets)
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
                    wait = limiter.admit(self.clock.monotonic(), len(packet.payload) + len(packet.topic))
                    if wait > 0:
                        # Over the client's rate: stop reading it and keep what was already read (one read's
                        # worth at most), so the rate holds within a read and nothing is dropped.
                        self._backlog = packets[index:]
                        self._hold(HOLD_RATE)
                        self.io.call_later(wait, self._metered_resume)
                        return
                self._handle(packet)
                if self._holds & HOLD_SUBSCRIBE:  # a SUBSCRIBE waits for the store: what follows waits behind it
                    self._backlog = packets[index + 1 :]
                    return
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
                if self.node.traces.running:
                    self.node.traces.connecting(self, packets[index:])
                self._on_connect(packet)  # the parser rejects anything but a CONNECT first
            else:
                return

    def _metered_resume(self) -> None:
        packets, self._backlog = self._backlog, None
        if self._state != CONNECTED or packets is None:
            return
        self._dispatch(packets)
        if self._backlog is None:
            self._release(HOLD_RATE)

    def run_backlog(self) -> None:
        """What was read while CONNECT was processed, once the session is open."""
        backlog, self._backlog = self._backlog or [], None
        for index, queued in enumerate(backlog):
            if self._state != CONNECTED:
                break
            self._handle(queued)
            if self._holds & HOLD_SUBSCRIBE:  # as in `_dispatch`: the rest waits for that SUBSCRIBE
                self._backlog = backlog[index + 1 :] + (self._backlog or [])
                break

    # --- writing flow control (the transport's buffer) ------------------------------------------------------
    def pause_writing(self) -> None:
        self.paused = True
        self._socket_full = True

    def resume_writing(self) -> None:
        self._socket_full = False
        if self._subacks is None:  # deliveries also wait for a SUBACK still owed (see `_on_subscribe`)
            self.paused = False
            if self.session is not None:
                self.session.resume_writing()

    # --- packets after CONNECT ----------------------------------------------------------------------------
    def _handle(self, packet: Any) -> None:
        kind = type(packet)
        if kind is Publish:
            self._on_publish(packet)
        elif kind is Puback:
            assert self.session is not None
            self.session.on_puback(packet.packet_id, self.last_rx)
        elif kind is Pubrec:
            assert self.session is not None
            known = self.session.on_pubrec(packet.packet_id, packet.reason_code >= 0x80, self.last_rx)
            if not known and self.level >= 5:
                self._send(Pubrel(packet.packet_id, ReasonCode.PACKET_IDENTIFIER_NOT_FOUND))
        elif kind is Pubcomp:
            assert self.session is not None
            self.session.on_pubcomp(packet.packet_id)
        elif kind is Pubrel:
            self._on_pubrel(packet)
        elif kind is Pingreq:
            self.io.write(PINGRESP)
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
        stats = self.session.stats  # type: ignore[union-attr]  # bound before any PUBLISH is handled
        stats.messages_in += 1
        stats.bytes_in += len(packet.payload)
        pid = packet.packet_id
        topic = packet.topic
        props = packet.properties
        node = self.node
        if props and PropertyId.TOPIC_ALIAS in props:
            alias = props[PropertyId.TOPIC_ALIAS]
            if not 0 < alias <= node.settings.topic_alias_maximum:
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
        now_ms = int(self.clock.time() * 1000)
        delay = None
        if topic[:1] == "$" or node.rewriter.active:  # the common topic pays these two tests only
            if topic == CONTROL_TOPIC and node.dynsec is not None:  # a dynamic-security request: run, never stored
                return self._control_acked(qos, pid, node.dynsec.submit(self.info, packet.payload))
            target = publish_topic(node, self.info, topic, now_ms)
            if target is None:  # a bad `$delayed/` interval, or the internal topic: as an invalid topic
                if qos:
                    self._send((Puback if qos == 1 else Pubrec)(pid, ReasonCode.TOPIC_NAME_INVALID if v5 else 0))
                return None
            topic, delay = target
        refused = refuse_publish(node.settings, node.authorizer, self.info, topic)
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
            node.counters.drop("not_authorized")
            stats.drops += 1
            if node.events is not None:
                node.events.add(DROPPED, int(self.clock.time() * 1000), self.client_id, "mqtt", topic, None, qos,
                                reason="not_authorized")
            code = ReasonCode.NOT_AUTHORIZED if v5 else 0
            if qos == 1:
                self._send(Puback(pid, code))
            elif qos == 2:
                self._send(Pubrec(pid, code))
            return None
        if qos == 2 and self.inbound_qos2 is not None and pid in self.inbound_qos2:
            self.io.write(pubrec(pid))  # a resend before PUBREL: acknowledge, don't store twice
            return None
        if self.tenant is not None:  # below the channel a tenant's topics are under its mount point
            if self.tenant.admit_message(self.clock.monotonic(), len(packet.payload) if packet.retain else 0):
                return self._tenant_refused(topic, qos, pid)
            topic = mount_topic(self.mount, topic)
        if packet.retain and packet.payload and not node.retained_quota.admit(len(packet.payload)):
            return self._retained_refused(topic, qos, pid)
        message = Message(topic, packet.payload, qos, packet.retain, stored_properties(props) if v5 else b"",
                          now_ms, expires_at(props, now_ms) if v5 else 0, self.client_id)
        if delay is not None:
            if not node.delayed.admit():
                return self._retained_refused(topic, qos, pid, "delayed_quota")
            message.due_ms = delay.due_ms  # the node keeps it in the store until then (`gateway.core.delayed`)
        if self.bridge:
            message.protocol = PROTOCOL_BRIDGE
        if qos == 0:
            if node.hooks is None:
                node.publish(message)
            else:
                node.hooks.submit(self, self.info, message, None, None)
            return None
        if qos == 2:
            if self.inbound_qos2 is None:
                self.inbound_qos2 = set()
            if len(self.inbound_qos2) >= node.settings.max_inbound_qos2:
                return self.abort(ReasonCode.RECEIVE_MAXIMUM_EXCEEDED, "too many QoS 2 publishes in flight")
            self.inbound_qos2.add(pid)
            if self.session is not None and self.session.persistent:
                # Held by the store with the message until PUBREL: a resend after a move or a crash is not
                # stored twice (`SessionOpener.open` gives the next connection the ids still held).
                message.dedupe = (self.client_id, str(pid))
        self.unacked_in += 1
        if qos == 1:
            self.pending_qos1 += 1
            if v5 and self.pending_qos1 + len(self.inbound_qos2 or ()) > node.settings.max_inbound_qos2:
                return self.abort(ReasonCode.RECEIVE_MAXIMUM_EXCEEDED, "more unacknowledged publishes than allowed")
        if self.unacked_in > node.settings.max_inbound_qos2 and not self._holds & HOLD_STORE:
            # The store is behind: stop reading this client until its acks catch up (no unbounded buffer).
            self._hold(HOLD_STORE)
        if node.hooks is None:
            node.publish(message, self, puback(pid) if qos == 1 else pubrec(pid))
        else:  # in order behind this client's earlier publishes; `publish_refused` if a hook refuses it
            node.hooks.submit(self, self.info, message, self, puback(pid) if qos == 1 else pubrec(pid))
        return None

    def _control_acked(self, qos: int, pid: int, accepted: bool) -> None:
        """Acknowledge a request to the dynamic-security control topic: refused (not an admin) as an ACL denial is."""
        if not accepted:
            log.info("acl.denied", extra={"client_id": self.client_id, "topic": CONTROL_TOPIC, "access": "publish"})
            self.node.counters.drop("not_authorized")
        code = 0 if accepted or self.level < 5 else ReasonCode.NOT_AUTHORIZED
        if qos == 1:
            self._send(Puback(pid, code))
        elif qos == 2:
            if accepted:  # its PUBREL gets the PUBCOMP
                if self.inbound_qos2 is None:
                    self.inbound_qos2 = set()
                self.inbound_qos2.add(pid)
            self._send(Pubrec(pid, code))

    def _retained_refused(self, topic: str, qos: int, pid: int, reason: str = "retained_quota") -> None:
        """Over a retained cap (`gateway.core.retained_quota`) or the delayed messages' (`delayed_quota`):
        PUBACK/PUBREC 0x97 (3.1.1: a plain one), the message dropped and counted under `reason`; the connection
        stays."""
        node = self.node
        log.info("publish." + reason, extra={"client_id": self.client_id, "topic": topic})
        node.counters.drop(reason)
        if node.events is not None:
            node.events.add(DROPPED, int(self.clock.time() * 1000), self.client_id, "mqtt", topic, None, qos,
                            reason=reason)
        if qos:
            code = ReasonCode.QUOTA_EXCEEDED if self.level >= 5 else 0
            self._send((Puback if qos == 1 else Pubrec)(pid, code))

    def _tenant_refused(self, topic: str, qos: int, pid: int) -> None:
        """Over its tenant's message rate or retained bytes: PUBACK/PUBREC 0x97 (3.1.1: a plain one), the message
        dropped and counted by the tenant; the connection stays."""
        log.info("publish.tenant_limit", extra={"client_id": self.client_id, "topic": topic})
        if qos:
            code = ReasonCode.QUOTA_EXCEEDED if self.level >= 5 else 0
            self._send((Puback if qos == 1 else Pubrec)(pid, code))

    # --- publish hooks (gateway.core.publish_hooks.Publisher) --------------------------------------------------
    def publish_refused(self, message: Message, token: bytes | None, reason: str) -> None:
        """A publish hook refused `message` (or the ACL its rewritten topic): answered as an ACL denial is, PUBACK
        or PUBREC 0x87 (3.1.1: a plain PUBACK/PUBREC, the message dropped); `token` is the ack it would have had.
        The hooks logged and counted it."""
        if self.node.events is not None:
            self.node.events.add(DROPPED, int(self.clock.time() * 1000), self.client_id, "mqtt", message.topic, None,
                                 message.qos, reason="not_authorized")
        if token is None:
            return
        pid = (token[2] << 8) | token[3]
        self.unacked_in -= 1
        if token[0] == 0x40:
            self.pending_qos1 -= 1
        elif self.inbound_qos2 is not None:
            self.inbound_qos2.discard(pid)  # no PUBREL follows a refusal (3.1.1: one that does gets its PUBCOMP)
        code = ReasonCode.NOT_AUTHORIZED if self.level >= 5 else 0
        self._send((Puback if token[0] == 0x40 else Pubrec)(pid, code))
        if self._holds & HOLD_STORE and self.unacked_in <= self.node.settings.max_inbound_qos2 // 2:
            self._release(HOLD_STORE)

    def hold_publishes(self, held: bool) -> None:
        """The hooks' lane of this client is long: stop reading it until it is down to half."""
        if held:
            self._hold(HOLD_HOOKS)
        else:
            self._release(HOLD_HOOKS)

    def _on_pubrel(self, packet: Pubrel) -> None:
        pid = packet.packet_id
        known = self.inbound_qos2 is not None and pid in self.inbound_qos2
        if known:
            self.inbound_qos2.discard(pid)  # type: ignore[union-attr]
            if self.session is not None and self.session.persistent:
                # The store's key goes first: the client may reuse the id once it has PUBCOMP.
                self.node.writes.release_key(self.client_id, str(pid))
                if self._pubcomps is None:
                    self._pubcomps = [pid]
                    self.node.spawn(self._complete_after_release())
                else:
                    self._pubcomps.append(pid)
                return
        code = 0 if known or self.level < 5 else ReasonCode.PACKET_IDENTIFIER_NOT_FOUND
        self.io.write(pubcomp(pid) if code == 0 else encode(Pubcomp(pid, code), self.level))

    async def _complete_after_release(self) -> None:
        """PUBCOMP the PUBRELs whose releases were issued, once they are done; then those that came meanwhile."""
        while self._pubcomps:
            pids, self._pubcomps = self._pubcomps, []
            await self.node.writes.keys_settled(self.client_id)  # covers every release issued before this
            if self._state == CONNECTED:
                self.io.write(b"".join(pubcomp(pid) for pid in pids))
        self._pubcomps = None

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
