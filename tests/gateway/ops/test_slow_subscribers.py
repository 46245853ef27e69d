"""Per-client ack-time aggregates (gateway.ops.client_stats) and the slow-subscriber ranking, sans-IO."""

from __future__ import annotations

import pytest

from tidewire.gateway.ops.client_stats import ClientStats
from tidewire.gateway.ops.slow_subscribers import SlowSubscribers, merge, rank


def _stats(*ack_times: float) -> ClientStats:
    stats = ClientStats()
    for seconds in ack_times:
        stats.acked(seconds)
    return stats


def test_the_aggregate_counts_mean_ewma_max_and_percentiles() -> None:
    stats = _stats(*([0.002] * 98 + [0.3, 0.5]))
    assert stats.acks == 100
    assert stats.ack_total / stats.acks == pytest.approx((0.196 + 0.8) / 100)
    assert stats.ack_max == 0.5
    assert 0.002 <= stats.ack_percentile(0.5) <= 0.004  # within a factor of two, from above
    assert 0.3 <= stats.ack_percentile(0.99) <= 0.5  # never above the max seen
    assert stats.ack_ewma > 0.1  # the two late acks are recent: the moving average shows them
    assert ClientStats().ack_percentile(0.5) == 0.0


def test_the_ewma_follows_a_client_that_became_fast() -> None:
    stats = _stats(*([1.0] * 5 + [0.001] * 40))
    assert stats.ack_ewma < 0.01 < stats.ack_total / stats.acks


def test_the_ranking_names_the_slowest_first_above_the_threshold() -> None:
    clients = [("fast", _stats(0.001, 0.002)), ("slow", _stats(0.8, 0.9)), ("slower", _stats(2.0)),
               ("none", ClientStats()), ("mid", _stats(0.2))]
    assert [row["client_id"] for row in rank(clients, 10, 100.0)] == ["slower", "slow", "mid"]
    assert [row["client_id"] for row in rank(clients, 1, 0.0)] == ["slower"]
    row = rank(clients, 10, 500.0)[1]
    assert row["client_id"] == "slow" and row["acks"] == 2 and row["ack_max_ms"] == 900.0
    assert rank([("b", _stats(1.0)), ("a", _stats(1.0))], 2, 0.0)[0]["client_id"] == "a"  # ties: by client id


def test_a_slow_client_that_left_stays_ranked_until_it_expires() -> None:
    table = SlowSubscribers(top=3, threshold_ms=100.0, expire=60.0)
    table.departed("gone-slow", _stats(0.5), now=10.0)
    table.departed("gone-fast", _stats(0.001), now=10.0)  # under the threshold: not remembered
    online = [("here", _stats(0.3)), ("back", _stats(0.2))]
    table.departed("back", _stats(0.9), now=10.0)  # online again: ranked as it is now
    ranked = table.ranking(online, now=20.0)
    assert [(r["client_id"], r["online"]) for r in ranked] == [("gone-slow", False), ("here", True), ("back", True)]
    assert ranked[2]["ack_ewma_ms"] == 200.0
    assert [r["client_id"] for r in table.ranking(online, now=70.1)] == ["here", "back"]  # expired


def test_merge_keeps_a_client_once_and_the_top() -> None:
    a = [{"client_id": "x", "ack_ewma_ms": 300.0}, {"client_id": "y", "ack_ewma_ms": 200.0}]
    b = [{"client_id": "x", "ack_ewma_ms": 500.0}, {"client_id": "z", "ack_ewma_ms": 100.0}]
    assert [(r["client_id"], r["ack_ewma_ms"]) for r in merge([a, b], 2)] == [("x", 500.0), ("y", 200.0)]
