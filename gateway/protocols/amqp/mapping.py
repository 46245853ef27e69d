"""AMQP names, routing keys and basic properties ↔ MQTT topics, filters and the neutral property model.

As RabbitMQ's MQTT plugin: `amq.topic` *is* the MQTT topic space; a routing key maps to a topic by swapping
`.` and `/` (`*` ↔ `+`, `#` ↔ `#` in binding keys). Every other exchange has a namespace of its own that MQTT
`#` subscribers do not see (a `$` topic):

- a topic exchange E: `$exchange/E/<mapped key>`; a direct or headers exchange E: `$exchange/E/<escaped key>`
  (a headers exchange's bindings are no topic filters: `routing` indexes what it routes into the queues);
  a fanout exchange E: `$exchange/E`;
- the default exchange "": `$queue/<escaped queue name>`, which every queue is bound to (an MQTT client may
  publish there to reach one queue).

Names and direct keys are escaped (`%`, `/`, `+`, `#`, U+0000 as `%XX`) so that they stay one level and never
read as wildcards; an exchange named `p2p` is escaped as well, since `<first>/p2p/<id>` topics are the MQTT
P2P form.

Properties: content-type ↔ content type, correlation-id ↔ correlation data, reply-to ↔ response topic (through
the key ↔ topic swap), headers ↔ user properties (values as strings, for MQTT and RocketMQ readers; the
table with its AMQP types travels as well, base64 in `x-amqp-headers` (split over several if long), and is what
an AMQP consumer gets back), expiration (ms) ↔ message expiry (s, rounded up), delivery-mode 2 ↔ QoS 1
(durable). The properties MQTT has no place for travel as user properties named `x-amqp-<name>` (message-id,
timestamp (epoch s), type, app-id, priority, user-id, content-encoding) and are restored on delivery to AMQP.
The `x-death` header (an array of tables, `dead_letters`) travels as JSON in `x-amqp-x-death`, which
dead-lettering updates, and comes back typed (count a long, time a timestamp), whether the gateway dead-lettered
the message or a client republished it with the header.
"""

from __future__ import annotations

import base64
import datetime
import json
import re
from typing import Any

from pamqp import commands

from tidewire.gateway.protocols.amqp.codec import decode_table, encode_table
from tidewire.store.base import Message
from tidewire.store.properties import Properties

AMQ_TOPIC = "amq.topic"
PREDECLARED = {AMQ_TOPIC: "topic", "amq.direct": "direct", "amq.fanout": "fanout"}
EXCHANGE_TYPES = frozenset({"topic", "direct", "fanout", "headers"})
QUEUE_PREFIX = "$queue/"
EXCHANGE_PREFIX = "$exchange/"
AMQP_PREFIX = "x-amqp-"  # user properties holding AMQP-only basic properties
TYPED_HEADERS = AMQP_PREFIX + "headers"  # the headers table with its types (base64 of its AMQP bytes)
_CHUNK = 49152  # base64 characters per `x-amqp-headers` user property (a multiple of 4, under 65535)
DEATHS = AMQP_PREFIX + "x-death"  # the user property holding the x-death header, as JSON
MAX_USER_STRING = 65535  # an MQTT UTF-8 string

# What pamqp-based clients accept in an exchange or queue name (they validate what they receive).
NAME = re.compile(r"^[a-zA-Z0-9\-_.:@#,/+ ]*$")
MAX_EXCHANGE_NAME = 127
MAX_QUEUE_NAME = 255

_ESCAPES = {"%": "%25", "/": "%2F", "+": "%2B", "#": "%23", "\x00": "%00"}
_SWAP = str.maketrans("./", "/.")


def escape(name: str) -> str:
    if not any(c in name for c in _ESCAPES):
        return name
    return "".join(_ESCAPES.get(c, c) for c in name)


def unescape(level: str) -> str:
    if "%" not in level:
        return level
    out: list[str] = []
    i = 0
    while i < len(level):
        c = level[i]
        if c == "%" and _hex(level[i + 1:i + 3]):
            out.append(chr(int(level[i + 1:i + 3], 16)))
            i += 3
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _hex(text: str) -> bool:
    return len(text) == 2 and all(c in "0123456789abcdefABCDEF" for c in text)


def _exchange_level(name: str) -> str:
    return "%70" + name[1:] if name == "p2p" else escape(name)


def key_to_topic(key: str) -> str:
    return key.translate(_SWAP)


def topic_to_key(topic: str) -> str:
    return topic.translate(_SWAP)


