"""Where a rule's results go: each action is a `Sink` (`extensions/plugins.py`), as an operator's sink plugin is.
Back into the log (an MQTT topic, an AMQP exchange, a RocketMQ topic, a bridge's remote topic: one log, so each is
a topic and a protocol tag), to an HTTP webhook, or to a sink plugin. A sink returns once delivered, raises
`SinkRefused` when retrying cannot help, anything else to be tried again; the rule engine
(`bridges/rules/engine.py`) settles, retries or dead-letters."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from tidewire.bridges.mqtt.settings import BridgeSettings
from tidewire.bridges.rules.http import Endpoint
from tidewire.bridges.rules.settings import (
    AmqpAction,
    BridgeAction,
    RepublishAction,
    RocketMQAction,
    RuleSettings,
    SinkAction,
    WebhookAction,
    render,
)
from tidewire.errors import TidewireError
from tidewire.extensions.plugins import SINK_GROUP, PluginCatalog, Sink, SinkRefused
from tidewire.gateway.core.ingress import publish_future
from tidewire.store.base import PROTOCOL_AMQP, PROTOCOL_MQTT, PROTOCOL_ROCKETMQ, Message
from tidewire.store.properties import Properties

if TYPE_CHECKING:
    from tidewire.bridges.host import NodeHost

RETRYABLE_STATUS = frozenset({408, 429})  # besides every 5xx: the endpoint asks to be tried again
SIGNATURE_HEADER = "X-Tidewire-Signature"
TIMESTAMP_HEADER = "X-Tidewire-Timestamp"


class DeliveryFailed(TidewireError):
    """A delivery that may succeed when tried again (what it says is the rule's `last_error`)."""


def _fields(message: Message, result: dict[str, Any]) -> dict[str, Any]:
    """What a template may name: the selected fields, then the message's topic and client id."""
    return {"topic": message.topic, "clientid": message.publisher, **result}


def _payload(template: str | None, fields: dict[str, Any], result: dict[str, Any]) -> bytes:
    if template is None:
        return json.dumps(result, separators=(",", ":"), default=str).encode()
    return render(template, fields).encode()


class Republish:
    """Into the log again, as the rule (`rule:<name>` is the publisher): durable before `write` returns."""

    def __init__(self, settings: RuleSettings, host: NodeHost, publisher: str,
                 bridges: Mapping[str, BridgeSettings]) -> None:
        action = settings.action
        assert isinstance(action, RepublishAction | AmqpAction | RocketMQAction | BridgeAction)
        self.action = action
        self.host = host
        self.publisher = publisher
        self.bridge = bridges.get(action.bridge) if isinstance(action, BridgeAction) else None

    def _stored(self, message: Message, result: dict[str, Any], now_ms: int) -> Message:
        action = self.action
        fields = _fields(message, result)
        payload = _payload(action.payload, fields, result)
        if isinstance(action, RepublishAction):
            return Message(render(action.topic, fields), payload, action.qos, action.retain, b"", now_ms, 0,
                           self.publisher, protocol=PROTOCOL_MQTT)
        if isinstance(action, BridgeAction):
            remote = render(action.topic, fields)
            local = self.bridge.sent_as(remote) if self.bridge is not None else None
            if local is None:
                raise SinkRefused(f"bridge {action.bridge!r} sends nothing out as {remote!r}")
            return Message(local, payload, action.qos, action.retain, b"", now_ms, 0, self.publisher,
                           protocol=PROTOCOL_MQTT)
        if isinstance(action, AmqpAction):
            from tidewire.gateway.protocols.amqp.mapping import PREDECLARED, publish_topic

            topic = publish_topic(action.exchange, PREDECLARED.get(action.exchange, "topic"),
                                  render(action.routing_key, fields))
            return Message(topic, payload, 1, False, b"", now_ms, 0, self.publisher, protocol=PROTOCOL_AMQP)
        second = render(action.second_topic, fields).strip("/")
        block = Properties(user=[("TAGS", action.tag)]).to_block() if action.tag else b""
        return Message(action.topic + ("/" + second if second else ""), payload, 1, False, block, now_ms, 0,
                       self.publisher, protocol=PROTOCOL_ROCKETMQ)

    async def write(self, results: Sequence[dict[str, Any]], messages: Sequence[Message]) -> None:
        now_ms = int(self.host.clock.time() * 1000)
        stored = [self._stored(m, r, now_ms) for m, r in zip(messages, results, strict=True)]
        for message in stored:
            if not message.topic or "+" in message.topic or "#" in message.topic:
                raise SinkRefused(f"republish: invalid topic {message.topic!r}")
        try:
            await asyncio.gather(*publish_future(self.host.publish, stored))
        except Exception as exc:
            raise DeliveryFailed(f"republish: {exc}") from exc

    async def close(self) -> None:
        pass


class Webhook:
    """POST to an HTTP endpoint: one JSON object per request (batch_size 1) or an array; signed when a secret
    is set. 2xx: delivered; 5xx, 408, 429, a timeout or a connection error: retried; any other 4xx: permanent."""

    def __init__(self, settings: RuleSettings) -> None:
        action = settings.action
        assert isinstance(action, WebhookAction)
        self.action = action
        self.rule = settings.name
        self.endpoint = Endpoint(action.url, action.concurrency, action.timeout)

    def request(self, results: Sequence[dict[str, Any]], now: float) -> tuple[bytes, dict[str, str]]:
        """The body and headers of one request (signed with the secret, if any)."""
        body = json.dumps(results[0] if self.action.batch_size == 1 else list(results), separators=(",", ":"),
                          default=str).encode()
        headers = {"Content-Type": "application/json", "X-Tidewire-Rule": self.rule, **self.action.headers}
        if self.action.secret is not None:
            stamp = str(int(now))
            mac = hmac.new(self.action.secret.encode(), stamp.encode() + b"." + body, hashlib.sha256).hexdigest()
            headers[TIMESTAMP_HEADER] = stamp
            headers[SIGNATURE_HEADER] = f"sha256={mac}"
        return body, headers

    async def write(self, results: Sequence[dict[str, Any]], messages: Sequence[Message]) -> None:
        body, headers = self.request(results, time.time())
        try:
            status = await self.endpoint.post(body, headers)
        except OSError as exc:  # HttpError
            raise DeliveryFailed(f"webhook: {exc}") from exc
        if 200 <= status < 300:
            return
        if status >= 500 or status in RETRYABLE_STATUS:
            raise DeliveryFailed(f"webhook: HTTP {status}")
        raise SinkRefused(f"webhook: HTTP {status}")

    async def close(self) -> None:
        await self.endpoint.close()


def make_sink(settings: RuleSettings, host: NodeHost, publisher: str, bridges: Mapping[str, BridgeSettings],
              catalog: PluginCatalog) -> Sink:
    """The rule's sink; `bridges`: the node's configured bridges, by name (for a `bridge` action); `catalog`:
    where a `sink` action's plugin comes from (ConfigError for a name nothing provides)."""
    action = settings.action
    if isinstance(action, WebhookAction):
        return Webhook(settings)
    if isinstance(action, SinkAction):
        return cast(Sink, catalog.create(SINK_GROUP, action.sink, action.options))  # it has the group's methods
    return Republish(settings, host, publisher, bridges)
