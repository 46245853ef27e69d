"""A local Tidewire cluster for the benchmarks: one private redis-server and N gateway node subprocesses, plus a
reader of the nodes' `$SYS/brokers/<node>/stats/...` counters.

Node k (1-based) is `python -m tidewire serve --host H --port P --data-dir D --store redis://...` with
`TIDEWIRE_NODE_ID=n<k>`, `TIDEWIRE_CLUSTER_PORT=<free>`, `TIDEWIRE_CLUSTER_SECRET` and a short
`TIDEWIRE_SYS_INTERVAL`, so the counters can be read over MQTT while a benchmark runs. `store="redis-cluster"`
puts the nodes on a 3-master Redis Cluster instead; `store="embedded"` (one node only) gives the same harness
without Redis, for restart measurements and tests.
"""

from __future__ import annotations

import asyncio
import copy
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from loadtest.client import DISCONNECT, Endpoint, connect_packet, packet_at, subscribe_packet
from loadtest.redis_proc import RedisClusterProc, RedisProc, terminate
from loadtest.servers import _pin_prefix, free_port, tidewire_command, wait_ready

NODE_START_TIMEOUT = 30.0  # s for a node to answer CONNECT
STATS_TIMEOUT_ROUNDS = 4  # a snapshot waits at most this many $SYS intervals (+ 2 s) for every node
MAX_STATS_PACKET = 1 << 16  # a $SYS stats packet larger than this is not one


@dataclass(slots=True)
class NodeProc:
    """One gateway node process; `kill()` is SIGKILL (a crash), `respawn()` starts it again on the same port
    and data dir."""

    index: int
    node_id: str
    host: str
    port: int
    cluster_port: int
    cmd: list[str]
    env: dict[str, str]
    workdir: Path
    proc: subprocess.Popen[bytes] | None = None

    def endpoint(self) -> Endpoint:
        return Endpoint(self.host, self.port)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def spawn(self) -> None:
        with (self.workdir / "node.log").open("ab") as log:
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=self.env, cwd=self.workdir)

    def wait_ready(self, timeout: float = NODE_START_TIMEOUT) -> None:
        assert self.proc is not None
        try:
            wait_ready(self.host, self.port, self.proc, timeout)
        except (RuntimeError, TimeoutError) as e:
            raise RuntimeError(f"node {self.node_id} did not start ({e}); command: {' '.join(self.cmd)}\n"
                               f"{self.log_tail()}") from e

    def respawn(self) -> None:
        self.spawn()
        self.wait_ready()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self, timeout: float = 10.0) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            terminate(proc, timeout)

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return (self.workdir / "node.log").read_text(errors="replace")[-chars:]
        except OSError:
            return ""


