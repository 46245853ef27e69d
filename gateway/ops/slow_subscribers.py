"""The slowest subscribers, sans-IO: of the clients' ack-time aggregates (`gateway.ops.client_stats`), the `top`
whose moving average (EWMA) of publish → PUBACK/PUBREC time is at least a threshold, slowest first (EMQX's "slow
subscriptions", per client). Ranked when asked, from the sessions online: the per-ack cost is the aggregate's."""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from typing import Any

from tidewire.gateway.ops.client_stats import ClientStats


def rank(clients: Iterable[tuple[str, ClientStats]], top: int, threshold_ms: float) -> list[dict[str, Any]]:
    """The `top` clients by ack-time EWMA, at least `threshold_ms`, slowest first (ties by client id)."""
    threshold = threshold_ms / 1000
    candidates = ((stats.ack_ewma, client_id, stats) for client_id, stats in clients
                  if stats.acks and stats.ack_ewma >= threshold)
    chosen = heapq.nsmallest(top, candidates, key=lambda c: (-c[0], c[1]))
    return [{"client_id": client_id, **_latency(stats)} for _, client_id, stats in chosen]


def _latency(stats: ClientStats) -> dict[str, Any]:
    full = stats.as_dict()
    return {key: full[key] for key in ("acks", "ack_ewma_ms", "ack_mean_ms", "ack_max_ms", "ack_p50_ms",
                                       "ack_p99_ms", "messages_out", "retries")}
