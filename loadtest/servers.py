"""Start and stop the brokers under test (Tidewire, Mosquitto) on free ports, pinned to one core.

Both start either plain (anonymous TCP) or with the same `Security` files: a password file with anonymous
access off, and/or an extra TLS listener with one certificate.

Also samples a server's RSS (/proc/<pid>/status VmRSS) and CPU time (/proc/<pid>/stat) for the reports.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from loadtest.client import DISCONNECT, Endpoint, connect_packet
from loadtest.ports import free_port
from loadtest.redis_proc import RedisProc, terminate
from loadtest.security import Security

SERVER_CORE = 0
REDIS_CORE = 1  # a Redis store's redis-server; on a 2-core machine it shares this core with the load generator
MOSQUITTO_FALLBACK = "/usr/sbin/mosquitto"
_CLK_TCK = os.sysconf("SC_CLK_TCK")
TLS_READY_TIMEOUT = 5.0  # s for the TLS listener once the plain one answers (both open at start-up)


def mosquitto_path() -> str | None:
    found = shutil.which("mosquitto")
    if found:
        return found
    return MOSQUITTO_FALLBACK if os.access(MOSQUITTO_FALLBACK, os.X_OK) else None


def rss_kb(pid: int) -> int:
    """Resident set size of pid in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def cpu_seconds(pid: int) -> float:
    """user + system CPU time of pid so far."""
    raw = Path(f"/proc/{pid}/stat").read_text()
    fields = raw[raw.rindex(")") + 2:].split()  # the command name may contain spaces
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


def core_busy_seconds(core: int) -> float:
    """Non-idle CPU time of one core so far (all processes), from /proc/stat."""
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith(f"cpu{core} "):
            ticks = [int(x) for x in line.split()[1:]]
            return (sum(ticks[:8]) - ticks[3] - ticks[4]) / _CLK_TCK  # minus idle and iowait
    return 0.0


def _pin_prefix(core: int | None) -> list[str]:
    taskset = shutil.which("taskset")
    if core is None or taskset is None or (os.cpu_count() or 1) <= core:
        return []
    return [taskset, "-c", str(core)]


@dataclass(slots=True)
class Server:
    """A running broker process; `stop()` (or the context manager) ends it and removes its work dir."""

    name: str
    host: str
    port: int
    proc: subprocess.Popen[bytes]
    workdir: Path
    label: str = ""
    tls_port: int | None = None
    security: Security = field(default_factory=Security)
    redis: RedisProc | None = None  # the private redis-server of a Redis store, stopped with the server
    replica: RedisProc | None = None  # its replica (store "redis-replica-waitN"), stopped with the server

    @property
    def pid(self) -> int:
        return self.proc.pid

    def endpoint(self, *, tls: bool = False, auth: bool = False) -> Endpoint:
        """How clients reach this server: its TLS port with the CA's context, and/or the bench users."""
        if tls and self.tls_port is None:
            raise ValueError(f"{self.label} has no TLS listener: start it with TLS files")
        if auth and not self.security.auth:
            raise ValueError(f"{self.label} has no password file: start it with auth files")
        sec = self.security
        if tls:
            assert self.tls_port is not None
            return Endpoint(self.host, self.tls_port, sec.client_context(), sec.server_hostname,
                            sec.users if auth else (), sec.password if auth else None)
        return Endpoint(self.host, self.port, users=sec.users if auth else (),
                        password=sec.password if auth else None)

    def rss_kb(self) -> int:
        return rss_kb(self.pid)

    def cpu_seconds(self) -> float:
        return cpu_seconds(self.pid)

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return (self.workdir / "server.log").read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self, timeout: float = 5.0) -> None:
        terminate(self.proc, timeout)
        shutil.rmtree(self.workdir, ignore_errors=True)
        if self.redis is not None:
            self.redis.stop()
        if self.replica is not None:
            self.replica.stop()

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _probe(host: str, port: int, tls: ssl.SSLContext | None, server_hostname: str | None) -> bytes:
    """Anonymous CONNECT; any CONNACK (a refusal too, when anonymous access is off) means ready."""
    with socket.create_connection((host, port), timeout=1.0) as raw:
        s = tls.wrap_socket(raw, server_hostname=server_hostname or host) if tls is not None else raw
        s.sendall(connect_packet("loadtest-probe", keepalive=10))
        reply = s.recv(4)
        if reply[:1] == b"\x20":
            s.sendall(DISCONNECT)
        return reply


