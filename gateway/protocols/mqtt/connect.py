"""CONNECT negotiation, sans-IO: from a CONNECT packet and the settings to the terms of the connection
(client id, keepalive, session expiry, windows, will, whether it is another broker's bridge) and the CONNACK
properties, or a refusal."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from tidewire.extensions.authentication import Failure
from tidewire.extensions.hooks import Authorizer, ClientInfo
from tidewire.gateway.config import Settings
from tidewire.gateway.core.ingress import speaks_for_itself
from tidewire.gateway.core.rewrite import TopicRewriter
from tidewire.gateway.core.topics import valid_topic_name
from tidewire.gateway.protocols.mqtt.codec import ConnackCode311, Connect, PropertyId, ReasonCode, encode_properties
from tidewire.store.base import NEVER_EXPIRES, PROTOCOL_BRIDGE, PROTOCOL_MQTT, Message

# The CONNECT user property by which an MQTT 5 bridge says it is one (MQTT 5 has no level bit for it).
BRIDGE_PROPERTY = ("tidewire-bridge", "1")
# Properties that depend on the receiver or the clock: never stored with the message.
PER_HOP = (PropertyId.TOPIC_ALIAS, PropertyId.MESSAGE_EXPIRY_INTERVAL, PropertyId.SUBSCRIPTION_IDENTIFIER)


def stored_properties(props: dict[int, Any]) -> bytes:
    """The stored property block (`store.properties`) of a PUBLISH's or a will's properties: the store's encoding
    is MQTT 5's, so the block is the packet's own properties re-encoded, minus the per-hop ones (no conversion
    through the neutral `Properties`; subscribers are sent the stored block as it is)."""
    if not props:
        return b""
    kept = {k: v for k, v in props.items() if k not in PER_HOP}
    return encode_properties(kept) if kept else b""


def expires_at(props: dict[int, Any], now_ms: int) -> int:
    interval = props.get(PropertyId.MESSAGE_EXPIRY_INTERVAL) if props else None
    return now_ms + interval * 1000 if interval is not None else 0


class Refusal(Exception):
    def __init__(self, code311: int, code5: int, detail: str) -> None:
        super().__init__(detail)
        self.code311 = code311
        self.code5 = code5
        self.detail = detail


@dataclass(slots=True)
class Terms:
    client_id: str
    info: ClientInfo
    keepalive: int
    expiry: int
    window: int  # outbound in-flight window: ours, capped by the client's Receive Maximum
    alias_max: int = 0  # the client's Topic Alias Maximum
    max_packet: int = 0  # the client's Maximum Packet Size
    will: Message | None = None
    will_delay: int = 0
    ack_properties: dict[int, Any] = field(default_factory=dict)
    bridge: bool = False  # another broker's bridge: its publishes are tagged, 3.x subscriptions get no-local


# How MQTT answers an admission refusal (gateway.transport.admission.AdmissionRefusal): 3.1.1 code, 5.0 code.
ADMISSION_CODES: dict[str, tuple[int, int]] = {
    "stopping": (ConnackCode311.SERVER_UNAVAILABLE, ReasonCode.SERVER_UNAVAILABLE),
    "unavailable": (ConnackCode311.SERVER_UNAVAILABLE, ReasonCode.SERVER_UNAVAILABLE),
    "busy": (ConnackCode311.SERVER_UNAVAILABLE, ReasonCode.SERVER_BUSY),
    "rate": (ConnackCode311.SERVER_UNAVAILABLE, ReasonCode.CONNECTION_RATE_EXCEEDED),
}


def negotiate(packet: Connect, settings: Settings, peer: str, now_ms: int) -> Terms:
    """Terms of the connection (a will expires from `now_ms`), or `Refusal` with the CONNACK codes to answer. Who
    the client is comes later (authentication): until then `terms.info` is anonymous, whatever user name the
    client claims."""
    v5 = packet.protocol_level >= 5
    props = packet.properties
    bridge = packet.bridge
    if bridge and not settings.accept_bridges:  # Mosquitto's bridge then tries again as a plain client
        raise Refusal(ConnackCode311.UNACCEPTABLE_PROTOCOL_VERSION, ReasonCode.UNSUPPORTED_PROTOCOL_VERSION,
                      "bridges are not accepted (accept_bridges)")
    if v5 and props and settings.accept_bridges:
        bridge = bridge or BRIDGE_PROPERTY in props.get(PropertyId.USER_PROPERTY, ())
    ack: dict[int, Any] = {}
    client_id = packet.client_id
    if not client_id:
        if not v5 and not packet.clean_start:
            raise Refusal(ConnackCode311.IDENTIFIER_REJECTED, 0, "empty client id, clean=0")
        client_id = "tw-" + uuid.uuid4().hex[:20]
        if v5:
            ack[PropertyId.ASSIGNED_CLIENT_IDENTIFIER] = client_id
    if len(client_id) > settings.max_client_id_length:
        raise Refusal(ConnackCode311.IDENTIFIER_REJECTED, ReasonCode.CLIENT_IDENTIFIER_NOT_VALID, "client id too long")
    info = ClientInfo(client_id, None, peer, packet.protocol_level)
    # keepalive: 5.0 clients are told the cap; 3.1.1 clients can't be told, so they keep what they asked
    keepalive = packet.keepalive
    if v5 and settings.max_keepalive and (keepalive == 0 or keepalive > settings.max_keepalive):
        keepalive = settings.max_keepalive
        ack[PropertyId.SERVER_KEEP_ALIVE] = keepalive
    if v5:
        expiry = min(props.get(PropertyId.SESSION_EXPIRY_INTERVAL, 0), settings.max_session_expiry)
    else:  # 3.1.1 persistent sessions last forever unless the operator says otherwise (Mosquitto's option)
        lifetime = settings.persistent_client_expiration or NEVER_EXPIRES
        expiry = 0 if packet.clean_start else min(lifetime, settings.max_session_expiry)
    terms = Terms(client_id, info, keepalive, expiry,
                  min(settings.max_inflight, props.get(PropertyId.RECEIVE_MAXIMUM, 65535)), bridge=bridge)
    if v5:
        terms.alias_max = props.get(PropertyId.TOPIC_ALIAS_MAXIMUM, 0)
        terms.max_packet = props.get(PropertyId.MAXIMUM_PACKET_SIZE, 0)
    will = packet.will
    if will is not None:
        if not valid_topic_name(will.topic):
            raise Refusal(ConnackCode311.IDENTIFIER_REJECTED, ReasonCode.TOPIC_NAME_INVALID, "invalid will topic")
        if len(will.topic) > settings.max_topic_length or will.topic.count("/") >= settings.max_topic_levels:
            raise Refusal(ConnackCode311.IDENTIFIER_REJECTED, ReasonCode.TOPIC_NAME_INVALID, "will topic too long")
        will_props = {k: v for k, v in will.properties.items() if k != PropertyId.WILL_DELAY_INTERVAL}
        terms.will = Message(will.topic, will.payload, will.qos, will.retain, stored_properties(will_props), 0,
                             expires_at(will.properties, now_ms), client_id,
                             protocol=PROTOCOL_BRIDGE if bridge else PROTOCOL_MQTT)
        terms.will_delay = will.properties.get(PropertyId.WILL_DELAY_INTERVAL, 0) if v5 else 0
    if v5:
        if settings.max_inbound_qos2 < 65535:
            ack[PropertyId.RECEIVE_MAXIMUM] = settings.max_inbound_qos2
        ack[PropertyId.MAXIMUM_PACKET_SIZE] = settings.max_packet_size
        if settings.topic_alias_maximum:
            ack[PropertyId.TOPIC_ALIAS_MAXIMUM] = settings.topic_alias_maximum
        if props.get(PropertyId.REQUEST_RESPONSE_INFORMATION):
            ack[PropertyId.RESPONSE_INFORMATION] = settings.response_information + client_id
    terms.ack_properties = ack
    return terms


def check_will(terms: Terms, authorizer: Authorizer, rewriter: TopicRewriter | None = None) -> None:
    """Once the client is authenticated: may it leave this will (its topic rewritten first)? `Refusal` if not."""
    will = terms.will
    if will is not None and rewriter is not None and rewriter.active:
        rewritten = rewriter.publish(will.topic, terms.info.client_id, terms.info.username)
        if rewritten is not None:
            will.topic = rewritten.topic
    if will is not None and ((will.topic.startswith("$SYS") and not speaks_for_itself(terms.info, will.topic))
                             or not authorizer.allow_publish(terms.info, will.topic)):
        raise Refusal(ConnackCode311.NOT_AUTHORIZED, ReasonCode.NOT_AUTHORIZED, "will denied")


def refusal_codes(failure: Failure) -> tuple[int, int]:
    """CONNACK codes (3.1.1, 5.0) for an authentication failure."""
    if failure is Failure.BAD_CREDENTIALS:
        return ConnackCode311.BAD_USERNAME_OR_PASSWORD, ReasonCode.BAD_USER_NAME_OR_PASSWORD
    if failure is Failure.UNAVAILABLE:
        return ConnackCode311.SERVER_UNAVAILABLE, ReasonCode.SERVER_UNAVAILABLE
    return ConnackCode311.NOT_AUTHORIZED, ReasonCode.NOT_AUTHORIZED
