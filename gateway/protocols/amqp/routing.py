"""Routing beyond topic filters: headers exchanges, exchange-to-exchange bindings and alternate exchanges.

A queue bound to a topic, direct or fanout exchange reads that binding's topic filter: the store indexes each
message into it when appended, nothing is decided at publish. What filters cannot say is decided here, at
publish, as RabbitMQ's `rabbit_exchange:route` does: from the exchange published to, every binding that matches
(a headers binding by the message's typed headers, any other by its topic filter) leads to a queue or to
another exchange, routed in turn; an exchange that matches nothing passes the message to its
`alternate-exchange`. Each exchange is visited once (a cycle of bindings or of alternates ends there) and each
queue is named once, so the message, appended once, is indexed once more into each queue's own
`$queue/<name>` (which the queue reads anyway) and delivered once per queue however many paths lead there.

`route` is pure, over a `Graph` read from the store: exchange records (type, alternate, the exchange bindings
whose source they are) and queue records (their bindings). `Routing` keeps one graph per node, read again when
older than `exchanges.CACHE_S` or changed through this node: a binding made through another node routes here
within that second. While the store cannot answer, the graph last read routes.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tidewire.gateway.core.topics import matches
from tidewire.gateway.protocols.amqp.codec import decode_table, encode_table
from tidewire.gateway.protocols.amqp.exchanges import CACHE_S, DEFAULTS, record_name, stored_bindings
from tidewire.gateway.protocols.amqp.headers import headers_match
from tidewire.gateway.protocols.amqp.mapping import publish_topic
from tidewire.gateway.protocols.amqp.queues import group_name
from tidewire.store.base import GroupRecord

if TYPE_CHECKING:
    from tidewire.gateway.core.clock import Clock
    from tidewire.store.base import Store

log = logging.getLogger("tidewire.amqp")


@dataclass(frozen=True, slots=True)
class Binding:
    destination: str  # a queue, or an exchange
    key: str
    topic_filter: str  # what the key matches on the source's topics ("" from a headers exchange)
    arguments: Mapping[str, Any]  # a headers exchange's pattern


@dataclass(slots=True)
class Vertex:
    kind: str
    alternate: str = ""
    queues: list[Binding] = field(default_factory=list)
    exchanges: list[Binding] = field(default_factory=list)


Graph = dict[str, Vertex]  # exchange name → its type, alternate and bindings (one vhost)


def route(graph: Graph, source: str, key: str, headers: Mapping[str, Any], source_routed: bool) -> set[str]:
    """The queues a message published to `source` with routing key `key` and `headers` reaches.
    `source_routed`: the source's own topic filters already reach something (a binding this graph does not have
    yet, an MQTT subscriber of `amq.topic`): its alternate is then not used."""
    queues: set[str] = set()
    seen = {source}
    work = [source]
    while work:
        name = work.pop()
        vertex = graph.get(name)
        if vertex is None:
            continue  # (an alternate that does not exist: RabbitMQ drops the message there too)
        topic = publish_topic(name, vertex.kind, key)
        matched = name == source and source_routed
        for binding in vertex.queues:
            if _matches(vertex.kind, binding, topic, headers):
                queues.add(binding.destination)
                matched = True
        for binding in vertex.exchanges:
            if _matches(vertex.kind, binding, topic, headers):
                matched = True
                if binding.destination not in seen:
                    seen.add(binding.destination)
                    work.append(binding.destination)
        if not matched and vertex.alternate and vertex.alternate not in seen:
            seen.add(vertex.alternate)
            work.append(vertex.alternate)
    return queues


def _matches(kind: str, binding: Binding, topic: str, headers: Mapping[str, Any]) -> bool:
    if kind == "headers":
        return headers_match(binding.arguments, headers)
    return bool(binding.topic_filter) and matches(binding.topic_filter, topic)


# --- stored form ---------------------------------------------------------------------------------------------
def encode_arguments(arguments: Mapping[str, Any] | None) -> str:
    """Binding arguments as stored (base64 of the AMQP table: their types kept); "" for none."""
    if not arguments:
        return ""
    raw = encode_table(dict(arguments))
    return "" if raw is None else base64.b64encode(raw).decode()


def decode_arguments(text: str) -> dict[str, Any]:
    if not text:
        return {}
    try:
        raw = base64.b64decode(text, validate=True)
    except ValueError:
        return {}
    return decode_table(raw) or {}


def build_graph(records: Sequence[GroupRecord], vhost: str) -> Graph:
    graph: Graph = {name: Vertex(ex.kind) for name, ex in DEFAULTS.items() if name}
    exchange_prefix, queue_prefix = record_name(vhost, ""), group_name(vhost, "")
    for record in records:
        if record.name.startswith(exchange_prefix):
            attrs = record.attrs
            kind, alternate = attrs.get("type"), attrs.get("alternate")
            graph[record.name[len(exchange_prefix):]] = Vertex(
                kind if isinstance(kind, str) else "direct", alternate if isinstance(alternate, str) else "", [],
                [Binding(b[0], b[1], b[2], decode_arguments(b[3])) for b in stored_bindings(attrs.get("bindings"))])
    for record in records:
        if record.name.startswith(queue_prefix):
            queue = str(record.attrs.get("queue", record.name[len(queue_prefix):]))
            for exchange, key, topic_filter, arguments in stored_bindings(record.attrs.get("bindings")):
                source = graph.get(exchange)
                if source is not None:
                    source.queues.append(Binding(queue, key, topic_filter, decode_arguments(arguments)))
    return graph


class Routing:
    """This node's routing graphs (one per server), read from the store."""

    def __init__(self, store: Store, clock: Clock) -> None:
        self.store = store
        self.clock = clock
        self._records: list[GroupRecord] = []
        self._graphs: dict[str, Graph] = {}  # built from `_records` per vhost when first asked
        self._read_at = -CACHE_S  # monotonic time the last store read began
        self._stale = True  # a binding or exchange changed through this node since that read began
        self._reading: asyncio.Task[None] | None = None
        self._reads = 0  # store reads started
        self._read_once = False  # a read has succeeded

    def changed(self) -> None:
        """A binding or exchange changed through this node: the next publish reads the graph again."""
        self._stale = True

    async def graph(self, vhost: str) -> Graph:
        if self._stale or self.clock.monotonic() - self._read_at >= CACHE_S:
            arrived = self._reads
            while True:
                task = self._reading
                if task is None or task.done():
                    self._reads += 1
                    task = self._reading = asyncio.get_running_loop().create_task(self._read())
                started = self._reads
                try:
                    await asyncio.shield(task)
                except Exception:
                    if not self._read_once:
                        raise  # nothing to route with
                    log.warning("amqp.routing_read_failed", exc_info=True)
                    break  # the store cannot answer: route with the graph last read
                if started > arrived:  # this read began after the caller arrived: it sees what the caller saw
                    break
        graph = self._graphs.get(vhost)
        if graph is None:
            graph = self._graphs[vhost] = build_graph(self._records, vhost)
        return graph

    async def _read(self) -> None:
        self._stale = False
        started = self.clock.monotonic()
        try:
            records = await self.store.list_groups()
        except BaseException:
            self._stale = True
            raise
        self._records, self._graphs, self._read_at, self._read_once = records, {}, started, True
