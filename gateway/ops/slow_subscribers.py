"""The slowest subscribers, sans-IO: of the clients' ack-time aggregates (`gateway.ops.client_stats`), the `top`
whose moving average (EWMA) of publish → PUBACK/PUBREC time is at least a threshold, slowest first (EMQX's "slow
subscriptions", per client). The clients online are ranked when asked (the per-ack cost is the aggregate's);
one that left while slow stays in the ranking, as it last was, for `expire` seconds (EMQX's expire_interval)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

from tidewire.gateway.ops.client_stats import ClientStats

MAX_DEPARTED = 1000  # slow clients that left, remembered at most (the oldest go first)


def row(client_id: str, stats: ClientStats) -> dict[str, Any]:
    """A client's line of the ranking."""
    full = stats.as_dict()
    return {"client_id": client_id, **{key: full[key] for key in (
        "acks", "ack_ewma_ms", "ack_mean_ms", "ack_max_ms", "ack_p50_ms", "ack_p99_ms", "messages_out", "retries")}}


def rank(clients: Iterable[tuple[str, ClientStats]], top: int, threshold_ms: float) -> list[dict[str, Any]]:
    """The `top` clients by ack-time EWMA, at least `threshold_ms`, slowest first (ties by client id)."""
    threshold = threshold_ms / 1000
    candidates = [(stats.ack_ewma, client_id, stats) for client_id, stats in clients
                  if stats.acks and stats.ack_ewma >= threshold]
    candidates.sort(key=lambda c: (-c[0], c[1]))
    return [row(client_id, stats) for _, client_id, stats in candidates[:top]]


def merge(rankings: Iterable[list[dict[str, Any]]], top: int) -> list[dict[str, Any]]:
    """Several rankings (one per node, or online and departed) as one: slowest first, a client once (its slowest
    row), at most `top`."""
    best: dict[str, dict[str, Any]] = {}
    for ranking in rankings:
        for entry in ranking:
            seen = best.get(entry["client_id"])
            if seen is None or entry["ack_ewma_ms"] > seen["ack_ewma_ms"]:
                best[entry["client_id"]] = entry
    return sorted(best.values(), key=lambda e: (-e["ack_ewma_ms"], e["client_id"]))[:top]


class SlowSubscribers:
    """`node.slow_subscribers`: the ranking of a node, with the slow clients that left in the last `expire` s."""

    def __init__(self, top: int, threshold_ms: float, expire: float) -> None:
        self.top = top
        self.threshold_ms = threshold_ms
        self.expire = expire
        self._departed: OrderedDict[str, tuple[float, dict[str, Any]]] = OrderedDict()  # by departure, oldest first

    def departed(self, client_id: str, stats: ClientStats, now: float) -> None:
        """A client's connection ended: remembered if it was slow (a few float tests otherwise)."""
        if not stats.acks or stats.ack_ewma * 1000 < self.threshold_ms or self.expire <= 0:
            return
        self._departed.pop(client_id, None)
        self._departed[client_id] = (now, {**row(client_id, stats), "online": False})
        while len(self._departed) > MAX_DEPARTED:
            self._departed.popitem(last=False)

    def ranking(self, online: Iterable[tuple[str, ClientStats]], now: float) -> list[dict[str, Any]]:
        """The clients online and those that left within `expire` s, slowest first; a client online again is
        ranked as it is now."""
        departed = self._departed
        while departed and next(iter(departed.values()))[0] <= now - self.expire:
            departed.popitem(last=False)
        live = [{**entry, "online": True} for entry in rank(online, self.top, self.threshold_ms)]
        here = {entry["client_id"] for entry in live}
        gone = [entry for cid, (_, entry) in departed.items() if cid not in here]
        return merge([live, gone], self.top)
