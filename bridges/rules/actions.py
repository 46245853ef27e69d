"""Where a rule's results go: back into the log (an MQTT topic, an AMQP exchange, a RocketMQ topic: one log, so
each is a topic and a protocol tag) or to an HTTP webhook. An action delivers a batch and says how it went; the
rule engine (`bridges/rules/engine.py`) settles, retries or dead-letters."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from tidewire.bridges.mqtt.settings import BridgeSettings
from tidewire.bridges.rules.http import Endpoint, HttpError
from tidewire.bridges.rules.settings import (
    AmqpAction,
    BridgeAction,
    RepublishAction,
    RocketMQAction,
    RuleSettings,
    WebhookAction,
    render,
)
from tidewire.gateway.core.ingress import publish_future
from tidewire.store.base import PROTOCOL_AMQP, PROTOCOL_MQTT, PROTOCOL_ROCKETMQ, Message
from tidewire.store.properties import Properties

if TYPE_CHECKING:
    from tidewire.bridges.host import NodeHost

RETRYABLE_STATUS = frozenset({408, 429})  # besides every 5xx: the endpoint asks to be tried again
SIGNATURE_HEADER = "X-Tidewire-Signature"
TIMESTAMP_HEADER = "X-Tidewire-Timestamp"


@dataclass(frozen=True, slots=True)
class ActionResult:
    ok: bool
    error: str = ""
    permanent: bool = False  # retrying cannot help (HTTP 4xx): dead-letter at once


OK = ActionResult(True)


class RuleAction(Protocol):
    batch_size: int  # results per delivery at most
    concurrency: int  # deliveries under way at once at most
    max_retries: int

    async def deliver(self, messages: list[Message], results: list[dict[str, Any]]) -> ActionResult:
        """Deliver one batch (the rule's results and the messages they came from)."""

    async def close(self) -> None: ...


def _fields(message: Message, result: dict[str, Any]) -> dict[str, Any]:
    """What a template may name: the selected fields, then the message's topic and client id."""
    return {"topic": message.topic, "clientid": message.publisher, **result}


def _payload(template: str | None, fields: dict[str, Any], result: dict[str, Any]) -> bytes:
    if template is None:
        return json.dumps(result, separators=(",", ":"), default=str).encode()
    return render(template, fields).encode()


class Republish:
    """Into the log again, as the rule (`rule:<name>` is the publisher): durable before the batch is settled."""

    def __init__(self, settings: RuleSettings, host: NodeHost, publisher: str,
                 bridges: Mapping[str, BridgeSettings]) -> None:
        action = settings.action
        assert isinstance(action, RepublishAction | AmqpAction | RocketMQAction | BridgeAction)
        self.action = action
        self.bridge = bridges.get(action.bridge) if isinstance(action, BridgeAction) else None
        self.host = host
        self.publisher = publisher
        self.batch_size = 100
        self.concurrency = 1  # a publish is cheap: one batch at a time keeps the results in order
        self.max_retries = action.max_retries

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
                raise ValueError(f"bridge {action.bridge!r} sends nothing out as {remote!r}")
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

    async def deliver(self, messages: list[Message], results: list[dict[str, Any]]) -> ActionResult:
        now_ms = int(self.host.clock.time() * 1000)
        try:
            stored = [self._stored(m, r, now_ms) for m, r in zip(messages, results, strict=True)]
        except ValueError as exc:  # a template made no valid topic
            return ActionResult(False, f"republish: {exc}", permanent=True)
        for message in stored:
            if not message.topic or "+" in message.topic or "#" in message.topic:
                return ActionResult(False, f"republish: invalid topic {message.topic!r}", permanent=True)
        try:
            await asyncio.gather(*publish_future(self.host.publish, stored))
        except Exception as exc:
            return ActionResult(False, f"republish: {exc}")
        return OK

    async def close(self) -> None:
        pass


class Webhook:
    """POST to an HTTP endpoint: one JSON object per request (batch_size 1) or an array; signed when a secret
    is set. 2xx: delivered; 5xx, 408, 429, a timeout or a connection error: retried; any other 4xx: permanent."""

    def __init__(self, settings: RuleSettings, host: NodeHost) -> None:
        action = settings.action
        assert isinstance(action, WebhookAction)
        self.action = action
        self.rule = settings.name
        self.batch_size = action.batch_size
        self.concurrency = action.concurrency
        self.max_retries = action.max_retries
        self.endpoint = Endpoint(action.url, action.concurrency, action.timeout)

    def request(self, results: list[dict[str, Any]], now: float) -> tuple[bytes, dict[str, str]]:
        """The body and headers of one request (signed with the secret, if any)."""
        body = json.dumps(results[0] if self.batch_size == 1 else results, separators=(",", ":"),
                          default=str).encode()
        headers = {"Content-Type": "application/json", "X-Tidewire-Rule": self.rule, **self.action.headers}
        if self.action.secret is not None:
            stamp = str(int(now))
            mac = hmac.new(self.action.secret.encode(), stamp.encode() + b"." + body, hashlib.sha256).hexdigest()
            headers[TIMESTAMP_HEADER] = stamp
            headers[SIGNATURE_HEADER] = f"sha256={mac}"
        return body, headers

    async def deliver(self, messages: list[Message], results: list[dict[str, Any]]) -> ActionResult:
        body, headers = self.request(results, time.time())
        try:
            status = await self.endpoint.post(body, headers)
        except HttpError as exc:
            return ActionResult(False, f"webhook: {exc}")
        if 200 <= status < 300:
            return OK
        retryable = status >= 500 or status in RETRYABLE_STATUS
        return ActionResult(False, f"webhook: HTTP {status}", permanent=not retryable)

    async def close(self) -> None:
        await self.endpoint.close()


def make_action(settings: RuleSettings, host: NodeHost, publisher: str,
                bridges: Mapping[str, BridgeSettings]) -> RuleAction:
    """The rule's action; `bridges`: the node's configured bridges, by name (for a `bridge` action)."""
    if settings.action.type == "webhook":
        return Webhook(settings, host)
    return Republish(settings, host, publisher, bridges)
