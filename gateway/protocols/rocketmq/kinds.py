"""RocketMQ 5 message kinds beyond NORMAL: FIFO (a message group) and delay/timer (a delivery timestamp), as
they are kept in the store and read back (transactional ones: `transactions`).

A message's group and delivery time are stored as user properties under RocketMQ's own internal property
names (`mapping`: `__SHARDINGKEY`, `TIMER_DELIVER_MS`), so they go wherever the message goes (every engine,
restarts, other nodes) and a consumer gets them back as system properties. The consumer-group layer
(`gateway.core.consumers`) is told each message's lane (its group: one in flight per consumer group, in order)
and due time (hidden until then) through `lane_of` and `due_of`.
"""

from __future__ import annotations

from typing import Any

from tidewire.store.base import Message
from tidewire.store.properties import Properties

from .mapping import DELIVER_AT_PROPERTY, MESSAGE_GROUP_PROPERTY, Code, Refusal
from .v2 import definition_pb2

MAX_MESSAGE_GROUP = 64  # characters of a message group (RocketMQ's maxMessageGroupSize)
_GROUP_BYTES = MESSAGE_GROUP_PROPERTY.encode()
_DELIVER_BYTES = DELIVER_AT_PROPERTY.encode()


def inbound_kind(system: Any, now_ms: int, max_delay_s: int) -> list[tuple[str, str]] | Refusal:
    """The stored properties of a sent message's kind (none for NORMAL), or why it is refused. The message type
    must agree with the properties, as RocketMQ's proxy checks."""
    kind = system.message_type
    if system.HasField("lite_topic") or system.HasField("priority"):
        return Refusal(Code.UNSUPPORTED, "lite and priority messages are not supported by this gateway")
    has_group, has_time = system.HasField("message_group"), system.HasField("delivery_timestamp")
    if kind == definition_pb2.TRANSACTION:  # a half message (`transactions`)
        if has_group or has_time:
            return Refusal(Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, "a transactional message has no message "
                                                                     "group and no delivery timestamp")
        return []
    if kind == definition_pb2.FIFO or (kind == definition_pb2.MESSAGE_TYPE_UNSPECIFIED and has_group):
        group = system.message_group
        if has_time:
            return Refusal(Code.ILLEGAL_DELIVERY_TIME, "a FIFO message has no delivery timestamp")
        if not group.strip() or len(group) > MAX_MESSAGE_GROUP or "\x00" in group:
            return Refusal(Code.ILLEGAL_MESSAGE_GROUP, f"a message group is 1 to {MAX_MESSAGE_GROUP} characters")
        return [(MESSAGE_GROUP_PROPERTY, group)]
    if kind == definition_pb2.DELAY or (kind == definition_pb2.MESSAGE_TYPE_UNSPECIFIED and has_time):
        if has_group:
            return Refusal(Code.ILLEGAL_MESSAGE_GROUP, "a delay message has no message group")
        if not has_time:
            return Refusal(Code.ILLEGAL_DELIVERY_TIME, "a delay message needs a delivery timestamp")
        stamp = system.delivery_timestamp
        at_ms = int(stamp.seconds) * 1000 + int(stamp.nanos) // 1_000_000
        if at_ms - now_ms > max_delay_s * 1000:
            return Refusal(Code.ILLEGAL_DELIVERY_TIME, f"delivery more than {max_delay_s} s ahead")
        return [(DELIVER_AT_PROPERTY, str(at_ms))] if at_ms > now_ms else []
    if kind not in (definition_pb2.NORMAL, definition_pb2.MESSAGE_TYPE_UNSPECIFIED) or has_group or has_time:
        return Refusal(Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, "the message's properties do not fit its type")
    return []


def _property(message: Message, name: str, raw: bytes) -> str:
    if raw not in message.properties:  # most messages: no parse
        return ""
    for key, value in Properties.from_block(message.properties).user:
        if key == name:
            return value
    return ""


def lane_of(message: Message) -> str:
    """The message group of a FIFO message ("" for others): its lane in every consumer group."""
    return _property(message, MESSAGE_GROUP_PROPERTY, _GROUP_BYTES)


def due_of(message: Message) -> int:
    """When a delay message may be delivered (ms), 0 for others."""
    value = _property(message, DELIVER_AT_PROPERTY, _DELIVER_BYTES)
    return int(value) if value.isdigit() else 0
