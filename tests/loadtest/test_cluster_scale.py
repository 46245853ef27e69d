"""Smoke run of the node-count benchmark: real nodes, a real Redis Cluster, the C load tool, tiny parameters."""

from __future__ import annotations

import shutil

import pytest

from loadtest import cluster_scale, conn_bench

pytestmark = [pytest.mark.timeout(240),
              pytest.mark.skipif(shutil.which("redis-server") is None or shutil.which("redis-cli") is None,
                                 reason="redis-server and redis-cli are needed")]

CFG = cluster_scale.ScaleConfig(publishers=2, window=10, seconds=1.0, node_core=None, store_core=None,
                                load_core=None)


@pytest.mark.parametrize(("store", "nodes"), [("embedded", 1), ("redis", 2), ("redis-cluster", 2)])
def test_every_load_crosses_nodes_and_loses_nothing(store: str, nodes: int) -> None:
    run = cluster_scale.measure(store, nodes, CFG, str(conn_bench.build_tool()))
    assert run.errors == [] and run.lost == 0 and run.gaps == 0
    assert len(run.per_node) == nodes and all(rate > 0 for rate in run.per_node)
    assert run.received >= run.sent - run.lost > 0
    if store == "embedded":
        assert run.commands_per_msg == 0 and run.store_cpu == 0
    else:  # what the cost model is read from: Redis did work for every message
        assert run.commands_per_msg > 0 and run.scripts_per_msg > 0 and run.round_trips_per_msg > 0
    assert "msgs/s" in cluster_scale.summary([run])
