"""Smoke run of the rules benchmark: a real node with a webhook rule, the endpoint in this process, the C tool's
fan-in; tiny parameters. Every message the rule selects reaches the webhook."""

from __future__ import annotations

import asyncio

import pytest

from loadtest import conn_bench, rules_bench

pytestmark = pytest.mark.timeout(180)


def test_latency_run_posts_every_message() -> None:
    run = asyncio.run(rules_bench._latency_run(rate=200, seconds=0.5))
    assert run["received"] == run["sent"] and run["p50_ms"] is not None and run["p99_ms"] >= run["p50_ms"]


def test_fanin_with_a_rule_to_a_webhook_delivers_what_was_received() -> None:
    cfg = conn_bench.Config(seconds=0.5, publishers=2, window=10, server_core=None, load_core=None)
    run = asyncio.run(rules_bench._fanin_run('SELECT * FROM "#"', 50, cfg, conn_bench.build_tool()))
    assert run["received"] > 0 and run["webhook_results"] >= run["received"]
