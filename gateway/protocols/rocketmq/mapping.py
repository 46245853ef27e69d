"""Mapping between RocketMQ 5 messages (`apache.rocketmq.v2` protobufs) and the gateway's stored messages.

Topics as RocketMQ-MQTT maps them: the RocketMQ topic is the MQTT topic's first level and the user property
`mqttSecondTopic` (name configurable) holds the rest in RocketMQ-MQTT's normal form (`TopicUtils.
normalizeSecondTopic`: a leading and a trailing `/`, so `a/b/c` is topic `a` with `/b/c/`). On the way in one
leading `/` is added if missing and one trailing `/` removed if present, so `b/c`, `/b/c` and `/b/c/` all name
`T/b/c` and every second topic this module writes maps back to the same MQTT topic.

The tag and the keys are kept as MQTT user properties `TAGS` and `KEYS` (space separated), RocketMQ's own
property names; every other user property maps 1:1. A FIFO message's group and a delay message's delivery time
(`kinds`) are kept the same way, under RocketMQ's internal names `__SHARDINGKEY` and `TIMER_DELIVER_MS`, and
come back as system properties (a client's user property of one of those names is dropped).

Message ids and receipt handles are log positions: a message's id is its seq (the same id for every consumer,
after restarts), a receipt handle is (seq, claim token) plus a check of the consumer group it belongs to.
"""

from __future__ import annotations

import zlib
from typing import Any, NamedTuple

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from tidewire.store.base import Claim, Message
from tidewire.store.properties import Properties

from .v2 import definition_pb2

Code = definition_pb2.Code
TAG_PROPERTY = "TAGS"
KEYS_PROPERTY = "KEYS"
KEY_SEPARATOR = " "
MESSAGE_GROUP_PROPERTY = "__SHARDINGKEY"
DELIVER_AT_PROPERTY = "TIMER_DELIVER_MS"
_INTERNAL = (TAG_PROPERTY, KEYS_PROPERTY, MESSAGE_GROUP_PROPERTY, DELIVER_AT_PROPERTY)
MAX_TOPIC = 255  # characters of a RocketMQ topic (an MQTT first level) or consumer group name
MAX_PROPERTIES_BYTES = 16 * 1024  # user properties, tag and keys of one message (RocketMQ's limit)
MAX_RECEIPT_HANDLE = 128


class Refusal(NamedTuple):
    """Why a request (or one message of it) is refused: a RocketMQ status code and a reason for the client."""

    code: int
    reason: str


class Inbound(NamedTuple):
    """A RocketMQ message ready to publish."""

    topic: str  # the MQTT topic
    payload: bytes
    properties: Properties
    message_id: str  # the client's (retries of one send carry the same)


def status(code: int, message: str = "") -> Any:
    """A `Status` with the code's name as its message unless a reason is given."""
    return definition_pb2.Status(code=code, message=message or definition_pb2.Code.Name(code))


def bad_name(name: str) -> bool:
    """Not usable as a RocketMQ topic (an MQTT first level) or consumer group name here."""
    return (not name or len(name) > MAX_TOPIC or "/" in name or "+" in name or "#" in name or "\x00" in name)


def split_topic(topic: str) -> tuple[str, str | None]:
    """MQTT topic -> (RocketMQ topic, second topic in RocketMQ-MQTT's normal form, None for a one-level topic)."""
    cut = topic.find("/")
    if cut < 0:
        return topic, None
    return topic[:cut], topic[cut:] + "/"


def join_topic(rmq_topic: str, second: str | None) -> str:
    """RocketMQ topic + second topic (any of RocketMQ-MQTT's spellings) -> MQTT topic."""
    if not second or second == "/":
        return rmq_topic
    if not second.startswith("/"):
        second = "/" + second
    if second.endswith("/"):
        second = second[:-1]
    return rmq_topic + second


def message_id(seq: int) -> str:
    """The id every consumer sees for the message at `seq` (and the producer's receipt names)."""
    return f"{seq:032X}"


def _group_check(group: str) -> str:
    return f"{zlib.crc32(group.encode()) & 0xFFFFFFFF:08x}"


def receipt_handle(group: str, seq: int, token: int) -> str:
    return f"{seq:x}.{token:x}.{_group_check(group)}"


def parse_receipt_handle(group: str, handle: str) -> tuple[int, int] | None:
    """(seq, token) of a handle this server gave out for `group`; None for anything else."""
    if len(handle) > MAX_RECEIPT_HANDLE:
        return None
    parts = handle.split(".")
    if len(parts) != 3 or parts[2] != _group_check(group):
        return None
    try:
        seq, token = int(parts[0], 16), int(parts[1], 16)
    except ValueError:
        return None
    return (seq, token) if seq >= 0 and token >= 0 else None


def duration_ms(duration: Duration) -> int:
    return int(duration.seconds) * 1000 + int(duration.nanos) // 1_000_000


def set_ms(target: Any, ms: int) -> None:
    """Set a protobuf Timestamp or Duration from milliseconds."""
    target.seconds, target.nanos = divmod(ms, 1000)
    target.nanos *= 1_000_000


