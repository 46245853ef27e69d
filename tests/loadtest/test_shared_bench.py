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
