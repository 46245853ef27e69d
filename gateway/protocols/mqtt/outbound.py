"""Outbound PUBLISH bytes: encoded once per receiver kind and shared across every subscriber of that kind.

A receiver kind is (protocol level, QoS, retain flag) in the common case; subscription identifiers, the
remaining message expiry and a topic alias widen the key only for the deliveries that carry them, and so does a
tenant's mount point (`gateway.core.tenants`): its clients are shown the topic without it.
"""

from __future__ import annotations

from tidewire.gateway.core.tenants import unmount
from tidewire.gateway.protocols.mqtt.codec import PropertyId, encode_properties, publish_parts
from tidewire.store.base import Message

# Stop caching rarely shared variants (e.g. one per second of remaining expiry) once a message has this many.
_MAX_VARIANTS = 16


def encoded_publish(message: Message, level: int, qos: int, retain: bool, mount: str = "") -> tuple[bytes, bytes]:
    """(head, tail) of this message's PUBLISH: `head + packet_id + tail` (QoS > 0) or `head` (QoS 0); `mount`: the
    receiver's tenant mount point, taken off the topic."""
    cache = message.encoded
    if cache is None:
        cache = message.encoded = {}
    key = (level, qos, retain, mount) if mount else (level, qos, retain)
    parts = cache.get(key)
    if parts is None:
        topic = unmount(mount, message.topic) if mount else message.topic
        head, tail = publish_parts(topic, message.payload, qos, retain, message.properties, level)
        # QoS 0 needs no packet id in the middle: keep it as one buffer, one write
        parts = cache[key] = (head + tail, b"") if qos == 0 else (head, tail)
    return parts


def encoded_publish_with(message: Message, level: int, qos: int, retain: bool, sub_ids: tuple[int, ...],
                         expiry: int, alias: int, send_topic: bool, mount: str = "") -> tuple[bytes, bytes]:
    """Like `encoded_publish`, plus per-delivery MQTT 5 properties (ids, remaining expiry, topic alias)."""
    if level < 5 or not (sub_ids or expiry or alias):
        return encoded_publish(message, level, qos, retain, mount)
    cache = message.encoded
    if cache is None:
        cache = message.encoded = {}
    key = (level, qos, retain, sub_ids, expiry, alias, send_topic, mount)
    parts = cache.get(key)
    if parts is not None:
        return parts
    extra: dict[int, object] = {}
    if expiry:
        extra[PropertyId.MESSAGE_EXPIRY_INTERVAL] = expiry
    if alias:
        extra[PropertyId.TOPIC_ALIAS] = alias
    if sub_ids:
        extra[PropertyId.SUBSCRIPTION_IDENTIFIER] = list(sub_ids)
    properties = message.properties + encode_properties(extra)
    topic = (unmount(mount, message.topic) if mount else message.topic) if send_topic else ""
    head, tail = publish_parts(topic, message.payload, qos, retain, properties, level)
    parts = (head + tail, b"") if qos == 0 else (head, tail)
    if len(cache) < _MAX_VARIANTS:
        cache[key] = parts
    return parts


def with_dup(head: bytes) -> bytes:
    return bytes((head[0] | 0x08,)) + head[1:]