def inbound(pb: Any, second_topic_property: str, max_body: int) -> Inbound | Refusal:
    """Check one `definition_pb2.Message` of a SendMessage and map it; never raises on client input. Its kind
    (type, message group, delivery time) is checked and mapped by `kinds.inbound_kind`."""
    rmq_topic = pb.topic.name
    if bad_name(rmq_topic):
        return Refusal(Code.ILLEGAL_TOPIC, "a topic is one MQTT topic level: no '/', '+', '#', 1 to 255 characters")
    system = pb.system_properties
    if not system.message_id or len(system.message_id) > MAX_TOPIC:
        return Refusal(Code.ILLEGAL_MESSAGE_ID, "a message id of 1 to 255 characters is required")
    body = pb.body
    if len(body) > max_body and system.body_encoding != definition_pb2.GZIP:
        return Refusal(Code.MESSAGE_BODY_TOO_LARGE, f"message body over {max_body} bytes")
    if system.body_encoding == definition_pb2.GZIP:
        unpacked = _gunzip(body, max_body)
        if isinstance(unpacked, Refusal):
            return unpacked
        body = unpacked
    elif system.body_encoding not in (definition_pb2.ENCODING_UNSPECIFIED, definition_pb2.IDENTITY):
        return Refusal(Code.UNSUPPORTED, "unknown body encoding")
    if not body:
        return Refusal(Code.MESSAGE_BODY_EMPTY, "message body is empty")
    user: list[tuple[str, str]] = []
    size = 0
    second: str | None = None
    for name, value in pb.user_properties.items():
        if not name or "\x00" in name or "\x00" in value:
            return Refusal(Code.ILLEGAL_MESSAGE_PROPERTY_KEY, "user property names must be non-empty, without NUL")
        size += len(name) + len(value)
        if name == second_topic_property:
            second = value
        elif name not in _INTERNAL:  # those come from the system properties only
            user.append((name, value))
    if system.HasField("tag"):
        tag = system.tag
        if not tag.strip() or "|" in tag or "\x00" in tag:
            return Refusal(Code.ILLEGAL_MESSAGE_TAG, "a tag must be non-blank, without '|'")
        user.append((TAG_PROPERTY, tag))
        size += len(tag)
    if system.keys:
        if any(not key.strip() or KEY_SEPARATOR in key or "\x00" in key for key in system.keys):
            return Refusal(Code.ILLEGAL_MESSAGE_KEY, "keys must be non-blank, without spaces")
        keys = KEY_SEPARATOR.join(system.keys)
        user.append((KEYS_PROPERTY, keys))
        size += len(keys)
    if size > MAX_PROPERTIES_BYTES:
        return Refusal(Code.MESSAGE_PROPERTIES_TOO_LARGE, f"properties over {MAX_PROPERTIES_BYTES} bytes")
    if second is not None and ("\x00" in second or "+" in second or "#" in second):
        return Refusal(Code.ILLEGAL_TOPIC, f"{second_topic_property} must not contain '+', '#' or NUL")
    return Inbound(join_topic(rmq_topic, second), bytes(body), Properties(user=user), system.message_id)


def _gunzip(body: bytes, max_body: int) -> bytes | Refusal:
    inflate = zlib.decompressobj(wbits=zlib.MAX_WBITS | 32)  # gzip or zlib header, as RocketMQ clients send
    try:
        out = inflate.decompress(body, max_body + 1)
    except zlib.error:
        return Refusal(Code.MESSAGE_CORRUPTED, "body is not valid gzip")
    if len(out) > max_body:
        return Refusal(Code.MESSAGE_BODY_TOO_LARGE, f"message body over {max_body} bytes")
    if not inflate.eof:
        return Refusal(Code.MESSAGE_CORRUPTED, "body is not valid gzip")
    return out


class Outbound(NamedTuple):
    """What a delivery needs besides the message: who receives it and how it is settled."""

    namespace: str
    group: str  # the gateway's consumer group name (receipt handles are checked against it)
    invisible_ms: int
    second_topic_property: str
    store_host: str
    mount: str = ""  # the receiver's tenant's mount point, taken off the topic


def outbound(message: Message, claim: Claim, to: Outbound) -> Any:
    """A stored message as the `definition_pb2.Message` a consumer receives."""
    pb = definition_pb2.Message()
    rmq_topic, second = split_topic(message.topic[len(to.mount):] if to.mount else message.topic)
    pb.topic.name = rmq_topic
    pb.topic.resource_namespace = to.namespace
    pb.body = message.payload
    system = pb.system_properties
    user = pb.user_properties
    kind = definition_pb2.NORMAL
    for name, value in Properties.from_block(message.properties).user:
        if name == TAG_PROPERTY:
            system.tag = value
        elif name == KEYS_PROPERTY:
            system.keys.extend(key for key in value.split(KEY_SEPARATOR) if key)
        elif name == MESSAGE_GROUP_PROPERTY:
            system.message_group = value
            kind = definition_pb2.FIFO
        elif name == DELIVER_AT_PROPERTY:
            if value.isdigit():
                set_ms(system.delivery_timestamp, int(value))
            kind = definition_pb2.DELAY
        else:
            user[name] = value
    if second is not None:
        user[to.second_topic_property] = second
    system.message_id = message_id(message.seq)
    system.body_digest.type = definition_pb2.CRC32
    system.body_digest.checksum = f"{zlib.crc32(message.payload) & 0xFFFFFFFF:08X}"
    system.body_encoding = definition_pb2.IDENTITY
    system.message_type = kind
    set_ms(system.born_timestamp, message.timestamp_ms)
    set_ms(system.store_timestamp, message.timestamp_ms)
    system.store_host = to.store_host
    system.receipt_handle = receipt_handle(to.group, claim.seq, claim.token)
    system.queue_id = 0
    system.queue_offset = message.seq
    set_ms(system.invisible_duration, to.invisible_ms)
    # A delay message's claim was hidden once until its time (`consumers`): that was no delivery.
    system.delivery_attempt = max(1, claim.deliveries - 1) if kind == definition_pb2.DELAY else claim.deliveries
    return pb


def timestamp_now(ms: int) -> Timestamp:
    stamp = Timestamp()
    set_ms(stamp, ms)
    return stamp
