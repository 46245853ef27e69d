"""One MQTT connection: a thin asyncio Protocol over the sans-IO parser, handling each packet it yields.

Session state lives in `Session` and the node; this class keeps only what belongs to the socket: protocol
level, keepalive, the will, inbound QoS 2 packet ids, and flow control in both directions.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any, cast

from extensions.hooks import ClientInfo
from gateway.codec import (
    PINGRESP,
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
    encode_properties,
    puback,
    pubcomp,
    pubrec,
)
from gateway.node import Node
from gateway.session import Session
from gateway.topics import valid_topic_name
from store.base import NEVER_EXPIRES, Message

log = logging.getLogger("tidewire.conn")

# Properties that depend on the receiver or the clock: never stored with the message.
_PER_HOP = (PropertyId.TOPIC_ALIAS, PropertyId.MESSAGE_EXPIRY_INTERVAL, PropertyId.SUBSCRIPTION_IDENTIFIER)
_NEW, _CONNECTING, _CONNECTED, _CLOSED = range(4)
_NOBODY = ClientInfo("", None)


def _stored_properties(props: dict[int, Any]) -> bytes:
    if not props:
        return b""
    kept = {k: v for k, v in props.items() if k not in _PER_HOP}
    return encode_properties(kept) if kept else b""


def _expires_at(props: dict[int, Any], now_ms: int) -> int:
    interval = props.get(PropertyId.MESSAGE_EXPIRY_INTERVAL) if props else None
    return now_ms + interval * 1000 if interval is not None else 0


class MqttConnection(asyncio.Protocol):
    __slots__ = (
        "_backlog",
        "_deadline_handle",
        "_state",
        "client_id",
        "expiry",
        "inbound_qos2",
        "info",
        "keepalive",
        "last_rx",
        "level",
        "node",
        "parser",
        "paused",
        "peer",
        "reading_paused",
        "session",
        "transport",
        "unacked_in",
        "will",
        "will_delay",
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
            self.transport.writelines(chunks)

    def write_acks(self, acks: list[bytes]) -> None:
        """PUBACK/PUBREC packets whose messages are now durable."""
        self.unacked_in -= len(acks)
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
            self._send(Disconnect(reason))
        self._closed(will=False, reason="server shutdown", keep_will=True)

    def take_over(self) -> Session | None:
        """Another connection claims this client id: close this one and hand its session over."""
        session = self.session
        if self.level >= 5 and self._state == _CONNECTED:
            self._send(Disconnect(ReasonCode.SESSION_TAKEN_OVER))
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
                self._send(Disconnect(ReasonCode.KEEP_ALIVE_TIMEOUT))
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
        settings = self.node.settings
        v5 = self.level >= 5
        props = packet.properties
        client_id = packet.client_id
        self.client_id = client_id
        ack_props: dict[int, Any] = {}
        if not client_id:
            if not v5 and not packet.clean_start:
                return self._refuse(ConnackCode311.IDENTIFIER_REJECTED, 0, "empty client id, clean=0")
            client_id = self.client_id = "tw-" + uuid.uuid4().hex[:20]
            if v5:
                ack_props[PropertyId.ASSIGNED_CLIENT_IDENTIFIER] = client_id
        if len(client_id) > settings.max_client_id_length:
            return self._refuse(ConnackCode311.IDENTIFIER_REJECTED, ReasonCode.CLIENT_IDENTIFIER_NOT_VALID,
                                "client id too long")
        if PropertyId.AUTHENTICATION_METHOD in props:
            return self._refuse(0, ReasonCode.BAD_AUTHENTICATION_METHOD, "enhanced auth not supported")
        if len(self.node.connections) >= settings.max_connections and client_id not in self.node.connections:
            return self._refuse(ConnackCode311.SERVER_UNAVAILABLE, ReasonCode.SERVER_BUSY, "max connections")
        self.info = ClientInfo(client_id, packet.username, self.peer, self.level)
        # keepalive: 5.0 clients are told the cap; 3.1.1 clients can't be told, so they keep what they asked
        keepalive = packet.keepalive
        if v5 and settings.max_keepalive and (keepalive == 0 or keepalive > settings.max_keepalive):
            keepalive = settings.max_keepalive
            ack_props[PropertyId.SERVER_KEEP_ALIVE] = keepalive
        self.keepalive = keepalive
        if v5:
            expiry = min(props.get(PropertyId.SESSION_EXPIRY_INTERVAL, 0), settings.max_session_expiry)
        else:
            expiry = 0 if packet.clean_start else min(NEVER_EXPIRES, settings.max_session_expiry)
        self.expiry = expiry
        window = min(settings.max_inflight, props.get(PropertyId.RECEIVE_MAXIMUM, 65535))
        will = packet.will
        if will is not None:
            if not valid_topic_name(will.topic):
                return self._refuse(ConnackCode311.IDENTIFIER_REJECTED, ReasonCode.TOPIC_NAME_INVALID,
                                    "invalid will topic")
            if not self.node.authorizer.allow_publish(self.info, will.topic):
                return self._refuse(ConnackCode311.NOT_AUTHORIZED, ReasonCode.NOT_AUTHORIZED, "will denied")
            now_ms = int(time.time() * 1000)
            self.will = Message(will.topic, will.payload, will.qos, will.retain,
                                _stored_properties({k: v for k, v in will.properties.items()
                                                    if k != PropertyId.WILL_DELAY_INTERVAL}),
                                0, _expires_at(will.properties, now_ms), client_id)
            self.will_delay = will.properties.get(PropertyId.WILL_DELAY_INTERVAL, 0) if v5 else 0
        session, present = await self.node.open_session(self, client_id, self.level, packet.clean_start,
                                                        expiry, window)
        if self._state == _CLOSED:  # the socket died while we were restoring the session
            self.node.close_session(self, session)
            return None
        self.session = session
        if self.will is not None:
            self.node.store_will(client_id, self.will, self.will_delay)
        if v5:
            if settings.max_inbound_qos2 < 65535:
                ack_props[PropertyId.RECEIVE_MAXIMUM] = settings.max_inbound_qos2
            ack_props[PropertyId.MAXIMUM_PACKET_SIZE] = settings.max_packet_size
            ack_props[PropertyId.SUBSCRIPTION_IDENTIFIER_AVAILABLE] = 0
            ack_props[PropertyId.SHARED_SUBSCRIPTION_AVAILABLE] = 0
        self._send(Connack(present, 0, ack_props))
        self._state = _CONNECTED
        log.info("client.connected", extra={"client_id": client_id, "peer": self.peer, "level": self.level,
                                            "keepalive": keepalive, "clean_start": packet.clean_start,
                                            "session_present": present})
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
        else:
            self.abort(ReasonCode.PROTOCOL_ERROR, f"unexpected {kind.__name__}")

    def _on_publish(self, packet: Publish) -> None:
        v5 = self.level >= 5
        qos = packet.qos
        pid = packet.packet_id
        topic = packet.topic
        props = packet.properties
        if props and PropertyId.TOPIC_ALIAS in props:
            return self.abort(ReasonCode.TOPIC_ALIAS_INVALID, "topic aliases are not enabled")
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
        message = Message(topic, packet.payload, qos, packet.retain, _stored_properties(props) if v5 else b"",
                          now_ms, _expires_at(props, now_ms) if v5 else 0, self.client_id)
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
        codes, retained = self.node.subscribe(session, self, packet.subscriptions)
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