def wait_ready(host: str, port: int, proc: subprocess.Popen[bytes], timeout: float = 15.0, *,
               tls: ssl.SSLContext | None = None, server_hostname: str | None = None) -> None:
    """Poll until the broker answers a CONNECT with a CONNACK; fail fast if the process exits."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with code {proc.returncode}")
        try:
            reply = _probe(host, port, tls, server_hostname)
            if reply[:1] == b"\x20":
                return
            last = RuntimeError(f"unexpected reply {reply!r}")
        except OSError as e:  # ssl.SSLError is an OSError too
            last = e
        time.sleep(0.05)
    raise TimeoutError(f"server on {host}:{port}{' (TLS)' if tls else ''} not ready after {timeout}s: {last}")


def _spawn(name: str, cmd: list[str], host: str, port: int, workdir: Path, label: str,
           env: dict[str, str] | None = None, timeout: float = 15.0, *, tls_port: int | None = None,
           security: Security | None = None) -> Server:
    sec = security or Security()
    log = (workdir / "server.log").open("wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env=env, cwd=workdir)
    log.close()  # the child holds its own copy of the descriptor
    server = Server(name, host, port, proc, workdir, label or name, tls_port, sec)
    try:
        wait_ready(host, port, proc, timeout)
        if tls_port is not None:
            wait_ready(host, tls_port, proc, TLS_READY_TIMEOUT, tls=sec.client_context(),
                       server_hostname=sec.server_hostname)
    except BaseException as e:
        tail = server.log_tail()
        server.stop()
        raise RuntimeError(f"{name} failed to start ({e}); command: {' '.join(cmd)}\n{tail}") from e
    return server


def mosquitto_security_conf(sec: Security, host: str, tls_port: int | None) -> str:
    """Config lines for the auth/TLS variants. Global settings (per_listener_settings false) so the password
    file and anonymous-off cover both listeners, as Tidewire's do."""
    lines = []
    if sec.auth:
        lines += [f"password_file {sec.password_file}", "allow_anonymous false"]
    else:
        lines.append("allow_anonymous true")
    if sec.tls and tls_port is not None:
        # certfile/keyfile/tls_version bind to the listener line above them, so this block comes last.
        lines += [f"listener {tls_port} {host}", f"certfile {sec.certfile}", f"keyfile {sec.keyfile}",
                  "tls_version tlsv1.2"]  # Mosquitto reads this as the minimum, like Tidewire's tls_min_version
    return "\n".join(lines) + "\n"


def _readable_by_broker_user(sec: Security, user: str = "mosquitto") -> None:
    """Started as root, Mosquitto drops to `user` before it reads password_file and the key, so hand that
    user the files (root, and so Tidewire, still reads them)."""
    if os.geteuid() != 0:
        return
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        return
    files = [f for f in (sec.password_file, sec.certfile, sec.keyfile, sec.cafile) if f is not None]
    for path in {f.parent for f in files} | set(files):
        os.chown(path, entry.pw_uid, entry.pw_gid)


def start_mosquitto(host: str = "127.0.0.1", port: int | None = None, *, core: int | None = SERVER_CORE,
                    max_inflight: int = 0, max_queued: int = 100_000, security: Security | None = None) -> Server:
    """Mosquitto with a generated config: no persistence, TCP_NODELAY like asyncio servers; anonymous unless
    `security` has a password file; plus a TLS listener when it has a certificate."""
    exe = mosquitto_path()
    if exe is None:
        raise RuntimeError("mosquitto not found on PATH")
    sec = security or Security()
    _readable_by_broker_user(sec)
    port = port or free_port(host)
    tls_port = free_port(host) if sec.tls else None
    workdir = Path(tempfile.mkdtemp(prefix="loadtest-mosquitto-"))
    conf = workdir / "mosquitto.conf"
    conf.write_text(
        "per_listener_settings false\n"  # security settings below are global: they cover every listener
        f"listener {port} {host}\n"
        "max_connections -1\n"
        f"max_inflight_messages {max_inflight}\n"
        f"max_queued_messages {max_queued}\n"
        "set_tcp_nodelay true\n"
        "persistence false\n"
        "log_dest stderr\n"
        "log_type error\n"
        "log_type warning\n"
        + mosquitto_security_conf(sec, host, tls_port)
    )
    return _spawn("mosquitto", [*_pin_prefix(core), exe, "-c", str(conf)], host, port, workdir,
                  "mosquitto" + sec.tags(), tls_port=tls_port, security=sec)


def tidewire_command(host: str, port: int, data_dir: Path, security: Security | None = None,
                     tls_port: int | None = None, store: str | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "tidewire", "serve", "--host", host, "--port", str(port),
           "--data-dir", str(data_dir), "--amqp-port", "off", "--rocketmq-port", "off", "--admin-port", "off"]
    if store:
        cmd += ["--store", store]
    sec = security or Security()
    if sec.auth:
        cmd += ["--password-file", str(sec.password_file), "--no-allow-anonymous"]
    if sec.tls and tls_port is not None:
        cmd += ["--tls-port", str(tls_port), "--certfile", str(sec.certfile), "--keyfile", str(sec.keyfile)]
    return cmd


