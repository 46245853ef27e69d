"""Fixtures for end-to-end tests of a cluster: N real gateway processes (`tests.integration.conftest.Gateway`)
sharing one redis-server (AOF `appendfsync always`), with fast membership timings.

`cluster(n=3, env=None, store="redis", proxied=False)` -> a started `Cluster`: `.nodes` (n1, n2, ... in order),
`.redis` (a `RedisServer`, with store="redis-cluster" a 3-master `RedisClusterServers`, with store="redis-sentinel"
a primary, a replica and 3 sentinels: `RedisSentinelServers`), `.store_url`;
`kill9(node)`, `stop(node)`, `restart(node)`, `wait_members(ids)`, `wait_gone(id)`, `members()`, `logs()`.
Everything is killed at teardown. `paho_factory` is the integration suite's fixture.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.proxy import TcpProxy
from tests.integration.conftest import Gateway, free_port, paho_factory  # noqa: F401 - paho_factory: a fixture
from tests.store import redis_server
from tests.store.redis_server import RedisClusterServers, RedisSentinelServers, RedisServer
from tests.waiting import wait_until

HEARTBEAT = 0.2  # s between membership heartbeats
MEMBER_TTL = 1.5  # s without a heartbeat before a node is declared dead
RESYNC_INTERVAL = 0.5  # s between re-reads of every local queue
JOIN_TIMEOUT = 10.0  # s until every started node is a registered member
MEMBERS_KEY = "{tw}:members"  # lookup/membership.py: hash node id -> cluster address
EXPIRY_KEY = "{tw}:members:exp"  # zset node id -> expiry (ms): its last heartbeat + the TTL
SINCE_KEY = "{tw}:members:since"  # hash node id -> when its entry became live (ms): its join
EPOCH_KEY = "{tw}:members:epoch"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every cluster scenario is `slow` (`make test-slow`: several nodes and a Redis each, seconds apiece; `make
    test` stays under its 10 minutes), and skipped without redis-server or against Mosquitto."""
    here = Path(__file__).parent
    mine = [item for item in items if here in Path(str(item.path)).parents]
    for item in mine:
        item.add_marker(pytest.mark.slow)
    if os.environ.get("TIDEWIRE_TEST_TARGET", "tidewire") == "mosquitto" or not redis_server.available():
        skip = pytest.mark.skip(reason="a Tidewire cluster needs redis-server (and is not a Mosquitto feature)")
        for item in mine:
            item.add_marker(skip)


class ClusterNode(Gateway):
    """One member: a `Gateway` whose node id, cluster port and secret come from the environment and whose
    store is the cluster's shared Redis (never a private one, whatever TIDEWIRE_TEST_STORE says)."""

    def __init__(self, workdir: Path, node_id: str, store_url: str, secret: str, env: dict[str, str],
                 admin: bool = False, backends: bool = True) -> None:
        self.node_id = node_id
        self.cluster_port = free_port()
        node_env = {
            "TIDEWIRE_NODE_ID": node_id,
            "TIDEWIRE_CLUSTER_PORT": str(self.cluster_port),
            "TIDEWIRE_CLUSTER_SECRET": secret,
            "TIDEWIRE_CLUSTER_HEARTBEAT": str(HEARTBEAT),
            "TIDEWIRE_CLUSTER_MEMBER_TTL": str(MEMBER_TTL),
            "TIDEWIRE_CLUSTER_RESYNC_INTERVAL": str(RESYNC_INTERVAL),
            **env,
        }
        super().__init__(workdir, env=node_env, amqp=backends, rocketmq=backends, admin=admin,
                         extra_args=["--store", store_url])
        self.redis = None  # the shared store server belongs to the Cluster, not to one node

    def __repr__(self) -> str:
        return f"<{self.node_id} mqtt={self.port} cluster={self.cluster_port} alive={self.alive}>"


