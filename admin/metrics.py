"""Prometheus metrics of one node, one job: turn the node's counters into metric families at scrape time.

Nothing here runs on the hot path: the node keeps plain int counters (`gateway.ops.sys_topics.Counters`, the cache's
hits and misses, the notifier's `counts`, the auth chain's `results`, the plugins' errors), and `NodeCollector`
reads them only when `/metrics` is scraped. Levels (connections, sessions, subscriptions, in-flight, cluster
members) are counted from the node's live state at that moment. Each node has its own `CollectorRegistry` (never
the process-wide default one), with prometheus_client's process collector on it. `top_topics` serves the dashboard.
"""

from __future__ import annotations

import importlib.metadata
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from tidewire.admin.app import Endpoints
from tidewire.gateway.node import Node
from tidewire.gateway.ops.sys_topics import LATENCY_BOUNDS, Latency
from tidewire.notify.base import NotifyCounts
from tidewire.store.base import P2P_PREFIX

PREFIX = "tidewire"
MAX_TOP_TOPICS = 100  # top_topics answers at most this many
_MQTT_LISTENERS = ("mqtt", "mqtts", "ws", "wss")
_AMQP_LISTENERS = ("amqp", "amqps")
_RECEIVE_ONLY = ("api", "bridge")  # `Counters.by_protocol` names shown without "sent" families (see `_traffic`)


def version() -> str:
    try:
        return importlib.metadata.version("tidewire")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def top_topics(node: Node, n: int) -> list[tuple[str, int]]:
    """The `n` (at most `MAX_TOP_TOPICS`) most published topics since the node started, with their estimated
    message counts (sampled under load: `gateway.ops.sys_topics.TopicTally`); empty with metrics off."""
    return node.counters.topics.top(max(0, min(n, MAX_TOP_TOPICS)))


def _histogram(name: str, doc: str, latency: Latency) -> HistogramMetricFamily:
    buckets: list[tuple[str, float]] = []
    total = 0
    for bound, count in zip(LATENCY_BOUNDS, latency.counts, strict=False):
        total += count
        buckets.append((repr(bound), total))
    buckets.append(("+Inf", total + latency.counts[-1]))
    return HistogramMetricFamily(name, doc, buckets=buckets, sum_value=latency.total)


def _lake_sparkplug(lake: Path) -> Iterator[Metric]:
    """The lake's Sparkplug B counters as the bridges committed them (the whole lake's: the same on every node)."""
    from tidewire.pipeline.lake.writer import sparkplug_counts  # pyarrow: there with --lake only

    counts = sparkplug_counts(lake)
    for name, help_text in (("rows", "Sparkplug B metric rows the lake's bridges wrote (table sparkplug)."),
                            ("malformed", "Messages on Sparkplug B topics whose payload did not decode (kept as "
                                          "plain messages)."),
                            ("unresolved", "Sparkplug B DATA metrics sent by an alias no birth the bridge had read "
                                           "named.")):
        yield CounterMetricFamily(f"{PREFIX}_lake_sparkplug_{name}", help_text, value=counts[f"sparkplug_{name}"])


