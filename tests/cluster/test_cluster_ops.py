"""Cluster end to end, continued: wills of a dead node, and `tidewire cluster up` (real processes, real Redis)."""

from __future__ import annotations

import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.cluster.conftest import HEARTBEAT, MEMBER_TTL, Cluster, ClusterFactory, ClusterNode
from tests.cluster.test_cluster import EXPIRY, connect
from tests.integration.conftest import PahoClient, PahoFactory

# --- 7. wills of a dead node ---------------------------------------------------------------------------------


def _will_client(node: ClusterNode, paho_factory: PahoFactory, cid: str, topic: str, version: int) -> PahoClient:
    """3.1.1: a clean session; 5.0: a persistent one (session expiry 300 s). Will: QoS 1, no delay."""
    w = paho_factory(node.port, cid, version=version, clean=version == 4)
    w.client.will_set(topic, f"{cid} died".encode(), qos=1)
    w.connect(session_expiry=EXPIRY if version == 5 else None)
    return w


def _collect_wills(watcher: PahoClient, want: set[str], timeout: float, c: Cluster) -> tuple[list[str], float]:
    """Will topics received until every one of `want` has arrived, and when the first arrived."""
    topics: list[str] = []
    first = 0.0
    deadline = time.monotonic() + timeout
    while not want <= set(topics):
        try:
            msg = watcher.messages.get(timeout=max(0.01, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError(f"wills {sorted(want - set(topics))} not published within {timeout}s (got "
                                 f"{topics})\n{c.logs()}") from None
        first = first or time.monotonic()
        topics.append(msg.topic)
    return topics, first


@pytest.mark.slow  # long: `make test-slow` (CI runs it after `make test`)
def test_wills_of_a_killed_node_are_published_once_by_one_survivor_after_it_is_declared_dead(
        cluster: ClusterFactory, paho_factory: PahoFactory) -> None:
    c = cluster()
    n1, n2, n3 = c.nodes
    watchers = [connect(n1, paho_factory, "will-w1", subscribe=["wills/#"]),
                connect(n3, paho_factory, "will-w3", version=4, subscribe=["wills/#"])]
    live = _will_client(n1, paho_factory, "will-live", "wills/n1/live", 5)
    _will_client(n2, paho_factory, "will-d5", "wills/n2/d5", 5)
    _will_client(n2, paho_factory, "will-d4", "wills/n2/d4", 4)
    want = {"wills/n2/d4", "wills/n2/d5"}
    killed = c.kill9(n2)
    for w in watchers:
        topics, first = _collect_wills(w, want, MEMBER_TTL + 6.0, c)
        # Its last heartbeat was at most one interval before the kill: dead no sooner than TTL - interval.
        assert first - killed >= MEMBER_TTL - HEARTBEAT - 0.3, f"will {first - killed:.2f}s after the kill: too early"
        assert sorted(topics) == sorted(want), f"a will published twice: {topics}"
    for w in watchers:
        w.assert_nothing(1.0)  # once: not by a second survivor
    assert "n2" not in c.members()
    c.restart(n2)
    for w in watchers:
        w.assert_nothing(1.0)  # the restarted n2 republishes nothing, least of all n1's live client's will
    assert live.disconnects.empty()


@pytest.mark.slow  # long: `make test-slow` (CI runs it after `make test`)
def test_wills_of_a_node_restarted_within_its_ttl_are_published_once(
        cluster: ClusterFactory, paho_factory: PahoFactory) -> None:
    c = cluster()
    n1, n2, n3 = c.nodes
    watchers = [connect(n1, paho_factory, "wq-w1", subscribe=["wills/#"]),
                connect(n3, paho_factory, "wq-w3", subscribe=["wills/#"])]
    _will_client(n2, paho_factory, "wq-d5", "wills/n2/q5", 5)
    _will_client(n2, paho_factory, "wq-d4", "wills/n2/q4", 4)
    want = {"wills/n2/q4", "wills/n2/q5"}
    c.kill9(n2)
    c.restart(n2)  # same node id at once: the joiner or a survivor reports the old process dead, once
    for w in watchers:
        topics, _ = _collect_wills(w, want, MEMBER_TTL + 6.0, c)
        assert sorted(topics) == sorted(want), f"a will published twice: {topics}"
    for w in watchers:
        w.assert_nothing(1.5)


# --- tidewire cluster up / status ----------------------------------------------------------------------------


def consecutive_free_ports(n: int) -> int:
    """A base port such that base .. base+n-1 are all free now."""
    for base in range(23000 + os.getpid() % 1000 * 20, 60000, 97):
        socks: list[socket.socket] = []
        try:
            for port in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                # As the servers bind (asyncio sets it): a port held only by old TIME_WAIT connections is free.
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise AssertionError("no free port range")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_cluster_command_is_wired_into_the_cli() -> None:
    out = subprocess.run([sys.executable, "-m", "tidewire", "cluster", "--help"], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 0 and "up" in out.stdout and "status" in out.stdout, out.stdout + out.stderr


def test_cluster_up_runs_redis_and_nodes_and_sigterm_stops_them_all(
        tmp_path: Path, paho_factory: PahoFactory) -> None:
    base = consecutive_free_ports(4)  # MQTT: base, base + 1; cluster: base + 2, base + 3
    cbase = base + 2
    cmd = [sys.executable, "-m", "tidewire.gateway.cli.cluster", "up", "--nodes", "2", "--base-port", str(base),
           "--cluster-base-port", str(cbase), "--data-dir", str(tmp_path / "c")]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        for line in proc.stdout or ():
            lines.put(line)

    threading.Thread(target=read, daemon=True).start()
    output: list[str] = []
    pids: list[int] = []
    try:
        deadline = time.monotonic() + 40.0
        while not any(line.startswith("ready") for line in output):
            try:
                output.append(lines.get(timeout=max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                raise AssertionError("cluster up not ready:\n" + "".join(output)) from None
        text = "".join(output)
        pids = [int(p) for p in re.findall(r"pid=(\d+)", text)]
        assert len(pids) == 3, text  # redis and two nodes
        assert f"127.0.0.1:{base}" in text and f"127.0.0.1:{base + 1}" in text, text
        redis_url = re.search(r"redis://\S+", text)
        assert redis_url is not None, text

        sub = paho_factory(base + 1, "up-sub")
        sub.connect()
        assert sub.subscribe("up/t", 1) == [1]
        pub = paho_factory(base, "up-pub", version=4)
        pub.connect()
        pub.publish("up/t", b"across", qos=1)
        assert sub.get(5.0).payload == b"across"

        status = subprocess.run([sys.executable, "-m", "tidewire.gateway.cli.cluster", "status", "--redis",
                                 redis_url.group(0)], capture_output=True, text=True, timeout=30)
        assert status.returncode == 0, status.stdout + status.stderr
        assert re.search(r"\bn1\b", status.stdout) and re.search(r"\bn2\b", status.stdout), status.stdout
        assert "epoch" in status.stdout, status.stdout

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        assert not [p for p in pids if _alive(p)], "children outlived `cluster up`"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        for pid in pids:  # processes this test started (through the command), by their ids
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
