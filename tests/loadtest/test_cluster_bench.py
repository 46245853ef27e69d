"""Smoke runs of the Redis-store and cluster benchmarks with tiny parameters, against real processes."""

from __future__ import annotations

import shutil

import pytest

from loadtest import cluster_bench, store_bench
from loadtest.client import Counters, Publisher
from loadtest.cluster_procs import Cluster, StatsMonitor
from loadtest.failover import failover
from loadtest.redis_proc import RedisProc, command_calls, delta, parse_info, query
from loadtest.scenarios import close_all
from tests.waiting import until

pytestmark = [pytest.mark.timeout(90),
              pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server not installed")]


def test_redis_counters_count_commands_and_round_trips() -> None:
    with RedisProc() as r:
        before = r.counters()
        for i in range(3):
            assert query(r.host, r.port, "SET", "k", str(i)) == b"OK"
        d = delta(before, r.counters())
    assert d.calls == {"set": 3} and d.commands == 3
    assert d.reads == 6  # each SET on its own connection: the command, then the close
    assert command_calls(parse_info("# Commandstats\ncmdstat_evalsha:calls=7,usec=9,usec_per_call=1.29\n")) == \
        {"evalsha": 7}


def test_store_runs_report_redis_commands_per_message() -> None:
    cfg = store_bench.StoreConfig(seconds=0.5, publishers=3, window=10, subscribers=5, cmd_fanin_rate=300,
                                  cmd_fanout_rate=50, cmd_seconds=0.5, drain=2.0)
    measures = ["fanin", "fanin-cmds", "fanout-cmds"]
    embedded = store_bench.store_run("embedded", measures, cfg, pin=False)
    redis = store_bench.store_run("redis", measures, cfg, pin=False)
    for runs in (embedded, redis):
        assert set(runs) == set(measures)
        assert runs["fanin"].messages() > 0 and runs["fanin"].result.lost == 0
        cmds = runs["fanin-cmds"]
        assert cmds.result.lost == 0 and cmds.messages() >= 100 and cmds.result.scenario == "fanin-paced"
        assert runs["fanout-cmds"].result.received >= 4 * runs["fanout-cmds"].messages()
    assert all(r.redis is None for r in embedded.values())
    assert redis["fanin"].redis is None  # only the -cmds measures read Redis counters
    counted = redis["fanin-cmds"].redis
    assert counted is not None and counted.commands >= 1 and counted.reads >= 1
    line = store_bench.redis_line("fanin-cmds", [redis["fanin-cmds"]])
    assert "commands/msg" in line and "round trips/msg" in line
    assert "store=redis" in redis["fanin"].result.server


@pytest.mark.slow  # two nodes, three redis-servers: ~17 s
def test_a_store_with_a_replica_waits_for_it_and_says_so() -> None:
    cfg = store_bench.StoreConfig(seconds=0.5, publishers=2, window=10, drain=2.0)
    for waits in (0, 1):
        runs = store_bench.store_run(f"redis-replica-wait{waits}", ["fanin"], cfg, pin=False)
        assert runs["fanin"].messages() > 0 and runs["fanin"].result.lost == 0
        assert f"replica, waits={waits}" in runs["fanin"].result.server
    with pytest.raises(ValueError, match="redis-replica-waitN"):
        store_bench.store_run("redis-replica-waitx", ["fanin"], cfg, pin=False)


async def test_stats_monitor_sees_a_nodes_counters_grow() -> None:
    with Cluster(1, store="embedded", node_core=None, redis_core=None, sys_interval=0.2) as cluster:
        monitor = await StatsMonitor(0.2).open(cluster.nodes)
        counters = Counters()
        pub = await cluster.node(1).endpoint().connect("lt-stats-pub", counters)
        try:
            _, first = await monitor.snapshot()
            pub.publisher = Publisher(counters, "bench/stats", 1, 1, 32)
            pub.send(50)
            await until(lambda: counters.acked >= 50, what="50 publishes acked")
            _, second = await monitor.snapshot()
        finally:
            monitor.close()
            await close_all([pub])
    assert second["n1"]["messages/in"] - first["n1"]["messages/in"] >= 50
    assert cluster_bench.counter_sum(second, ("messages/in",)) == second["n1"]["messages/in"]
    assert cluster_bench.counter_sum({"n1": {"cluster/frames_sent": 3.0}, "n2": {"frames_sent": 4.0}},
                                     cluster_bench.FRAMES_KEYS) == 7.0
    assert cluster_bench.counter_sum(second, cluster_bench.FRAMES_KEYS) is None


async def test_persistent_subscribers_resume_after_kill_and_restart() -> None:
    """The failover machinery on one embedded node killed with -9 and restarted in place: every client
    reconnects on its own, and every acknowledged message still arrives."""
    with Cluster(1, store="embedded", node_core=None, redis_core=None) as cluster:
        r = await failover(cluster, victim=1, subscribers=3, rate=200, before=0.5, after=1.5, restart=True)
    assert r.acked > 50  # 200/s for 2 s, less on a loaded machine: enough to show the failover carried traffic
    assert r.not_resumed == 0 and len(r.resume_ms) == 3 and len(r.reconnect_ms) == 3
    assert all(0 < ms < 30_000 for ms in r.resume_ms)
    assert r.lost == 0
    assert "receiving again" in r.summary()


async def test_cluster_measurements() -> None:
    with Cluster(3, node_core=None, redis_core=None, sys_interval=0.3) as cluster:
        why = await cluster_bench.cluster_works(cluster, timeout=5.0)
        assert why is None, f"the cluster does not work: {why}"
        lat = await cluster_bench.cross_node_latency(cluster, rate=200, seconds=0.5, warmup=0.2)
        assert lat.lost == 0 and lat.received >= 90 and lat.p99_ms is not None
        monitor = await StatsMonitor(0.3).open(cluster.nodes)
        try:
            row = await cluster_bench.notify_frames(cluster, monitor, 2, rate=200, seconds=0.5)
        finally:
            monitor.close()
        assert row.published >= 90 and row.delivered == row.published * 2
        fo = await failover(cluster, victim=2, subscribers=3, rate=200, before=0.5, after=2.0)
    assert fo.not_resumed == 0 and fo.lost == 0