def binding_to_filter(key: str) -> str | None:
    """A topic binding key as an MQTT filter; None when MQTT cannot express it (`#` not last, `*` in a word)."""
    words = key.split(".")
    levels: list[str] = []
    for i, word in enumerate(words):
        if word == "*":
            levels.append("+")
        elif word == "#":
            if i != len(words) - 1:
                return None
            levels.append("#")
        elif "*" in word or "#" in word or "+" in word:
            return None
        else:
            levels.append(word.replace("/", "."))
    return "/".join(levels)


def queue_topic(queue: str) -> str:
    return QUEUE_PREFIX + escape(queue)


def publish_topic(exchange: str, kind: str, key: str) -> str:
    """The topic a publish to `exchange` (of type `kind`) with routing key `key` is stored under."""
    if exchange == "":
        return queue_topic(key)
    if exchange == AMQ_TOPIC:
        return key_to_topic(key)
    base = EXCHANGE_PREFIX + _exchange_level(exchange)
    if kind == "fanout":
        return base
    if kind == "direct" or kind == "headers":
        return base + "/" + escape(key)
    return base + "/" + key_to_topic(key)


def exchange_filter(exchange: str) -> str:
    """The topic filter of everything published to `exchange`."""
    return "#" if exchange == AMQ_TOPIC else EXCHANGE_PREFIX + _exchange_level(exchange) + "/#"


def binding_filter(exchange: str, kind: str, key: str) -> str | None:
    """The topic filter a binding of `key` to `exchange` stands for (None: not expressible). A headers
    exchange's binding reads all it may route (the key plays no part): what an ACL checks, never a queue's
    filter."""
    if exchange == AMQ_TOPIC:
        return binding_to_filter(key)
    base = EXCHANGE_PREFIX + _exchange_level(exchange)
    if kind == "fanout":
        return base
    if kind == "headers":
        return exchange_filter(exchange)
    if kind == "direct":
        return base + "/" + escape(key)
    mapped = binding_to_filter(key)
    return None if mapped is None else base + "/" + mapped


def origin(topic: str, kinds: dict[str, str]) -> tuple[str, str]:
    """(exchange, routing key) of a stored message, for Basic.Deliver / Get-Ok. `kinds`: known exchange types
    (an unknown one reads as direct). A fanout exchange's messages come back with an empty routing key."""
    if topic.startswith(QUEUE_PREFIX):
        return "", _shortstr_cut(unescape(topic[len(QUEUE_PREFIX):]))
    if topic.startswith(EXCHANGE_PREFIX):
        level, sep, rest = topic[len(EXCHANGE_PREFIX):].partition("/")
        name = unescape(level)
        if len(name) > MAX_EXCHANGE_NAME or not NAME.fullmatch(name):
            return AMQ_TOPIC, _shortstr_cut(topic_to_key(topic))  # published by MQTT: no AMQP exchange of that name
        if not sep:
            return _shortstr_cut(name), ""
        key = topic_to_key(rest) if kinds.get(name) == "topic" else unescape(rest)
        return _shortstr_cut(name), _shortstr_cut(key)
    return AMQ_TOPIC, _shortstr_cut(topic_to_key(topic))


def _shortstr_cut(text: str) -> str:
    raw = text.encode()
    return text if len(raw) <= 255 else raw[:255].decode("utf-8", "ignore")


def _shortstr(text: str) -> str | None:
    return text if len(text.encode()) <= 255 else None


# --- properties --------------------------------------------------------------------------------------------
def _stringify(value: Any) -> str:
    if isinstance(value, str):
        text = value
    elif isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, bytes | bytearray):
        text = bytes(value).decode("utf-8", "replace")
    elif isinstance(value, datetime.datetime):
        text = str(int(value.timestamp()))
    elif value is None:
        text = ""
    elif isinstance(value, dict | list):
        text = json.dumps(value, default=str, separators=(",", ":"))
    else:
        text = str(value)
    return text.replace("\x00", "")