class Cluster:
    """redis-server + N nodes. `node_core`/`redis_core` pin them (None: unpinned); all nodes share node_core.
    A context manager: leaving it stops every process and removes the temp dirs."""

    def __init__(self, n: int, *, host: str = "127.0.0.1", store: str = "redis", node_core: int | None = 0,
                 redis_core: int | None = 1, sys_interval: float = 1.0, secret: str = "bench-cluster-secret",
                 extra_env: dict[str, str] | None = None) -> None:
        if store not in ("redis", "redis-cluster", "embedded") or (store == "embedded" and n != 1):
            raise ValueError("store is redis or redis-cluster (any n) or embedded (n = 1)")
        self.n = n
        self.host = host
        self.store = store
        self.node_core = node_core
        self.redis: RedisProc | RedisClusterProc | None = (
            RedisProc(prefix=_pin_prefix(redis_core), host=host) if store == "redis"
            else RedisClusterProc(prefix=_pin_prefix(redis_core), host=host) if store == "redis-cluster" else None)
        self.sys_interval = sys_interval
        self.secret = secret
        self.extra_env = dict(extra_env or {})
        self.workdir = Path(tempfile.mkdtemp(prefix="loadtest-cluster-"))
        self.nodes: list[NodeProc] = []

    def node(self, k: int) -> NodeProc:
        """Node k, 1-based."""
        return self.nodes[k - 1]

    def _make_node(self, k: int) -> NodeProc:
        port, cluster_port = free_port(self.host), free_port(self.host)
        workdir = self.workdir / f"n{k}"
        workdir.mkdir()
        env = dict(os.environ)
        env.setdefault("TIDEWIRE_LOG_LEVEL", "warning")
        env.update({"TIDEWIRE_NODE_ID": f"n{k}", "TIDEWIRE_SYS_INTERVAL": str(self.sys_interval)})
        if self.redis is not None:
            env.update({"TIDEWIRE_CLUSTER_PORT": str(cluster_port), "TIDEWIRE_CLUSTER_SECRET": self.secret})
        env.update(self.extra_env)
        store = self.redis.url if self.redis is not None else None
        cmd = [*_pin_prefix(self.node_core), *tidewire_command(self.host, port, workdir / "data", store=store)]
        return NodeProc(k, f"n{k}", self.host, port, cluster_port, cmd, env, workdir)

    def link_segments(self) -> int | None:
        """TCP data segments sent so far on the connections between the nodes' cluster ports (both ends,
        from `ss -ti`): what the fabric really put on the wire, however it batched its frames. None without ss."""
        ss = shutil.which("ss")
        if ss is None:
            return None
        ports = {str(n.cluster_port) for n in self.nodes}
        out = subprocess.run([ss, "-tinH", "state", "established"], capture_output=True, text=True,
                             timeout=10).stdout
        total, linked = 0, False
        for line in out.splitlines():
            fields = line.split()
            if not line.startswith((" ", "\t")):
                # the socket line: [Recv-Q Send-Q] local peer; its info follows on the next line
                linked = any(f.rsplit(":", 1)[-1] in ports for f in fields[-2:])
                continue
            if linked:
                total += next((int(f.split(":", 1)[1]) for f in fields if f.startswith("data_segs_out:")), 0)
        return total

    def start(self) -> Cluster:
        try:
            if self.redis is not None:
                self.redis.start()
            self.nodes = [self._make_node(k) for k in range(1, self.n + 1)]
            for node in self.nodes:  # all start at once; then wait for each
                node.spawn()
            for node in self.nodes:
                node.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
        if self.redis is not None:
            self.redis.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class StatsReader(asyncio.Protocol):
    """An MQTT 3.1.1 connection subscribed (QoS 0) to one node's `$SYS/brokers/<node>/stats/#`: keeps the newest
    value of every counter and counts rounds (each round ends with `uptime`, published last)."""

    def __init__(self) -> None:
        loop = asyncio.get_running_loop()
        self.connack: asyncio.Future[int] = loop.create_future()
        self.suback: asyncio.Future[int] = loop.create_future()
        self.values: dict[str, float] = {}
        self.rounds = 0
        self.round_seen = asyncio.Event()
        self.transport: asyncio.Transport | None = None
        self._buf = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        for fut in (self.connack, self.suback):
            if not fut.done():
                fut.set_exception(exc or ConnectionError("connection closed"))
                fut.exception()  # retrieved: nobody may await it any more

    def data_received(self, data: bytes) -> None:
        buf = self._buf + data
        i = 0
        while True:
            parsed = packet_at(buf, i)
            if parsed is None:
                break
            first, start, end = parsed
            self._packet(first, buf[start:end])
            i = end
        self._buf = buf[i:]
        if len(self._buf) > MAX_STATS_PACKET and self.transport is not None:
            self.transport.close()

    def _packet(self, first: int, body: bytes) -> None:
        kind = first >> 4
        if kind == 2 and not self.connack.done() and len(body) >= 2:
            self.connack.set_result(body[1])
        elif kind == 9 and not self.suback.done() and len(body) >= 3:
            self.suback.set_result(body[2])
        elif kind == 3 and len(body) >= 2:
            tlen = (body[0] << 8) | body[1]
            topic = body[2:2 + tlen].decode(errors="replace")
            payload = body[2 + tlen + (2 if (first >> 1) & 3 else 0):]
            name = "/".join(topic.split("/")[4:])  # $SYS/brokers/<node>/stats/<name...>
            try:
                self.values[name] = float(payload)
            except ValueError:
                return
            if name == "uptime":
                self.rounds += 1
                self.round_seen.set()


class StatsMonitor:
    """One StatsReader per node; `snapshot()` returns every node's counters as of a round published after
    the call began."""

    def __init__(self, sys_interval: float) -> None:
        self.sys_interval = sys_interval
        self.readers: dict[str, StatsReader] = {}

    async def open(self, nodes: list[NodeProc], timeout: float = 5.0) -> StatsMonitor:
        loop = asyncio.get_running_loop()
        for node in nodes:
            _, reader = await asyncio.wait_for(loop.create_connection(StatsReader, node.host, node.port), timeout)
            self.readers[node.node_id] = reader
            assert reader.transport is not None
            reader.transport.write(connect_packet(f"lt-stats-{node.node_id}-{os.getpid()}", keepalive=600))
            if await asyncio.wait_for(asyncio.shield(reader.connack), timeout) != 0:
                raise RuntimeError(f"{node.node_id} refused the stats reader")
            reader.transport.write(subscribe_packet(1, f"$SYS/brokers/{node.node_id}/stats/#", 0))
            if await asyncio.wait_for(asyncio.shield(reader.suback), timeout) >= 0x80:
                raise RuntimeError(f"{node.node_id} refused the $SYS subscription")
        return self

    async def snapshot(self, node_ids: list[str] | None = None) -> tuple[float, dict[str, dict[str, float]]]:
        """(monotonic time, {node: {name: value}}) once each node (alive ones: `node_ids`) sent a new round."""
        ids = list(self.readers) if node_ids is None else node_ids
        start = {nid: self.readers[nid].rounds for nid in ids}
        deadline = time.monotonic() + STATS_TIMEOUT_ROUNDS * self.sys_interval + 2.0
        for nid in ids:
            reader = self.readers[nid]
            while reader.rounds <= start[nid]:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no $SYS stats round from {nid} within {STATS_TIMEOUT_ROUNDS} intervals")
                reader.round_seen.clear()
                try:
                    await asyncio.wait_for(reader.round_seen.wait(), left)
                except TimeoutError:
                    continue
        return time.monotonic(), {nid: copy.copy(self.readers[nid].values) for nid in ids}

    def close(self) -> None:
        for reader in self.readers.values():
            if reader.transport is not None and not reader.transport.is_closing():
                reader.transport.write(DISCONNECT)
                reader.transport.close()
        self.readers.clear()
