"""What a rule is, as configured (`[[rules]]` tables) or made through the admin API: its statement (EMQX's
`SELECT ... FROM "filter" WHERE ...`, `bridges/rules/sql.py`) and the action its results go to, with the action's
delivery policy (batching, retries with backoff, the dead-letter topic)."""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, field_validator

NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
TEMPLATE_FIELD = re.compile(r"\$\{([A-Za-z0-9_.]+)\}")


class _Action(BaseModel):
    model_config = {"extra": "forbid"}

    batch_size: int = Field(100, ge=1, le=10_000, description="results per delivery at most (what has come while "
                            "one was under way goes in the next, up to this)")
    concurrency: int = Field(1, ge=1, le=64, description="deliveries under way at once at most (1: in order)")
    max_retries: int = Field(5, ge=0, le=100, description="attempts after the first before a result goes to the "
                             "dead-letter topic")
    retry_base: float = Field(1.0, gt=0, description="s before the first retry; doubled per retry up to retry_cap")
    retry_cap: float = Field(60.0, gt=0, description="s between retries at most")
    dead_letter_topic: str | None = Field(None, description="where a result that could not be delivered goes "
                                          "(default `$rules/<rule>/dead-letter`)")


class RepublishAction(_Action):
    """Publish the result into the log again: to an MQTT topic, an AMQP exchange or a RocketMQ topic (they are
    the same log, so each is a topic here)."""

    type: Literal["republish"] = "republish"
    topic: str = Field(description="topic template: `${field}` takes a selected field (or topic, clientid)")
    qos: int = Field(1, ge=0, le=2)
    retain: bool = False
    payload: str | None = Field(None, description="payload template; None: the selected fields as JSON")


class AmqpAction(_Action):
    """Publish the result to an AMQP exchange, as an AMQP client's Basic.Publish would be stored."""

    type: Literal["amqp"] = "amqp"
    exchange: str = Field("amq.topic", description="a declared exchange, or amq.topic / amq.direct / amq.fanout")
    routing_key: str = Field(description="routing key template")
    payload: str | None = None


class RocketMQAction(_Action):
    """Publish the result to a RocketMQ topic (an MQTT first level), with an optional tag."""

    type: Literal["rocketmq"] = "rocketmq"
    topic: str = Field(description="RocketMQ topic")
    second_topic: str = Field("", description="template of the MQTT levels below the RocketMQ topic")
    tag: str | None = None
    payload: str | None = None


class WebhookAction(_Action):
    """POST the results to an HTTP endpoint: JSON, one object (batch_size 1) or an array, signed with HMAC."""

    type: Literal["webhook"] = "webhook"
    url: str = Field(description="http:// or https:// URL")
    headers: dict[str, str] = Field(default_factory=dict)
    secret: str | None = Field(None, description="HMAC-SHA256 key: `X-Tidewire-Signature: sha256=<hex of "
                               "HMAC(secret, timestamp + '.' + body)>` with `X-Tidewire-Timestamp`")
    batch_size: int = Field(1, ge=1, le=10_000, description="results per request at most (1: one JSON object "
                            "per request; more: an array)")
    concurrency: int = Field(4, ge=1, le=64, description="requests under way at once at most (1: in order)")
    timeout: float = Field(5.0, gt=0, description="s per request")

    @field_validator("url")
    @classmethod
    def _http(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("a webhook URL starts with http:// or https://")
        return value


class BridgeAction(_Action):
    """Send the result over a configured MQTT bridge, to a topic on its remote: it is published here on the local
    topic the bridge's `out` topics send as that remote topic, and goes out from the log as all the bridge carries."""

    type: Literal["bridge"] = "bridge"
    bridge: str = Field(description="a configured bridge's name")
    topic: str = Field(description="template of the topic on the remote (an out topic of the bridge must carry it)")
    qos: int = Field(1, ge=0, le=2)
    retain: bool = False
    payload: str | None = None


class SinkAction(_Action):
    """Hand the results to an operator's sink plugin (entry point group `tidewire.sinks`, docs/plugins.md)."""

    type: Literal["sink"] = "sink"
    sink: str = Field(description="the sink's entry point name")
    options: dict[str, Any] = Field(default_factory=dict, description="what its factory is called with")
    timeout: float = Field(10.0, gt=0, description="s a write may take; later counts as a failure (retried)")


Action = Annotated[RepublishAction | AmqpAction | RocketMQAction | BridgeAction | WebhookAction | SinkAction,
                   Field(discriminator="type")]


class RuleSettings(BaseModel):
    """One rule: its statement and its action."""

    model_config = {"extra": "forbid"}

    name: str = Field(description="unique, [A-Za-z0-9_.-]{1,64}")
    sql: str = Field(description='SELECT <fields> FROM "<filter>"[, ...] [WHERE <condition>]')
    action: Action
    enabled: bool = True
    description: str = ""

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not NAME.match(value):
            raise ValueError("a rule name is 1 to 64 of A-Z a-z 0-9 _ . -")
        return value

    @property
    def dead_letter_topic(self) -> str:
        return self.action.dead_letter_topic or f"$rules/{self.name}/dead-letter"


def render(template: str, fields: dict[str, object]) -> str:
    """`${name}` replaced by the field's value (text as is, anything else as JSON); an unknown name by ''."""

    def value(match: re.Match[str]) -> str:
        got = fields.get(match.group(1))
        if got is None:
            return ""
        return got if isinstance(got, str) else json.dumps(got, separators=(",", ":"))

    return TEMPLATE_FIELD.sub(value, template)
