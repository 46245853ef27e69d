"""The admin API's request and response shapes (pydantic models: validation and the OpenAPI schema) and its
paging, one job: what goes over the wire. Every limit of client input is explicit here."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Generic, Literal, TypeVar

from fastapi import Query
from pydantic import BaseModel, ConfigDict, Field

T = TypeVar("T")

MAX_PAGE_LIMIT = 1000
DEFAULT_PAGE_LIMIT = 100
MAX_PAGE = 1_000_000
MAX_TOPIC_CHARS = 65535  # the MQTT limit; the node's own `max_topic_length` is checked as well
MAX_PROPERTY_CHARS = 65535
MAX_USER_PROPERTIES = 256


class Meta(BaseModel):
    page: int
    limit: int
    count: int = Field(description="how many entries match in all (every page)")


class Page(BaseModel, Generic[T]):
    data: list[T]
    meta: Meta


class Listing(BaseModel, Generic[T]):
    """A list that is never paged (it is short: nodes, listeners, one client's subscriptions)."""

    data: list[T]


@dataclass(frozen=True, slots=True)
class Paging:
    page: int
    limit: int

    def cut(self, items: Sequence[T]) -> tuple[list[T], Meta]:
        start = (self.page - 1) * self.limit
        return list(items[start:start + self.limit]), Meta(page=self.page, limit=self.limit, count=len(items))


def paging(page: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 1,
           limit: Annotated[int, Query(ge=1, le=MAX_PAGE_LIMIT)] = DEFAULT_PAGE_LIMIT) -> Paging:
    """`?page=&limit=` (a dependency): out of range is a 422."""
    return Paging(page, limit)


# --- requests ----------------------------------------------------------------------------------------------
class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt field is an error, not silently ignored


class PublishProperties(_Strict):
    content_type: str | None = Field(None, max_length=MAX_PROPERTY_CHARS)
    message_expiry_interval: int | None = Field(None, ge=1, le=0xFFFFFFFF, description="seconds")
    user_properties: dict[str, str] | None = Field(None, max_length=MAX_USER_PROPERTIES)


class PublishRequest(_Strict):
    topic: str = Field(max_length=MAX_TOPIC_CHARS)
    payload: str = Field("", description="the payload: text, or base64 with encoding=base64")
    encoding: Literal["plain", "base64"] = "plain"
    qos: Literal[0, 1, 2] = 0
    retain: bool = False
    properties: PublishProperties | None = None


class PublishResult(BaseModel):
    topic: str


class SubscriptionAdd(_Strict):
    topic: str = Field(max_length=MAX_TOPIC_CHARS, description="a topic filter, `$share/<group>/<filter>` too")
    qos: Literal[0, 1, 2] = 0
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: Literal[0, 1, 2] = 0


# --- answers -------------------------------------------------------------------------------------------------
class Client(BaseModel):
    client_id: str
    username: str | None
    peer: str
    listener: str
    protocol: str = Field(description="mqtt, amqp")
    proto_ver: int | None = Field(description="MQTT protocol level: 3, 4 (3.1.1) or 5; null for AMQP")
    bridge: bool = Field(False, description="another broker's bridge (its messages are stored as protocol bridge)")
    clean_start: bool | None
    keepalive: int | None
    connected_at: float | None = Field(description="epoch seconds")
    subscriptions: int
    inflight: int
    node: str


class Subscription(BaseModel):
    topic: str
    qos: int
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0


class ClientDetail(Client):
    subscriptions_list: list[Subscription]


class NodeSubscription(BaseModel):
    client_id: str
    topic: str
    qos: int


class Session(BaseModel):
    client_id: str
    online: bool
    node: str | None = Field(description="the node that holds it (online) or held it last")
    persistent: bool
    protocol_level: int
    expiry_interval: int = Field(description="seconds it lives disconnected (4294967295: forever)")
    disconnected_at: float | None = Field(description="epoch seconds; null while online")
    subscriptions: list[Subscription]
    offset: int
    sent_upto: int
    inflight: int | None = Field(description="unacknowledged outbound messages (online here only)")


class Retained(BaseModel):
    topic: str
    qos: int
    payload_size: int
    payload: str | None = Field(description="base64; null in a list when over 64 KiB (GET the topic)")
    published_at: float = Field(description="epoch seconds")
    expires_at: float | None = None


class ClusterMember(BaseModel):
    node_id: str
    address: str


class ClusterState(BaseModel):
    members: list[ClusterMember]
    epoch: int


class Status(BaseModel):
    node_id: str
    version: str
    uptime_s: float
    store: str
    draining: bool
    connections: int
    sessions_online: int
    subscriptions: int
    messages_in: int
    messages_out: int
    bytes_in: int
    bytes_out: int
    dropped: int
    cluster: ClusterState | None


class NodeEntry(BaseModel):
    node_id: str
    address: str
    self_: bool = Field(alias="self", serialization_alias="self")

    model_config = ConfigDict(populate_by_name=True)


class ListenerEntry(BaseModel):
    name: str
    protocol: str = Field(description="mqtt, mqtts, ws, wss, amqp, amqps, rocketmq")
    host: str
    port: int
    connections: int | None = Field(description="null where the protocol has no connection count (rocketmq)")
    max_connections: int | None


class TopTopic(BaseModel):
    topic: str
    messages: int


class Stats(BaseModel):
    time: float
    connections: int
    messages_in: int
    messages_out: int
    bytes_in: int
    bytes_out: int
    dropped: int
    top_topics: list[TopTopic]