class Cluster:
    """`n` nodes n1..nN on one redis-server. Node helpers take the node object (`cluster.nodes[1]` is n2).

    `proxied`: every node reaches Redis through its own `TcpProxy` (`store_proxy[node_id]`) and is reached by the
    others through one on its cluster port (`link_proxy[node_id]`, advertised by `cluster_advertise_port`), so a
    test can cut a node off the store or off the other nodes; nodes then get their admin port (/readyz) and no AMQP
    or RocketMQ listener (a faster start)."""

    def __init__(self, workdir: Path, n: int = 3, env: dict[str, str] | None = None, store: str = "redis",
                 proxied: bool = False) -> None:
        self.store = store
        self.redis: RedisServer | RedisClusterServers | RedisSentinelServers
        if store == "redis-cluster":
            if not redis_server.cluster_available():
                pytest.skip("redis-cli is not installed")
            self.redis = RedisClusterServers(workdir / "redis-cluster")
        elif store == "redis-sentinel":
            if not redis_server.sentinel_available():
                pytest.skip("redis-sentinel is not installed")
            self.redis = RedisSentinelServers(workdir / "redis-sentinel")
        else:
            assert store == "redis", store
            self.redis = RedisServer(workdir / "redis")
        self.secret = secrets.token_hex(16)
        self.store_proxy: dict[str, TcpProxy] = {}
        self.link_proxy: dict[str, TcpProxy] = {}
        self.nodes = []
        for i in range(n):
            node_id, url, node_env = f"n{i + 1}", self.redis.url, dict(env or {})
            if proxied:
                assert isinstance(self.redis, RedisServer), "a proxied cluster has one redis-server"
                # A refusal these tests count is the partition's, never a loaded test machine's (0x89 busy).
                node_env.setdefault("TIDEWIRE_OVERLOAD_LOOP_LAG_MS", "0")
                proxy = self.store_proxy[node_id] = TcpProxy(self.redis.port)
                url = f"redis://127.0.0.1:{proxy.port}/0"
            node = ClusterNode(workdir / node_id, node_id, url, self.secret, node_env, admin=proxied,
                               backends=not proxied)
            if proxied:
                link = self.link_proxy[node_id] = TcpProxy(node.cluster_port)
                node.env["TIDEWIRE_CLUSTER_ADVERTISE_PORT"] = str(link.port)
            self.nodes.append(node)

    @property
    def store_url(self) -> str:
        return self.redis.url

    @property
    def single_redis(self) -> RedisServer:
        """The one redis-server (for kill/restart); not on a Redis Cluster store."""
        assert isinstance(self.redis, RedisServer), "a single-Redis test"
        return self.redis

    @property
    def sentinel_redis(self) -> RedisSentinelServers:
        """The primary, its replica and the sentinels; only with store="redis-sentinel"."""
        assert isinstance(self.redis, RedisSentinelServers), "a Sentinel test"
        return self.redis

    # -- lifecycle -----------------------------------------------------------------------------------
    def start(self) -> None:
        self.redis.start()
        with ThreadPoolExecutor(len(self.nodes)) as pool:  # python start-up dominates: overlap it
            for future in [pool.submit(node.start) for node in self.nodes]:
                future.result()
        self.wait_members([node.node_id for node in self.nodes])

    def kill9(self, node: ClusterNode) -> float:
        """SIGKILL: no goodbye to the membership. Returns `time.monotonic()` right after the kill."""
        node.kill9()
        return time.monotonic()

    def stop(self, node: ClusterNode) -> None:
        """SIGTERM: a graceful leave."""
        node.stop()

    def restart(self, node: ClusterNode) -> None:
        """Start a stopped or killed node again: same node id, ports and data dir; waits until it is a member."""
        if node.alive:
            node.stop()
        node.start()
        self.wait_members([node.node_id])

    def close(self) -> None:
        for node in self.nodes:
            node.kill9()
        for proxy in [*self.store_proxy.values(), *self.link_proxy.values()]:
            proxy.close()
        self.redis.stop()

    # -- membership as stored in Redis -----------------------------------------------------------------
    def _client(self) -> Any:
        import redis
        from redis.cluster import ClusterNode as RedisClusterNode
        from redis.cluster import RedisCluster

        if isinstance(self.redis, RedisClusterServers):
            return RedisCluster(startup_nodes=[RedisClusterNode("127.0.0.1", p) for p in self.redis.ports],
                                socket_timeout=2, socket_connect_timeout=2)
        if isinstance(self.redis, RedisSentinelServers):
            return redis.Redis(host="127.0.0.1", port=self.redis.primary_port(), socket_timeout=2,
                               socket_connect_timeout=2)
        return redis.Redis(host="127.0.0.1", port=self.redis.port, socket_timeout=2, socket_connect_timeout=2)

    def members(self) -> dict[str, str]:
        """node id -> cluster address, as registered now."""
        client = self._client()
        try:
            raw = client.hgetall(MEMBERS_KEY)
        finally:
            client.close()
        return {k.decode(): v.decode() for k, v in raw.items()}

    def epoch(self) -> int:
        client = self._client()
        try:
            return int(client.get(EPOCH_KEY) or 0)
        finally:
            client.close()

    def beaten_since_last_join(self) -> bool:
        """Whether every running node has sent a heartbeat after the last join: each heartbeat returns the
        current epoch, so every node has it."""
        client = self._client()
        try:
            expiry = {k.decode(): float(v) for k, v in client.zrange(EXPIRY_KEY, 0, -1, withscores=True)}
            since = [int(v) for v in client.hvals(SINCE_KEY)]
        finally:
            client.close()
        running = [node.node_id for node in self.nodes if node.alive]
        last_join = max(since, default=0)
        return all(node_id in expiry and expiry[node_id] - MEMBER_TTL * 1000 > last_join for node_id in running)

    def _wait(self, predicate: Callable[[dict[str, str]], bool], timeout: float, what: str) -> None:
        seen: dict[str, str] | str = {}

        def check() -> bool:
            nonlocal seen
            try:
                seen = self.members()
                return predicate(seen)
            except OSError as exc:  # redis-py's ConnectionError is an OSError: Redis restarting
                seen = f"redis unreachable: {exc}"
                return False

        wait_until(check, timeout, what=lambda: f"{what} (members: {seen})\n{self.logs()}", interval=0.05)

    def wait_members(self, ids: Iterable[str], timeout: float = JOIN_TIMEOUT) -> None:
        """Until every id is registered and every running node has had a heartbeat since, so each has the new
        epoch."""
        want = set(ids)
        self._wait(lambda m: want <= m.keys() and self.beaten_since_last_join(), timeout,
                   f"members {sorted(want)}, each running node's heartbeat after the last join")

    def wait_gone(self, node_id: str, timeout: float = MEMBER_TTL + 5.0) -> None:
        """Until a survivor has removed `node_id` from the membership (declared it dead)."""
        self._wait(lambda m: node_id not in m, timeout, f"{node_id} declared dead")

    # -- diagnostics -----------------------------------------------------------------------------------
    def logs(self, lines: int = 25) -> str:
        """The tail of every node's log, for assertion messages."""
        parts = []
        for node in self.nodes:
            tail = node.stderr.splitlines()[-lines:]
            parts.append(f"---- {node.node_id} ({node.workdir / 'gateway.log'}):\n" + "\n".join(tail))
        return "\n".join(parts)


ClusterFactory = Callable[..., Cluster]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ClusterFactory]:
    """`cluster(n=3, env=None, store="redis", proxied=False)` -> a started Cluster; every process is killed at
    teardown. store: "redis" (one redis-server), "redis-cluster" (a 3-master Redis Cluster) or "redis-sentinel" (a
    primary with a replica behind 3 sentinels); proxied: see `Cluster`."""
    made: list[Cluster] = []

    def make(n: int = 3, env: dict[str, str] | None = None, store: str = "redis", proxied: bool = False) -> Cluster:
        c = Cluster(tmp_path / f"cluster{len(made)}", n, env, store, proxied)
        made.append(c)
        try:
            c.start()
        except BaseException:
            c.close()
            raise
        return c

    yield make
    for c in made:
        c.close()
