"""The bridge in a cluster: two Tidewire nodes on one redis-server configured with the same bridge, one runs it (the
store lease), the other stands by; the holder is killed (-9) while messages flow and the other takes the bridge
over: everything published on either node reaches the remote Mosquitto, duplicates bounded by one window."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.bridges.mqtt.test_bridge import block, collect, publish_lines
from tests.cluster.conftest import Cluster
from tests.integration.conftest import Gateway
from tests.integration.paho import PahoClient
from tests.store import redis_server
from tests.waiting import wait_until

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not redis_server.available(), reason="a Tidewire cluster needs redis-server")]


@pytest.fixture
def remote(tmp_path: Path) -> Iterator[Gateway]:
    gw = Gateway(tmp_path / "remote", target="mosquitto")
    gw.start()
    yield gw
    gw.close()


def bridge_states(watch: PahoClient, states: dict[str, str]) -> None:
    """Take in the retained `$SYS/brokers/<node>/bridges/b1/state` values that came."""
    while True:
        try:
            got = watch.get(timeout=0.05)
        except AssertionError:
            return
        states[got.topic.split("/")[2]] = got.payload.decode()


def test_another_node_takes_the_bridge_over(tmp_path: Path, remote: Gateway) -> None:
    conf = tmp_path / "bridges.conf"
    conf.write_text(block(remote.port, "topic q/# out 1"))
    cluster = Cluster(tmp_path, n=2, env={"TIDEWIRE_MOSQUITTO_BRIDGE_FILE": str(conf),
                                          "TIDEWIRE_BRIDGE_LEASE_TTL": "2", "TIDEWIRE_SYS_INTERVAL": "0.3"})
    clients: list[PahoClient] = []
    try:
        cluster.start()
        remote_sub = PahoClient(remote.port, "remote-sub", version=4, clean=False)
        clients.append(remote_sub)
        remote_sub.connect()
        remote_sub.subscribe("q/#", 1)
        first, second = cluster.nodes
        watch = PahoClient(second.port, "watch", version=4)
        clients.append(watch)
        watch.connect()
        watch.subscribe("$SYS/brokers/+/bridges/b1/state", 0)
        states: dict[str, str] = {}

        def one_connected() -> bool:
            bridge_states(watch, states)
            return sorted(states.values()) == ["connected", "standby"]

        wait_until(one_connected, timeout=20, what=lambda: f"one node connected, one standby: {states}")
        holder = next(n for n in cluster.nodes if states[n.node_id] == "connected")
        survivor = second if holder is first else first
        before = [f"a{i}" for i in range(2_000)]
        publish_lines(holder.port, "q/a", before)
        cluster.kill9(holder)
        after = [f"b{i}" for i in range(2_000)]
        publish_lines(survivor.port, "q/b", after)  # while the bridge moves: they wait in the log
        watch = PahoClient(survivor.port, "watch-2", version=4)  # the first may have been on the dead node
        clients.append(watch)
        watch.connect()
        watch.subscribe("$SYS/brokers/+/bridges/b1/state", 0)
        states.clear()
        wait_until(lambda: (bridge_states(watch, states), states.get(survivor.node_id) == "connected")[1],
                   timeout=20, what=lambda: f"{survivor.node_id} connected: {states}")
        got = collect(remote_sub, {p.encode() for p in before + after}, timeout=60)
        duplicates = sum(got.values()) - len(got)
        assert duplicates <= 100, f"{duplicates} duplicates"  # at most the dead holder's in-flight window
    finally:
        for client in clients:
            client.close()
        cluster.close()
