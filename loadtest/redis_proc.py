"""A private `redis-server` (or a 3-master Redis Cluster) for the benchmarks, AOF `appendfsync always`, optionally
pinned, and its INFO counters.

Small on purpose, like `tests/store/redis_server.py` (loadtest does not import from tests/): start on a free
port in a temp dir, wait for PING, stop and remove the dir. `info()` speaks just enough RESP over a plain
socket to read `INFO <section>`, so the load generator needs no Redis client library.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from loadtest.ports import free_port, free_port_pair

REDIS_SERVER_FALLBACK = "/usr/bin/redis-server"
CLUSTER_BUS_OFFSET = 10_000  # Redis Cluster's bus port is the client port + this
CLUSTER_TIMEOUT = 20.0  # s until a new cluster must report cluster_state:ok
START_TIMEOUT = 10.0  # s until PING must answer
IO_TIMEOUT = 5.0  # s for one INFO round trip
MAX_INFO_BYTES = 1 << 20  # an INFO answer larger than this is not Redis


def redis_server_path() -> str | None:
    found = shutil.which("redis-server")
    if found:
        return found
    return REDIS_SERVER_FALLBACK if Path(REDIS_SERVER_FALLBACK).exists() else None


def _free_port(host: str) -> int:
    return free_port(host)


def _command(*args: str) -> bytes:
    parts = [f"*{len(args)}\r\n".encode()]
    for a in args:
        raw = a.encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(raw), raw))
    return b"".join(parts)


def _recv_until(s: socket.socket, buf: bytes, size: int) -> bytes:
    while len(buf) < size:
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionError("redis closed the connection")
        buf += chunk
    return buf


def query(host: str, port: int, *args: str) -> bytes:
    """One command; returns a bulk or simple string reply's bytes (an error reply raises RuntimeError)."""
    with socket.create_connection((host, port), timeout=IO_TIMEOUT) as s:
        s.sendall(_command(*args))
        buf = b""
        while b"\r\n" not in buf:
            buf = _recv_until(s, buf, len(buf) + 1)
        head, _, rest = buf.partition(b"\r\n")
        kind = head[:1]
        if kind == b"+":
            return head[1:]
        if kind == b"-":
            raise RuntimeError(f"redis error: {head[1:].decode(errors='replace')}")
        if kind != b"$":
            raise RuntimeError(f"unexpected redis reply {head[:20]!r}")
        size = int(head[1:])
        if size < 0:
            return b""
        if size > MAX_INFO_BYTES:
            raise RuntimeError(f"redis reply of {size} bytes is too large")
        return _recv_until(s, rest, size + 2)[:size]


def parse_info(text: str) -> dict[str, str]:
    """`key:value` lines of an INFO answer (section headers and blank lines skipped)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and ":" in line:
            k, _, v = line.partition(":")
            out[k] = v
    return out


def command_calls(info: dict[str, str]) -> dict[str, int]:
    """`INFO commandstats` → calls per command, e.g. {"evalsha": 1200, "get": 10}."""
    calls: dict[str, int] = {}
    for k, v in info.items():
        if not k.startswith("cmdstat_"):
            continue
        fields = dict(f.partition("=")[::2] for f in v.split(","))
        calls[k.removeprefix("cmdstat_")] = int(fields.get("calls", "0"))
    return calls


@dataclass(slots=True)
class RedisCounters:
    """What Redis did between two samples: calls per command, commands and read events (round trips)."""

    calls: dict[str, int]
    commands: int  # total_commands_processed
    reads: int  # total_reads_processed: one per read event on a client socket, i.e. per round trip


def terminate(proc: subprocess.Popen[bytes], timeout: float) -> None:
    """SIGTERM, and SIGKILL if it is still running after `timeout` seconds (a no-op once it has exited)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)


