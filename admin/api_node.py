"""Admin API about the node itself, one job: its status, the cluster's nodes, its listeners, its effective
configuration (secrets masked) and the counters the dashboard draws (`/api/v1/status|nodes|listeners|config|
stats`)."""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import re
from collections import Counter
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends

from tidewire.admin.app import API_PREFIX, Endpoints, endpoints, require_token
from tidewire.admin.models import (
    ClusterMember,
    ClusterState,
    ListenerEntry,
    Listing,
    NodeEntry,
    Stats,
    Status,
    TopTopic,
)
from tidewire.gateway.config import Settings
from tidewire.gateway.node import Node
from tidewire.store.base import P2P_PREFIX

MASK = "******"
TOP_TOPICS = 10
_SECRET_WORDS = ("secret", "token", "password")
# Settings whose names contain a secret word but hold no secret: where one is kept, or how one is checked.
_NOT_SECRET_SUFFIXES = ("_file", "_threads", "_iterations")
_URL_PASSWORD = re.compile(r"(://[^:/@\s]*:)[^@/\s]*@")  # scheme://user:PASSWORD@host


Found = Annotated[Endpoints, Depends(endpoints)]


def version() -> str:
    try:
        return importlib.metadata.version("tidewire")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def redacted_config(settings: Settings) -> dict[str, Any]:
    """The effective settings as JSON values; secrets, header values and passwords in URLs masked, also inside
    nested settings (a bridge's `remote_password`)."""
    return _redacted(settings.model_dump(mode="json"))


def _redacted(values: dict[str, Any]) -> dict[str, Any]:
    for name, value in values.items():
        if any(word in name for word in _SECRET_WORDS) and not name.endswith(_NOT_SECRET_SUFFIXES):
            if value not in (None, "", [], {}):
                values[name] = MASK
        elif name == "http_auth_headers" and isinstance(value, dict):
            values[name] = {header: MASK for header in value}
        elif isinstance(value, str):
            values[name] = _URL_PASSWORD.sub(rf"\g<1>{MASK}@", value)
        elif isinstance(value, dict):
            values[name] = _redacted(value)
        elif isinstance(value, list):
            values[name] = [_redacted(item) if isinstance(item, dict) else item for item in value]
    return values


def store_kind(settings: Settings) -> str:
    return settings.store.split("://", 1)[0] if "://" in settings.store else settings.store


def subscription_count(node: Node) -> int:
    return sum(1 for conn in node.connections.values() if conn.session is not None
               for topic in conn.session.subscriptions if not topic.startswith(P2P_PREFIX))


def other_connections(found: Endpoints) -> int:
    """Connections of the other protocols (AMQP) on this node."""
    amqp = found.amqp
    return sum(len(live) for live in amqp.connections.values()) if amqp is not None else 0


def _top_topics_source() -> Callable[[Node, int], Any] | None:
    """`admin.metrics.top_topics(node, n)` once the metrics module provides it."""
    if importlib.util.find_spec("tidewire.admin.metrics") is None:
        return None
    metrics = importlib.import_module("tidewire.admin.metrics")
    source: Callable[[Node, int], Any] | None = getattr(metrics, "top_topics", None)
    return source


def _top_topic(entry: Any) -> TopTopic:
    """An entry of `top_topics`: a (topic, messages) pair or a {"topic", "messages"} mapping."""
    if isinstance(entry, dict):
        return TopTopic(topic=str(entry["topic"]), messages=int(entry["messages"]))
    topic, messages = entry
    return TopTopic(topic=str(topic), messages=int(messages))


def router(node: Node) -> APIRouter:
    api = APIRouter(prefix=API_PREFIX, dependencies=[Depends(require_token)], tags=["node"])
    settings = node.settings
    top_topics = _top_topics_source()

    @api.get("/status", response_model=Status)
    async def status(found: Found) -> Status:
        counters = node.counters
        cluster: ClusterState | None = None
        topology = node.topology
        if topology.shared:
            cluster = ClusterState(members=[ClusterMember(node_id=n, address=a)
                                            for n, a in sorted(topology.members.items())],
                                   epoch=int(topology.stats().get("epoch", 0)))
        uptime_s = round(node.clock.time() - node.sys.started_at, 3)
        return Status(node_id=node.node_id, version=version(), uptime_s=uptime_s, store=store_kind(settings),
                      draining=node.draining, connections=len(node.connections) + other_connections(found),
                      sessions_online=len(node.connections), subscriptions=subscription_count(node),
                      messages_in=counters.messages_in, messages_out=counters.messages_out,
                      bytes_in=counters.bytes_in, bytes_out=counters.bytes_out, dropped=counters.dropped,
                      cluster=cluster)

    @api.get("/nodes", response_model=Listing[NodeEntry])
    async def nodes() -> Listing[NodeEntry]:
        members: dict[str, str] = dict(node.topology.members)
        members.setdefault(node.node_id, f"{settings.host}:{settings.port}")
        return Listing[NodeEntry](data=[NodeEntry(node_id=n, address=a, self_=n == node.node_id)
                                        for n, a in sorted(members.items())])

    @api.get("/listeners", response_model=Listing[ListenerEntry])
    async def listeners(found: Found) -> Listing[ListenerEntry]:
        mqtt: Counter[str] = Counter(conn.listener.name for conn in node.connections.values())
        entries: list[ListenerEntry] = []
        for spec in found.listeners:
            count: int | None
            if spec.name in ("amqp", "amqps"):
                count = len(found.amqp.connections.get(spec.name, ())) if found.amqp is not None else 0
            elif spec.name == "rocketmq":
                count = None  # gRPC: clients hold streams, not connections the node counts
            else:
                count = mqtt[spec.name]
            entries.append(ListenerEntry(name=spec.name, protocol=spec.name, host=spec.host, port=spec.port,
                                         connections=count, max_connections=spec.max_connections))
        return Listing[ListenerEntry](data=entries)

    @api.get("/config")
    async def config() -> dict[str, Any]:
        return redacted_config(settings)

    @api.get("/stats", response_model=Stats)
    async def stats(found: Found) -> Stats:
        counters = node.counters
        top = top_topics(node, TOP_TOPICS) if top_topics is not None else []
        return Stats(time=node.clock.time(), connections=len(node.connections) + other_connections(found),
                     messages_in=counters.messages_in, messages_out=counters.messages_out,
                     bytes_in=counters.bytes_in, bytes_out=counters.bytes_out, dropped=counters.dropped,
                     top_topics=[_top_topic(entry) for entry in top])

    return api