def start_tidewire(host: str = "127.0.0.1", port: int | None = None, *, core: int | None = SERVER_CORE,
                   fsync: str | None = None, extra_env: dict[str, str] | None = None,
                   security: Security | None = None, store: str | None = None) -> Server:
    """`python -m tidewire serve` on a fresh data dir; fsync None keeps the gateway's own default; `store` is
    passed as `--store` (None: the embedded default)."""
    sec = security or Security()
    port = port or free_port(host)
    tls_port = free_port(host) if sec.tls else None
    workdir = Path(tempfile.mkdtemp(prefix="loadtest-tidewire-"))
    env = dict(os.environ)
    env.setdefault("TIDEWIRE_LOG_LEVEL", "warning")
    if fsync:
        env["TIDEWIRE_FSYNC"] = fsync
    env.update(extra_env or {})
    cmd = [*_pin_prefix(core), *tidewire_command(host, port, workdir / "data", sec, tls_port, store)]
    label = (f"tidewire(fsync={fsync})" if fsync else "tidewire") + sec.tags()
    return _spawn("tidewire", cmd, host, port, workdir, label, env=env, timeout=30.0, tls_port=tls_port,
                  security=sec)


def start_bare(host: str = "127.0.0.1", port: int | None = None, *, core: int | None = SERVER_CORE) -> Server:
    """`loadtest.bare_broker`: uvloop answering CONNECT with CONNACK and nothing else (the floor under a connect)."""
    port = port or free_port(host)
    workdir = Path(tempfile.mkdtemp(prefix="loadtest-bare-"))
    cmd = [*_pin_prefix(core), sys.executable, "-m", "loadtest.bare_broker", "--host", host, "--port", str(port)]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).parents[1]), env.get("PYTHONPATH")]))
    return _spawn("bare", cmd, host, port, workdir, "bare uvloop", env=env)


REPLICA_SYNC_TIMEOUT = 20.0  # s until a new replica reports its link to the primary up
REPLICA_WAIT_STORE = "redis-replica-wait"  # + N: a primary with one replica, acknowledgements wait for N replicas


def start_tidewire_redis(host: str = "127.0.0.1", *, core: int | None = SERVER_CORE,
                         redis_core: int | None = REDIS_CORE, security: Security | None = None,
                         replica_waits: int | None = None) -> Server:
    """Tidewire on the Redis store: a private redis-server (AOF appendfsync always) pinned to `redis_core`,
    stopped together with the node. `replica_waits` not None: the server gets a replica (AOF always too, on the
    same core) and the node `store_replicas = replica_waits`."""
    redis = RedisProc(prefix=_pin_prefix(redis_core), host=host).start()
    replica: RedisProc | None = None
    try:
        env: dict[str, str] = {}
        if replica_waits is not None:
            replica = RedisProc(prefix=_pin_prefix(redis_core), host=host, extra_args=(
                "--replicaof", host, str(redis.port), "--repl-diskless-sync-delay", "0")).start()
            deadline = time.monotonic() + REPLICA_SYNC_TIMEOUT
            while replica.info("replication").get("master_link_status") != "up":
                if time.monotonic() > deadline:
                    raise RuntimeError("the replica did not sync with its primary")
                time.sleep(0.05)
            env["TIDEWIRE_STORE_REPLICAS"] = str(replica_waits)
        server = start_tidewire(host, core=core, security=security, store=redis.url, extra_env=env)
    except BaseException:
        redis.stop()
        if replica is not None:
            replica.stop()
        raise
    server.redis = redis
    server.replica = replica
    server.label += "(store=redis)" if replica_waits is None else f"(store=redis, replica, waits={replica_waits})"
    return server


def start(name: str, *, host: str = "127.0.0.1", core: int | None = SERVER_CORE,
          fsync: str | None = None, security: Security | None = None, store: str = "embedded") -> Server:
    """`store` applies to Tidewire only: `embedded` (default), `redis` (a private redis-server on REDIS_CORE,
    or unpinned when `core` is None) or `redis-replica-waitN` (that server with one replica; acknowledgements
    wait for N replicas)."""
    if name == "mosquitto":
        return start_mosquitto(host, core=core, security=security)
    if name == "tidewire" and (store == "redis" or store.startswith(REPLICA_WAIT_STORE)):
        waits = store.removeprefix(REPLICA_WAIT_STORE)
        if store != "redis" and not waits.isdigit():
            raise ValueError(f"unknown store {store!r}: {REPLICA_WAIT_STORE}N, N the replicas a publish waits for")
        return start_tidewire_redis(host, core=core, redis_core=None if core is None else REDIS_CORE,
                                    security=security, replica_waits=int(waits) if store != "redis" else None)
    if name == "tidewire":
        return start_tidewire(host, core=core, fsync=fsync, security=security)
    raise ValueError(f"unknown target {name!r}")
