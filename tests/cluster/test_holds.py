"""What a dead node held in the store is released by the survivor that declares it dead (real nodes, real Redis):
its wildcard holds leave the cluster's wildcard set, except the filters of the sessions it parked, which the
survivor holds first, so a message published after the death still reaches a parked session when it returns."""

from __future__ import annotations

from tests.cluster.conftest import ClusterFactory
from tests.cluster.test_cluster import connect, move
from tests.integration.conftest import PahoFactory
from tests.waiting import wait_until

WILDCARDS = "{tw}:wc"  # store/redis/meta.py: filter -> holder count


def test_a_dead_nodes_wildcard_holds_go_and_its_parked_sessions_keep_theirs(
        cluster: ClusterFactory, paho_factory: PahoFactory) -> None:
    c = cluster(n=2)
    n1, n2 = c.nodes
    redis = c._client()

    def indexed() -> set[bytes]:
        return set(redis.hkeys(WILDCARDS))

    connect(n2, paho_factory, "hold-live", subscribe=["only-n2/+"])  # online on n2: its hold dies with n2
    parked = connect(n2, paho_factory, "hold-parked", persistent=True, subscribe=["parked/+"])
    parked.disconnect()  # parked on n2 after n1 started: only n2 holds its filter
    wait_until(lambda: {b"only-n2/+", b"parked/+"} <= indexed(), what="both filters in the wildcard set")
    assert redis.hget(WILDCARDS, "parked/+") == b"1", "only n2 holds the parked session's filter"
    c.kill9(n2)
    c.wait_gone("n2")
    wait_until(lambda: b"only-n2/+" not in indexed(), timeout=10, what="the dead node's hold released")
    assert b"parked/+" in indexed(), f"a parked session's filter left the set\n{c.logs()}"
    publisher = connect(n1, paho_factory, "hold-pub")
    assert publisher.publish("parked/x", b"after the death", qos=1) == 0
    assert move(parked, n1), "the parked session is kept"
    got = parked.get(timeout=5)
    assert (got.topic, got.payload) == ("parked/x", b"after the death")
