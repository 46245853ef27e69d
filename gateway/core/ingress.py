"""The protocol-neutral ingress API: what any protocol handler (MQTT, AMQP, RocketMQ) hands the node to publish.

A handler builds a `Message` with `neutral_message` from a topic, a payload and `Properties` (the neutral
property model, `store.properties`: MQTT 5's application properties, which AMQP basic properties and RocketMQ
system/user properties map onto), checks it with `refuse_publish`, and calls `Node.publish(message, sink,
token)`, or, when the node has publish hooks (`node.hooks` is not None), hands it to them
(`gateway.core.publish_hooks`), which call `Node.publish` once they let it through. The node appends it with
the next batch and, once the batch is durable, calls `sink.durable([token, ...])` once per sink per round (one
batched write of acks: MQTT PUBACKs, AMQP Basic.Ack multiple, RocketMQ responses), or `sink.failed(tokens,
reason)` if it will never be stored. `FutureSink` turns that into one future per publish.

The stored form of the properties is the store's block (`store.properties`: by design the content of an MQTT 5
property block, which MQTT subscribers get forwarded unchanged); other protocols decode it with
`Properties.from_block`. Nothing here knows a protocol's wire format.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from tidewire.errors import PublishFailed
from tidewire.gateway.core.sparkplug import CERTIFICATES as SPARKPLUG_SERVER
from tidewire.gateway.core.tenants import closed_to
from tidewire.store.base import PROTOCOL_MQTT, Message
from tidewire.store.properties import Properties

if TYPE_CHECKING:
    from tidewire.extensions.hooks import Authorizer, ClientInfo
    from tidewire.gateway.config import Settings

log = logging.getLogger("tidewire.ingress")


class DurableSink(Protocol):
    """Who hears that published messages are durable (or will never be)."""

    def durable(self, tokens: list[Any]) -> None:
        """These publishes are stored and synced, in publish order (one call per sink per sync round)."""

    def failed(self, tokens: list[Any], reason: str) -> None:
        """These publishes were not stored and never will be (the node is stopping with them unappended)."""

    def pause_publishes(self) -> None:
        """The node's append queue is full: stop taking publishes from this source until resumed."""

    def resume_publishes(self) -> None: ...


class FutureSink:
    """A sink whose tokens are futures: `publish_future` returns one that resolves once the message is durable."""

    __slots__ = ()

    def durable(self, tokens: list[Any]) -> None:
        for future in tokens:
            if not future.done():
                future.set_result(None)

    def failed(self, tokens: list[Any], reason: str) -> None:
        for future in tokens:
            if not future.done():
                future.set_exception(PublishFailed(reason))

    def pause_publishes(self) -> None:
        pass  # callers await their futures: they slow down by themselves

    def resume_publishes(self) -> None:
        pass


def neutral_message(topic: str, payload: bytes, *, qos: int = 1, retain: bool = False,
                    properties: Properties | None = None, publisher: str = "", now_ms: int,
                    protocol: int = PROTOCOL_MQTT) -> Message:
    """A message any handler can publish; `qos` 1 stands for durable (AMQP delivery-mode 2, RocketMQ)."""
    block = properties.to_block() if properties is not None else b""
    expiry = properties.expiry_interval if properties is not None else None
    return Message(topic, payload, qos, retain, block, now_ms, now_ms + expiry * 1000 if expiry else 0, publisher,
                   protocol=protocol)


INVALID_TOPIC = "invalid topic"
NOT_AUTHORIZED = "not authorized"


def invalid_topic(settings: Settings, topic: str) -> bool:
    """`topic` is no topic name a client may publish to: empty, wildcards, U+0000, over the configured levels or
    length (`refuse_publish`'s first test)."""
    if not topic or "+" in topic or "#" in topic or "\x00" in topic or topic.count("/") >= settings.max_topic_levels:
        return True
    limit = settings.max_topic_length
    return len(topic) > limit or (len(topic) * 4 > limit and len(topic.encode()) > limit)


def refuse_publish(settings: Settings, authorizer: Authorizer, client: ClientInfo, topic: str) -> str | None:
    """Why `client` may not publish to `topic`: `INVALID_TOPIC` (empty, wildcards, over the configured levels
    or length: `invalid_topic`), `NOT_AUTHORIZED` (`$SYS` but its own bridge state, the tenants' `$tenant/` space
    but to a default-tenant superuser, the Sparkplug Aware server's `$sparkplug/certificates/`, or the ACL); None:
    it may. A tenant client's `topic` is as it wrote it."""
    if invalid_topic(settings, topic):
        return INVALID_TOPIC
    if topic[0] == "$":
        if topic.startswith("$SYS") and not speaks_for_itself(client, topic):
            return NOT_AUTHORIZED
        if closed_to(client, topic):
            return NOT_AUTHORIZED  # the tenants' space (gateway.core.tenants): a default-tenant superuser's only
        if topic.startswith(SPARKPLUG_SERVER) and settings.sparkplug_aware:  # the server's (gateway.core.sparkplug)
            return NOT_AUTHORIZED
    if not authorizer.allow_publish(client, topic):
        return NOT_AUTHORIZED
    return None


def speaks_for_itself(client: ClientInfo, topic: str) -> bool:
    """The one `$SYS` topic a client may write (the ACL still applies): its own bridge state,
    `$SYS/broker/connection/<its client id>/state`, which a Mosquitto bridge (or Tidewire's) publishes and
    leaves as its will by default (its `notifications`). Any other `$SYS` topic is the broker's own."""
    return topic == f"$SYS/broker/connection/{client.client_id}/state"


def tell_sinks(acks: list[tuple[DurableSink, Any]], reason: str = "") -> None:
    """One call per sink with its tokens in order: `durable`, or `failed` when a `reason` is given."""
    per_sink: dict[DurableSink, list[Any]] = {}
    for sink, token in acks:
        tokens = per_sink.get(sink)
        if tokens is None:
            per_sink[sink] = [token]
        else:
            tokens.append(token)
    for sink, tokens in per_sink.items():
        try:
            if reason:
                sink.failed(tokens, reason)
            else:
                sink.durable(tokens)
        except Exception:  # one handler's bug must not keep the others' acks back
            log.exception("publish.ack_failed")


def publish_future(node_publish: Any, messages: Sequence[Message]) -> list[asyncio.Future[None]]:
    """Publish `messages` through `node_publish` (Node.publish); one future each, resolved when durable."""
    loop = asyncio.get_running_loop()
    sink = _FUTURES
    futures: list[asyncio.Future[None]] = []
    for message in messages:
        future: asyncio.Future[None] = loop.create_future()
        node_publish(message, sink, future)
        futures.append(future)
    return futures


_FUTURES = FutureSink()  # stateless: one instance serves every caller
