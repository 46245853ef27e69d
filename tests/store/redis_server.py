"""Test helper: private `redis-server`s in temp dirs with AOF `appendfsync always`: one, or a 3-master cluster.

`RedisServer.start()` waits until it answers PING; `kill()` is SIGKILL (a crash: only what AOF fsynced
survives); `restart()` kills and starts it again on the same port and dir; `stop()` ends it; `flushall()`
empties it. `RedisClusterServers` starts N servers with `--cluster-enabled yes`, joins them with
`redis-cli --cluster create ... --cluster-replicas 0` (the slots spread over N masters) and waits for
`cluster_state:ok`; `restart()` kills every master and starts them again from their AOF and nodes.conf.
Tests only; talks RESP over plain sockets so it needs no client library.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

from loadtest.ports import free_port, free_port_pair

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
REDIS_CLI = shutil.which("redis-cli") or "/usr/bin/redis-cli"
START_TIMEOUT = 10.0  # seconds until PING must answer
CLUSTER_TIMEOUT = 20.0  # seconds until a new or restarted cluster must report cluster_state:ok
CLUSTER_BUS_OFFSET = 10000  # Redis Cluster's bus port is the client port + 10000


def available() -> bool:
    return Path(REDIS_SERVER).exists()


def cluster_available() -> bool:
    return available() and Path(REDIS_CLI).exists()


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_port() -> int:
    return free_port()


def _free_cluster_port() -> int:
    """A free port whose bus port (+10000) is free too, both below the ephemeral range (`loadtest.ports`)."""
    return free_port_pair(CLUSTER_BUS_OFFSET)


def command(port: int, *args: str, timeout: float = 2.0) -> bytes:
    """Send one command; return the raw reply (enough for +OK, :n, $bulk and -ERR here)."""
    payload = f"*{len(args)}\r\n".encode() + b"".join(
        f"${len(a.encode())}\r\n".encode() + a.encode() + b"\r\n" for a in args)
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(payload)
        data = s.recv(65536)
        if data.startswith(b"$"):
            size = int(data[1 : data.index(b"\r\n")])
            want = data.index(b"\r\n") + 2 + size + 2
            while len(data) < want:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        return data


def _ping(port: int) -> bool:
    try:
        return command(port, "PING", timeout=0.5).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    def __init__(self, data_dir: Path, *, appendfsync: str = "always", port: int = 0,
                 extra_args: tuple[str, ...] = ()) -> None:
        self.dir = data_dir
        self.appendfsync = appendfsync
        self.port = port or _free_port()
        self.extra_args = extra_args
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        if self._proc is not None:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        log = open(self.dir / "redis.log", "ab")  # noqa: SIM115 - the child holds it; closed below
        try:
            self._proc = subprocess.Popen(
                [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
                 "--save", "", "--appendonly", "yes", "--appendfsync", self.appendfsync,
                 "--daemonize", "no", "--loglevel", "warning", *self.extra_args],
                stdout=log, stderr=subprocess.STDOUT,
            )
        finally:
            log.close()
        deadline = time.monotonic() + START_TIMEOUT
        while not _ping(self.port):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"redis-server did not start; see {self.dir / 'redis.log'}")
            time.sleep(0.01)  # the start-up wait's poll interval

    def kill(self) -> None:
        """SIGKILL and reap: nothing gets a chance to flush."""
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.kill()
            proc.wait(timeout=10)

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)

    def restart(self) -> None:
        self.kill()
        self.start()

    def flushall(self) -> None:
        reply = command(self.port, "FLUSHALL")
        if not reply.startswith(b"+OK"):
            raise RuntimeError(f"FLUSHALL failed: {reply!r}")


class RedisClusterServers:
    """A real Redis Cluster of `masters` masters (no replicas) on 127.0.0.1."""

    def __init__(self, data_dir: Path, *, masters: int = 3) -> None:
        self.nodes = [
            RedisServer(data_dir / f"node{i}", port=_free_cluster_port(), extra_args=(
                "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", "5000"))
            for i in range(masters)
        ]

    @property
    def url(self) -> str:
        return "redis-cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    @property
    def ports(self) -> list[int]:
        return [n.port for n in self.nodes]

    def start(self) -> None:
        try:
            for node in self.nodes:
                node.start()
            if b"cluster_slots_assigned:0\r\n" in command(self.nodes[0].port, "CLUSTER", "INFO"):
                out = subprocess.run(
                    [REDIS_CLI, "--cluster", "create", *(f"127.0.0.1:{n.port}" for n in self.nodes),
                     "--cluster-replicas", "0", "--cluster-yes"],
                    capture_output=True, timeout=CLUSTER_TIMEOUT, check=False)
                if out.returncode != 0:
                    raise RuntimeError(f"redis-cli --cluster create failed: {out.stdout[-2000:]!r}")
            self.wait_ok()
        except BaseException:
            self.stop()
            raise

    def wait_ok(self) -> None:
        """Every node reports cluster_state:ok with all 16384 slots served."""
        deadline = time.monotonic() + CLUSTER_TIMEOUT
        while True:
            infos = []
            for node in self.nodes:
                try:
                    infos.append(command(node.port, "CLUSTER", "INFO"))
                except OSError:
                    infos.append(b"")
            if all(b"cluster_state:ok" in i and b"cluster_slots_ok:16384" in i for i in infos):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"cluster not ok: {infos!r}")
            time.sleep(0.05)  # the poll interval of this wait

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def restart(self) -> None:
        """kill -9 every master, start them again (AOF + nodes.conf), wait until the cluster is ok."""
        for node in self.nodes:
            node.kill()
        for node in self.nodes:
            node.start()
        self.wait_ok()

    def flushall(self) -> None:
        for node in self.nodes:
            node.flushall()