class RedisProc:
    """`redis-server` on a free port with AOF `appendfsync always`; `prefix` is prepended to the command
    (e.g. `taskset -c 1`). A context manager: leaving it stops the server and removes its dir."""

    def __init__(self, *, prefix: list[str] | None = None, host: str = "127.0.0.1",
                 appendfsync: str = "always", port: int | None = None, extra_args: tuple[str, ...] = ()) -> None:
        self.host = host
        self.prefix = list(prefix or [])
        self.appendfsync = appendfsync
        self.extra_args = extra_args
        self.port = port or _free_port(host)
        self.dir = Path(tempfile.mkdtemp(prefix="loadtest-redis-"))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc is not None else 0

    def command(self) -> list[str]:
        exe = redis_server_path()
        if exe is None:
            raise RuntimeError("redis-server not found on PATH")
        return [*self.prefix, exe, "--port", str(self.port), "--bind", self.host, "--dir", str(self.dir),
                "--save", "", "--appendonly", "yes", "--appendfsync", self.appendfsync,
                "--daemonize", "no", "--loglevel", "warning", *self.extra_args]

    def start(self) -> RedisProc:
        cmd = self.command()
        with (self.dir / "redis.log").open("ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                if query(self.host, self.port, "PING") == b"PONG":
                    return self
            except (OSError, RuntimeError):
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                log_text = (self.dir / "redis.log").read_text(errors="replace")[-1000:]
                self.stop()
                raise RuntimeError(f"redis-server did not start ({' '.join(cmd)}): {log_text}")
            time.sleep(0.02)

    def info(self, section: str) -> dict[str, str]:
        return parse_info(query(self.host, self.port, "INFO", section).decode(errors="replace"))

    def counters(self) -> RedisCounters:
        stats = self.info("stats")
        return RedisCounters(command_calls(self.info("commandstats")), int(stats["total_commands_processed"]),
                             int(stats.get("total_reads_processed", "0")))

    def stop(self, timeout: float = 10.0) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            terminate(proc, timeout)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RedisProc:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def delta(before: RedisCounters, after: RedisCounters) -> RedisCounters:
    """after - before, without our own INFO calls: two per sample, each on its own connection, which costs
    Redis two read events (the command, then the close)."""
    calls = {k: v - before.calls.get(k, 0) for k, v in after.calls.items() if k != "info"}
    own = after.calls.get("info", 0) - before.calls.get("info", 0)
    return RedisCounters({k: v for k, v in calls.items() if v}, after.commands - before.commands - own,
                         after.reads - before.reads - 2 * own)


class RedisClusterProc:
    """`masters` cluster-enabled redis-servers (no replicas) joined by `redis-cli --cluster create`; the same
    start/stop/counters as `RedisProc`, counters summed over the masters."""

    def __init__(self, *, masters: int = 3, prefix: list[str] | None = None, host: str = "127.0.0.1") -> None:
        self.host = host
        self.servers = [RedisProc(prefix=prefix, host=host, port=free_port_pair(CLUSTER_BUS_OFFSET, host),
                                  extra_args=("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                                              "--cluster-node-timeout", "5000")) for _ in range(masters)]

    @property
    def url(self) -> str:
        return "redis-cluster://" + ",".join(f"{s.host}:{s.port}" for s in self.servers)

    def start(self) -> RedisClusterProc:
        try:
            for server in self.servers:
                server.start()
            cli = shutil.which("redis-cli")
            if cli is None:
                raise RuntimeError("redis-cli not found on PATH")
            out = subprocess.run([cli, "--cluster", "create", *(f"{s.host}:{s.port}" for s in self.servers),
                                  "--cluster-replicas", "0", "--cluster-yes"], capture_output=True, text=True,
                                 timeout=CLUSTER_TIMEOUT)
            if out.returncode != 0:
                raise RuntimeError(f"redis-cli --cluster create failed: {out.stdout[-2000:]}{out.stderr[-500:]}")
            deadline = time.monotonic() + CLUSTER_TIMEOUT
            while not all(parse_info(query(s.host, s.port, "CLUSTER", "INFO").decode()).get("cluster_state") == "ok"
                          for s in self.servers):
                if time.monotonic() > deadline:
                    raise RuntimeError("the Redis Cluster did not reach cluster_state:ok")
                time.sleep(0.05)
        except BaseException:
            self.stop()
            raise
        return self

    def counters(self) -> RedisCounters:
        parts = [s.counters() for s in self.servers]
        calls: dict[str, int] = {}
        for part in parts:
            for k, v in part.calls.items():
                calls[k] = calls.get(k, 0) + v
        return RedisCounters(calls, sum(p.commands for p in parts), sum(p.reads for p in parts))

    def stop(self, timeout: float = 10.0) -> None:
        for server in self.servers:
            server.stop(timeout)

    def __enter__(self) -> RedisClusterProc:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
