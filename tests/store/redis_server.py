"""Test helper: private `redis-server`s in temp dirs with AOF `appendfsync always`: one, a 3-master cluster, or
a primary with a replica watched by 3 `redis-sentinel`s.

`RedisServer.start()` waits until it answers PING; `kill()` is SIGKILL (a crash: only what AOF fsynced
survives); `restart()` kills and starts it again on the same port and dir; `stop()` ends it; `flushall()`
empties it. `RedisClusterServers` starts N servers with `--cluster-enabled yes`, joins them with
`redis-cli --cluster create ... --cluster-replicas 0` (the slots spread over N masters) and waits for
`cluster_state:ok`; `restart()` kills every master and starts them again from their AOF and nodes.conf.
`RedisSentinelServers` starts a primary, a replica of it and 3 sentinels (quorum 2, the primary down after
`SENTINEL_DOWN_AFTER_MS`) and waits until every sentinel sees both servers and the other sentinels;
`primary_port()` asks a sentinel, `wait_failover(old)` waits until every sentinel names another primary.
Tests only; talks RESP over plain sockets so it needs no client library.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from loadtest.ports import free_port, free_port_pair

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
REDIS_CLI = shutil.which("redis-cli") or "/usr/bin/redis-cli"
REDIS_SENTINEL = shutil.which("redis-sentinel") or "/usr/bin/redis-sentinel"
SENTINEL_MASTER = "tidewire"  # the name the sentinels monitor the primary under
SENTINEL_DOWN_AFTER_MS = 1000  # no answer for this long: a sentinel deems the primary down
SENTINEL_FAILOVER_TIMEOUT_MS = 5000
FAST_SYNC = ("--repl-diskless-sync-delay", "0")  # a replica's full sync at once, not after 5 s waiting for others
SENTINEL_TIMEOUT = 20.0  # seconds until the sentinels know each other, or until a failover is seen
START_TIMEOUT = 10.0  # seconds until PING must answer
CLUSTER_TIMEOUT = 20.0  # seconds until a new or restarted cluster must report cluster_state:ok
CLUSTER_BUS_OFFSET = 10000  # Redis Cluster's bus port is the client port + 10000


def available() -> bool:
    return Path(REDIS_SERVER).exists()


def cluster_available() -> bool:
    return available() and Path(REDIS_CLI).exists()


def sentinel_available() -> bool:
    return available() and Path(REDIS_SENTINEL).exists()


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

    def pause(self) -> None:
        """SIGSTOP: alive but silent (a stalled host), until `resume()`."""
        assert self._proc is not None
        self._proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self._proc is not None
        self._proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.send_signal(signal.SIGCONT)  # a paused server could not end
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


class RedisSentinelServers:
    """A primary and one replica (`servers`, each a `RedisServer`) watched by `sentinels` redis-sentinels."""

    def __init__(self, data_dir: Path, *, sentinels: int = 3) -> None:
        self.dir = data_dir
        primary = RedisServer(data_dir / "redis-a", extra_args=FAST_SYNC)
        replica = RedisServer(data_dir / "redis-b",
                              extra_args=(*FAST_SYNC, "--replicaof", "127.0.0.1", str(primary.port)))
        self.servers = [primary, replica]
        self.sentinel_ports = [_free_port() for _ in range(sentinels)]
        self._sentinels: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        return ("redis-sentinel://" + ",".join(f"127.0.0.1:{p}" for p in self.sentinel_ports)
                + f"/{SENTINEL_MASTER}/0")

    def server(self, port: int) -> RedisServer:
        return next(s for s in self.servers if s.port == port)

    def start(self) -> None:
        try:
            for server in self.servers:
                server.start()
            primary = self.servers[0].port
            for i, port in enumerate(self.sentinel_ports):
                d = self.dir / f"sentinel{i}"
                d.mkdir(parents=True, exist_ok=True)
                conf = d / "sentinel.conf"  # the sentinel rewrites it with what it learns
                conf.write_text(
                    f"port {port}\nbind 127.0.0.1\ndir {d}\n"
                    f"sentinel monitor {SENTINEL_MASTER} 127.0.0.1 {primary} 2\n"
                    f"sentinel down-after-milliseconds {SENTINEL_MASTER} {SENTINEL_DOWN_AFTER_MS}\n"
                    f"sentinel failover-timeout {SENTINEL_MASTER} {SENTINEL_FAILOVER_TIMEOUT_MS}\n")
                log = open(d / "sentinel.log", "ab")  # noqa: SIM115 - the child holds it; closed below
                try:
                    self._sentinels.append(subprocess.Popen([REDIS_SENTINEL, str(conf), "--loglevel", "warning"],
                                                            stdout=log, stderr=subprocess.STDOUT))
                finally:
                    log.close()
            self.wait_ready(primary)
        except BaseException:
            self.stop()
            raise

    @staticmethod
    def _info(port: int, section: str) -> bytes:
        try:
            return command(port, "INFO", section, timeout=0.5)
        except OSError:
            return b""

    def _sentinel_info(self, port: int) -> bytes:
        return self._info(port, "sentinel")

    def wait_ready(self, primary: int) -> None:
        """Every sentinel names `primary` with one replica and knows every other sentinel (so it can vote), and
        the replica is in sync."""
        want = (f"status=ok,address=127.0.0.1:{primary},slaves=1,"
                f"sentinels={len(self.sentinel_ports)}").encode()
        replica = next(s.port for s in self.servers if s.port != primary)
        deadline = time.monotonic() + SENTINEL_TIMEOUT
        while not (all(want in self._sentinel_info(p) for p in self.sentinel_ports)
                   and b"master_link_status:up" in self._info(replica, "replication")):
            if time.monotonic() > deadline:
                raise RuntimeError(f"sentinels not ready: {[self._sentinel_info(p) for p in self.sentinel_ports]}")
            time.sleep(0.05)  # the poll interval of this wait

    def primary_port(self, sentinel: int = 0) -> int:
        """The primary's port as one sentinel names it."""
        reply = command(self.sentinel_ports[sentinel], "SENTINEL", "get-master-addr-by-name", SENTINEL_MASTER)
        return int(reply.split(b"\r\n")[4])

    def wait_failover(self, old: int) -> int:
        """Until every sentinel names a primary other than port `old`; returns its port."""
        deadline = time.monotonic() + SENTINEL_TIMEOUT
        while True:
            try:
                ports = {self.primary_port(i) for i in range(len(self.sentinel_ports))}
            except (OSError, ValueError, IndexError):
                ports = set()
            if len(ports) == 1 and old not in ports:
                return ports.pop()
            if time.monotonic() > deadline:
                raise RuntimeError(f"no failover from {old}: sentinels name {ports}")
            time.sleep(0.05)  # the poll interval of this wait

    def rejoin(self, port: int, primary: int) -> None:
        """Start the stopped server on `port` again as a replica of `primary` (what the sentinels would make of a
        returning old primary some seconds later, sooner)."""
        server = self.server(port)
        server.extra_args = (*FAST_SYNC, "--replicaof", "127.0.0.1", str(primary))
        server.start()

    def stop(self) -> None:
        procs, self._sentinels = self._sentinels, []
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        for server in self.servers:
            server.stop()

    def flushall(self) -> None:
        self.server(self.primary_port()).flushall()