def properties_in(props: commands.Basic.Properties | None, username: str | None) -> tuple[Properties, int] | str:
    """The neutral properties and QoS of a published message, or why it is refused (a 406 text)."""
    out = Properties()
    if props is None:
        return out, 0
    user = out.user
    if props.content_type:
        out.content_type = props.content_type
    if props.correlation_id:
        out.correlation_data = props.correlation_id.encode()
    if props.reply_to:
        out.response_topic = key_to_topic(props.reply_to)
    if props.expiration is not None and props.expiration != "":
        text = str(props.expiration)
        if not text.isdigit() or len(text) > 10:
            return f"invalid expiration '{text[:20]}'"
        out.expiry_interval = max(1, (int(text) + 999) // 1000)
    if props.user_id and username is not None and props.user_id != username:
        return f"user_id property set to '{props.user_id[:40]}' but authenticated user was '{username}'"
    for name, value in (("message-id", props.message_id), ("type", props.message_type), ("app-id", props.app_id),
                        ("user-id", props.user_id), ("content-encoding", props.content_encoding),
                        ("priority", props.priority), ("timestamp", props.timestamp)):
        if value is not None and value != "":
            user.append((AMQP_PREFIX + name, _stringify(value)))
    headers = props.headers
    if isinstance(headers, dict) and headers:
        for key, raw in headers.items():
            if key == "x-death" and isinstance(raw, list):
                user.append((DEATHS, encode_deaths(raw)))
                continue
            pair = (_stringify(key), _stringify(raw))
            if len(pair[0].encode()) > MAX_USER_STRING or len(pair[1].encode()) > MAX_USER_STRING:
                return f"header '{pair[0][:40]}' longer than {MAX_USER_STRING} bytes"
            user.append(pair)
        table = encode_table({k: v for k, v in headers.items() if not (k == "x-death" and isinstance(v, list))})
        if table is not None:  # (a non-UTF-8 longstr, which pamqp cannot write back: strings only)
            text = base64.b64encode(table).decode()
            user.extend((TYPED_HEADERS, text[i:i + _CHUNK]) for i in range(0, len(text), _CHUNK))
    return out, 1 if props.delivery_mode == 2 else 0


def properties_out(message: Message, now_ms: int) -> commands.Basic.Properties:
    """Basic properties of a stored message (from any protocol) delivered to an AMQP consumer."""
    props = Properties.from_block(message.properties, message.expires_at_ms, now_ms)
    out = commands.Basic.Properties(delivery_mode=2 if message.qos else 1)
    if props.content_type is not None:
        out.content_type = _shortstr(props.content_type)
    if props.correlation_data is not None:
        out.correlation_id = _shortstr(props.correlation_data.decode("utf-8", "replace"))
    if props.response_topic is not None:
        out.reply_to = _shortstr(topic_to_key(props.response_topic))
    if props.expiry_interval is not None:
        out.expiration = str(props.expiry_interval * 1000)
    headers: dict[str, Any] = {}
    typed: list[str] = []
    deaths: list[dict[str, Any]] | None = None
    for key, value in props.user:
        if key == TYPED_HEADERS:
            typed.append(value)
        elif key == DEATHS:
            deaths = decode_deaths(value)
        elif key.startswith(AMQP_PREFIX):
            _restore(out, key[len(AMQP_PREFIX):], value)
        elif len(key.encode()) <= 128:  # a field table key is a shortstr, and pamqp cuts keys over 128 bytes
            headers[key] = value
    if typed:
        # The AMQP publisher's table, types and all; a user property added since (an MQTT rule) as a string.
        table = _typed_table("".join(typed))
        if table is not None:
            headers = {**{k: v for k, v in headers.items() if k not in table}, **table}
    if deaths is not None:
        headers["x-death"] = deaths
    if headers:
        out.headers = headers
    return out


def _typed_table(text: str) -> dict[str, Any] | None:
    try:
        raw = base64.b64decode(text, validate=True)
    except ValueError:
        return None
    return decode_table(raw)
def encode_deaths(deaths: list[Any]) -> str:
    """The x-death header as stored: JSON, times as epoch seconds, byte strings as text."""
    entries: list[dict[str, Any]] = []
    for entry in deaths:
        if isinstance(entry, dict):
            entries.append({_stringify(k): _plain(v) for k, v in entry.items()})
    return json.dumps(entries, separators=(",", ":"))


def _plain(value: Any) -> Any:
    if isinstance(value, datetime.datetime):
        return int(value.timestamp())
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, bool | int | float | str) or value is None:
        return value
    return _stringify(value)


def decode_deaths(text: str) -> list[dict[str, Any]]:
    """The stored x-death header as AMQP gives it: `time` a timestamp, the rest as they were."""
    try:
        entries = json.loads(text)
    except ValueError:
        return []
    out: list[dict[str, Any]] = []
    for entry in entries if isinstance(entries, list) else ():
        if isinstance(entry, dict):
            if isinstance(entry.get("time"), int):
                entry["time"] = datetime.datetime.fromtimestamp(entry["time"], datetime.UTC)
            out.append(entry)
    return out


def _restore(out: commands.Basic.Properties, name: str, value: str) -> None:
    if name == "priority" or name == "timestamp":
        if not value.isdigit() or len(value) > 12:
            return
        if name == "priority":
            out.priority = min(int(value), 255)
        else:
            out.timestamp = datetime.datetime.fromtimestamp(int(value), datetime.UTC)
        return
    text = _shortstr(value)
    if name == "message-id":
        out.message_id = text
    elif name == "type":
        out.message_type = text
    elif name == "app-id":
        out.app_id = text
    elif name == "user-id":
        out.user_id = text
    elif name == "content-encoding":
        out.content_encoding = text
