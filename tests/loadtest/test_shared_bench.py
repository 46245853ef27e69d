"""Smoke run of the `$share` group benchmark: a real 3-node cluster on a real redis-server, tiny parameters."""

from __future__ import annotations

import shutil

import pytest

from loadtest import shared_bench

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240),
              pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is needed")]


def test_every_step_serves_the_group_on_its_member_nodes_and_loses_nothing() -> None:
    steps = shared_bench.measure(members=3, publishers=3, window=10, seconds=0.5)
    assert [s.member_nodes for s in steps] == [1, 2, 3]
    for step in steps:
        assert len(step.per_node) == step.member_nodes and all(step.per_node.values()), step
        assert step.lost == 0 and step.extra == 0 and step.received == step.acked > 0, step
        assert step.msgs_per_s > 0


def test_workers_that_take_time_per_message_give_the_group_a_rate_that_grows_with_its_nodes() -> None:
    """Members that each ack one message every 20 ms, 2 per node: the group's rate is theirs, so it grows with
    the nodes that serve it (on the old one-node-serves code it stayed at one node's 100 msg/s)."""
    steps = shared_bench.measure(publishers=2, window=10, seconds=1.5, process_ms=20, members_per_node=2)
    for step in steps:
        assert len(step.per_node) == step.member_nodes and all(step.per_node.values()), step
        assert step.lost == 0 and step.extra == 0, step
    rates = [s.msgs_per_s for s in steps]
    assert rates[1] > 1.5 * rates[0] and rates[2] > 2.2 * rates[0], rates