class NodeCollector(Collector):
    """Yields the node's metric families (names: the issue 11 contract) each time the registry is scraped.
    `endpoints`: the listeners and the AMQP backend the admin app knows of (None: MQTT connections only)."""

    def __init__(self, node: Node, endpoints: Endpoints | None = None) -> None:
        self.node = node
        self.endpoints = endpoints

    def collect(self) -> Iterator[Metric]:
        node = self.node
        yield from self._levels(node)
        yield from self._traffic(node)
        yield from self._internals(node)
        yield from self._bridges()
        yield from self._rules()
        yield from self._lake_events(node)
        yield from self._tenants(node)

    @staticmethod
    def _tenants(node: Node) -> Iterator[Metric]:
        """Per tenant (`gateway.core.tenants`), only the tenants this node knows: none without tenants."""
        tenants = node.tenants.all()
        if not tenants:
            return
        connections = GaugeMetricFamily(f"{PREFIX}_tenant_connections", "MQTT clients of a tenant connected to this "
                                        "node.", labels=["tenant"])
        received = CounterMetricFamily(f"{PREFIX}_tenant_messages_received", "PUBLISHes a tenant's clients sent "
                                       "that its limits took.", labels=["tenant"])
        sent = CounterMetricFamily(f"{PREFIX}_tenant_messages_sent", "PUBLISHes sent to a tenant's clients (first "
                                   "sends).", labels=["tenant"])
        refused = CounterMetricFamily(f"{PREFIX}_tenant_refused", "Connections and PUBLISHes a tenant's limits "
                                      "refused, by reason (quota, rate: connections; message_rate, retained_bytes).",
                                      labels=["tenant", "reason"])
        retained = GaugeMetricFamily(f"{PREFIX}_tenant_retained_bytes", "Payload bytes of a tenant's retained "
                                     "messages: as last measured, plus set and admitted since (tenants with "
                                     "max_retained_bytes only).",
                                     labels=["tenant"])
        for tenant in tenants:
            connections.add_metric([tenant.name], tenant.connections)
            received.add_metric([tenant.name], tenant.messages_in)
            sent.add_metric([tenant.name], tenant.messages_out)
            for reason, count in sorted(tenant.refused.items()):
                refused.add_metric([tenant.name, reason], count)
            if tenant.limits.max_retained_bytes:
                retained.add_metric([tenant.name], tenant.retained_bytes)
        yield from (connections, received, sent, refused, retained)

    @staticmethod
    def _lake_events(node: Node) -> Iterator[Metric]:
        """The lake's event buffer (`--lake` only): what it took, holds, and lost by reason (a crash's loss, at
        most the buffered level then, is never counted)."""
        events = node.events
        if events is None:
            return
        yield CounterMetricFamily(f"{PREFIX}_lake_events_recorded", "Events taken into the lake's event buffer.",
                                  value=events.recorded)
        yield GaugeMetricFamily(f"{PREFIX}_lake_events_buffered", "Events in the buffer, not yet taken by the "
                                "exporter.", value=len(events.items))
        dropped = CounterMetricFamily(f"{PREFIX}_lake_events_dropped", "Events that will never reach the lake, by "
                                      "reason: buffer_full (the exporter fell behind), write_failed.",
                                      labels=["reason"])
        for reason, count in sorted(events.losses().items()):
            dropped.add_metric([reason], count)
        yield dropped
        if node.settings.lake_dir is not None:
            yield from _lake_sparkplug(node.settings.lake_dir)

    def _rules(self) -> Iterator[Metric]:
        engine = self.endpoints.rules if self.endpoints is not None else None
        if engine is None or not engine.runners:
            return
        results = CounterMetricFamily(f"{PREFIX}_rule_results", "Results of each rule on this node: matched (handed "
                                      "to its action, retries included), sent, failed (attempts), dead_lettered.",
                                      labels=["rule", "result"])
        for name, runner in sorted(engine.runners.items()):
            for result, value in runner.counts.__dict__.items():
                results.add_metric([name, result], value)
        yield results

    def _bridges(self) -> Iterator[Metric]:
        """Each bridge as this node sees it; the lag as last measured (every `sys_interval`, or by the API)."""
        runner = self.endpoints.bridges if self.endpoints is not None else None
        if runner is None or not runner.bridges:
            return
        state = GaugeMetricFamily(f"{PREFIX}_bridge_state", "Each bridge's state on this node (value 1).",
                                  labels=["bridge", "state"])
        lag = GaugeMetricFamily(f"{PREFIX}_bridge_lag_messages", "Messages waiting to go out over the bridge.",
                                labels=["bridge"])
        age = GaugeMetricFamily(f"{PREFIX}_bridge_lag_seconds", "Age of the oldest message waiting to go out.",
                                labels=["bridge"])
        messages = CounterMetricFamily(f"{PREFIX}_bridge_messages", "Messages over the bridge, by direction and "
                                       "outcome.", labels=["bridge", "direction", "result"])
        links = CounterMetricFamily(f"{PREFIX}_bridge_links", "Links made and failed.", labels=["bridge", "result"])
        for bridge in runner.bridges:
            name = bridge.settings.name
            c = bridge.counters
            state.add_metric([name, str(bridge.state)], 1)
            if bridge.lag_messages is not None:
                lag.add_metric([name], bridge.lag_messages)
            if bridge.lag_seconds is not None:
                age.add_metric([name], bridge.lag_seconds)
            for direction, result, value in (("out", "sent", c.sent), ("out", "acked", c.acked),
                                             ("out", "redelivered", c.redelivered),
                                             ("out", "refused", c.refused_by_remote), ("in", "received", c.received),
                                             ("in", "stored", c.stored), ("in", "denied", c.denied)):
                messages.add_metric([name, direction, result], value)
            links.add_metric([name, "connected"], c.connects)
            links.add_metric([name, "failed"], c.failures)
        yield from (state, lag, age, messages, links)

    def _levels(self, node: Node) -> Iterator[Metric]:
        info = GaugeMetricFamily(f"{PREFIX}_info", "The node's id and version (value 1).",
                                 labels=["node_id", "version"])
        info.add_metric([node.node_id, version()], 1)
        yield info
        connections = GaugeMetricFamily(f"{PREFIX}_connections", "Open client connections, by listener and protocol.",
                                        labels=["listener", "protocol"])
        for (listener, protocol), count in sorted(self._connections(node).items()):
            connections.add_metric([listener, protocol], count)
        yield connections
        sessions = [conn.session for conn in node.connections.values() if conn.session is not None]
        yield GaugeMetricFamily(f"{PREFIX}_sessions_online", "MQTT sessions with a connection on this node.",
                                value=len(sessions))
        yield GaugeMetricFamily(f"{PREFIX}_subscriptions", "Subscriptions of the sessions online on this node.",
                                value=sum(1 for s in sessions for f in s.subscriptions if not f.startswith(P2P_PREFIX)))
        yield GaugeMetricFamily(f"{PREFIX}_inflight", "QoS 1/2 messages sent to MQTT clients and not acknowledged.",
                                value=sum(len(s.inflight) for s in sessions))
        yield GaugeMetricFamily(f"{PREFIX}_draining", "1 while the node is stopping (drain).", value=int(node.draining))
        yield GaugeMetricFamily(f"{PREFIX}_store_up", "0 while the node cannot reach its store (it refuses new "
                                "clients), else 1.", value=int(not node.store_health.down))
        topology = node.topology
        members = len(topology.members) if topology.shared else 1
        epoch = int(topology.stats().get("epoch", 0))
        yield GaugeMetricFamily(f"{PREFIX}_cluster_members", "Nodes in the cluster as this node sees it.",
                                value=members)
        yield GaugeMetricFamily(f"{PREFIX}_cluster_epoch", "Cluster membership epoch (0: not clustered).", value=epoch)

    def _connections(self, node: Node) -> Counter[tuple[str, str]]:
        counts: Counter[tuple[str, str]] = Counter((conn.listener.name, "mqtt") for conn in node.connections.values())
        found = self.endpoints
        if found is None:
            return counts
        for spec in found.listeners:
            if spec.name in _MQTT_LISTENERS:
                counts[(spec.name, "mqtt")] += 0  # an idle listener shows as 0, not as missing
            elif spec.name in _AMQP_LISTENERS:
                live = found.amqp.connections.get(spec.name, ()) if found.amqp is not None else ()
                counts[(spec.name, "amqp")] += len(live)
        return counts

    def _traffic(self, node: Node) -> Iterator[Metric]:
        counters = node.counters
        families = [CounterMetricFamily(f"{PREFIX}_{name}", doc, labels=["protocol"]) for name, doc in (
            ("messages_received", "Messages published to this node, by the protocol they came by."),
            ("bytes_received", "Payload bytes published to this node, by protocol."),
            ("messages_sent", "Messages written to receivers (retries included), by protocol."),
            ("bytes_sent", "Bytes written to receivers: MQTT packet bytes, payload bytes for other protocols."))]
        for protocol, values in sorted(counters.by_protocol().items()):
            # Received only: the admin API only publishes, and what a bridge connection is sent counts as MQTT.
            for family, value in zip(families, values if protocol not in _RECEIVE_ONLY else values[:2], strict=False):
                family.add_metric([protocol], value)
        yield from families
        yield CounterMetricFamily(f"{PREFIX}_deliveries", "Messages handed to a receiver for the first time "
                                  "(every protocol).", value=counters.messages_out - counters.retries)
        yield CounterMetricFamily(f"{PREFIX}_retries", "Messages sent again: MQTT DUP resends, AMQP and RocketMQ "
                                  "redeliveries.", value=counters.retries)
        dropped = CounterMetricFamily(f"{PREFIX}_dropped", "Messages that will not reach a receiver, by reason.",
                                      labels=["reason"])
        for reason, count in sorted(counters.drops.items()):
            dropped.add_metric([reason], count)
        yield dropped
        yield CounterMetricFamily(f"{PREFIX}_sessions_evicted", "Offline sessions expired early because the store "
                                  "held more than max_stored_sessions.", value=counters.sessions_evicted)

    def _internals(self, node: Node) -> Iterator[Metric]:
        counters = node.counters
        yield _histogram(f"{PREFIX}_store_append_seconds", "One store append of the publish pipeline (one batch).",
                         counters.append_seconds)
        yield _histogram(f"{PREFIX}_store_fsync_seconds", "One store sync of the publish pipeline (a group-commit "
                         "round, what publishers' acks wait for).", counters.fsync_seconds)
        counts = getattr(node.notifier, "counts", None)
        notify = counts if isinstance(counts, NotifyCounts) else NotifyCounts()
        events = CounterMetricFamily(f"{PREFIX}_notify_events", "Notify events: sent to a node, names merged into "
                                     "a pending one, broadcast to every node.", labels=["kind"])
        for kind, value in (("sent", notify.sent), ("merged", notify.merged), ("broadcast", notify.broadcast)):
            events.add_metric([kind], value)
        yield events
        yield CounterMetricFamily(f"{PREFIX}_cache_hits", "Reads the queue cache answered.", value=node.cache.hits)
        yield CounterMetricFamily(f"{PREFIX}_cache_misses", "Reads the queue cache could not answer (read from the "
                                  "store).", value=node.cache.misses)
        unknown = notify.unknown
        unknown += node.topology.stats().get("lookup_reads_unknown", 0)
        yield CounterMetricFamily(f"{PREFIX}_lookup_fallbacks", "Lookups that could not answer (table changing, "
                                  "shard missing): a notify or kick broadcast instead.", value=unknown)
        auth = CounterMetricFamily(f"{PREFIX}_auth", "Authentication answers, by deciding source and result.",
                                   labels=["source", "result"])
        for (source, result), count in sorted(node.auth.results.items()):
            auth.add_metric([source, result], count)
        yield auth
        yield CounterMetricFamily(f"{PREFIX}_banned_refused", "Connections refused because of a ban.",
                                  value=node.bans.banned_refused)
        plugins = CounterMetricFamily(f"{PREFIX}_plugin_errors", "Plugin calls that raised, timed out or answered "
                                      "what the node cannot use (their default applied), by plugin and kind.",
                                      labels=["plugin", "kind"])
        for (plugin, kind), count in sorted(node.plugin_errors.counts.items()):
            plugins.add_metric([plugin, kind], count)
        yield plugins


def node_registry(collector: NodeCollector) -> CollectorRegistry:
    """A registry of the node's own metrics plus the process collector (never the global default registry)."""
    registry = CollectorRegistry()
    registry.register(collector)
    ProcessCollector(registry=registry)
    return registry


def metrics_router(node: Node) -> APIRouter:
    """`GET /metrics` in the Prometheus text format; no token (scrapers and the Kubernetes HPA read it)."""
    api = APIRouter(tags=["metrics"])
    collector = NodeCollector(node)
    registry = node_registry(collector)

    @api.get("/metrics", include_in_schema=False)
    async def metrics(request: Request) -> Response:
        collector.endpoints = getattr(request.app.state, "endpoints", None)  # the app's listeners, when it has them
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return api
