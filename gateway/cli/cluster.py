"""`tidewire cluster`: `up` runs a local cluster for trying it out (a Redis if none is given, then N nodes on
consecutive ports, stopped together on Ctrl-C/SIGTERM); `status` shows a cluster's membership as stored in Redis.

Nodes are `tidewire serve` child processes configured through the environment (`TIDEWIRE_NODE_ID`,
`TIDEWIRE_CLUSTER_PORT`, `TIDEWIRE_CLUSTER_SECRET`): the secret never appears on a command line (`ps`) or in
our output. Children run in their own sessions so that Ctrl-C reaches only this supervisor, which stops the
nodes first (they flush to Redis) and Redis last; on Linux they also get SIGTERM should the supervisor die.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Annotated, Any
from urllib.parse import urlsplit, urlunsplit

import typer

cluster_app = typer.Typer(add_completion=False, no_args_is_help=True,
                          help="A cluster of gateway nodes sharing one Redis.")

MAX_NODES = 64
START_TIMEOUT = 30.0  # s until Redis answers PING and every node accepts MQTT connections
STOP_TIMEOUT = 15.0  # s the nodes get to stop after SIGTERM before SIGKILL
POLL = 0.2  # s between checks of the children
LOG_TAIL = 20  # lines of a failed node's log shown
MEMBERS_PREFIX = "tw"  # lookup.membership's default key prefix
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the supervisor dies (Linux; elsewhere a no-op)."""
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.3):
            return True
    except OSError:
        return False


def _redis_pings(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.3) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def redact(url: str) -> str:
    """The URL without its password, for output."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{netloc}"))


def _tail(path: Path, lines: int = LOG_TAIL) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


@dataclass
class _Child:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path


class _Supervisor:
    """The children of one `cluster up` and their orderly end."""

    def __init__(self, host: str) -> None:
        self.host = host
        self.redis: _Child | None = None
        self.nodes: list[_Child] = []
        self.stopping = False

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.stopping = True

    def spawn(self, name: str, cmd: list[str], log: Path, env: dict[str, str] | None = None) -> _Child:
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                    start_new_session=True, preexec_fn=_die_with_parent)
        return _Child(name, proc, log)

    def wait_ready(self, child: _Child, ready: Any) -> None:
        """Until `ready()` or the child exits (startup failed) or we are told to stop."""
        deadline = time.monotonic() + START_TIMEOUT
        while not ready():
            if self.stopping:
                raise _Stopped
            if child.proc.poll() is not None:
                raise _Failed(f"{child.name} exited with code {child.proc.returncode} while starting; "
                              f"{child.log}:\n{_tail(child.log)}")
            if time.monotonic() > deadline:
                raise _Failed(f"{child.name} not ready within {START_TIMEOUT:.0f}s; {child.log}:\n{_tail(child.log)}")
            time.sleep(0.05)

    def watch(self) -> None:
        """Until a signal: report children that end (a node killed to try failover is not an error)."""
        reported: set[str] = set()
        while not self.stopping:
            for child in [*self.nodes, *([self.redis] if self.redis else [])]:
                code = child.proc.poll()
                if code is not None and child.name not in reported:
                    reported.add(child.name)
                    typer.echo(f"{child.name} exited with code {code} (log: {child.log})", err=True)
            time.sleep(POLL)

    def shutdown(self) -> None:
        """SIGTERM the nodes and wait (they flush to the store), then Redis; SIGKILL whatever hangs."""
        for group in (self.nodes, [self.redis] if self.redis else []):
            for child in group:
                if child.proc.poll() is None:
                    child.proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + STOP_TIMEOUT
            for child in group:
                try:
                    child.proc.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    typer.echo(f"{child.name} ignored SIGTERM for {STOP_TIMEOUT:.0f}s: killed", err=True)
                    child.proc.kill()
                    child.proc.wait()


class _Stopped(Exception):
    """A signal arrived during startup."""


class _Failed(Exception):
    """A child could not start."""


def _start_redis(sup: _Supervisor, data_dir: Path, port: int) -> str:
    server = shutil.which("redis-server")
    if server is None:
        raise _Failed("redis-server not found: install it, or pass --redis URL")
    port = port or _free_port(sup.host)
    rdir = data_dir / "redis"
    rdir.mkdir(parents=True, exist_ok=True)
    # appendfsync always: an acknowledged publish survives a Redis crash (see README for cheaper settings).
    cmd = [server, "--port", str(port), "--bind", sup.host, "--dir", str(rdir), "--save", "", "--appendonly", "yes",
           "--appendfsync", "always", "--daemonize", "no", "--loglevel", "warning"]
    sup.redis = sup.spawn("redis", cmd, rdir / "redis.log")
    sup.wait_ready(sup.redis, lambda: _redis_pings(sup.host, port))
    url = f"redis://{sup.host}:{port}/0"
    typer.echo(f"redis  {url}  pid={sup.redis.proc.pid}  AOF appendfsync always in {rdir}")
    return url


def _start_nodes(sup: _Supervisor, n: int, store: str, data_dir: Path, base_port: int, cluster_base_port: int,
                 secret: str) -> None:
    for i in range(n):
        node_id, port, cport = f"n{i + 1}", base_port + i, cluster_base_port + i
        ndir = data_dir / node_id
        env = {**os.environ, "TIDEWIRE_NODE_ID": node_id, "TIDEWIRE_CLUSTER_PORT": str(cport),
               "TIDEWIRE_CLUSTER_SECRET": secret}
        # Backend listeners on their default ports plus the node's index: several nodes share one host here.
        cmd = [sys.executable, "-m", "tidewire", "serve", "--host", sup.host, "--port", str(port),
               "--data-dir", str(ndir / "data"), "--store", store, "--amqp-port", str(5672 + i),
               "--rocketmq-port", str(8081 + i), "--admin-port", str(18083 + i)]
        sup.nodes.append(sup.spawn(node_id, cmd, ndir / "gateway.log", env))
    for i, child in enumerate(sup.nodes):
        sup.wait_ready(child, lambda port=base_port + i: _accepts(sup.host, port))
        typer.echo(f"{child.name}  mqtt://{sup.host}:{base_port + i}  admin http://{sup.host}:{18083 + i}  "
                   f"cluster {sup.host}:{cluster_base_port + i}  pid={child.proc.pid}  log {child.log}")


@cluster_app.command("up")
def up_command(
    nodes: Annotated[int, typer.Option(min=1, max=MAX_NODES, help="number of gateway nodes")] = 3,
    redis: Annotated[str | None, typer.Option(
        help="store of the cluster (redis://HOST:PORT/DB or redis-cluster://HOST:PORT,...); default: a local Redis")
    ] = None,
    base_port: Annotated[int, typer.Option(min=1, max=65535, help="MQTT port of n1; n2 gets the next, ...")] = 1883,
    cluster_base_port: Annotated[int | None, typer.Option(
        min=1, max=65535, help="cluster port of n1, then consecutive; default: base port + 10000")] = None,
    redis_port: Annotated[int, typer.Option(min=0, max=65535, help="port of the local Redis; 0: a free one")] = 0,
    host: Annotated[str, typer.Option(help="address every node and the local Redis listen on")] = "127.0.0.1",
    data_dir: Annotated[Path | None, typer.Option(
        help="directory for Redis data and node logs (kept); default: a temporary one, removed at exit")] = None,
    cluster_secret: Annotated[str | None, typer.Option(
        envvar="TIDEWIRE_CLUSTER_SECRET", help="secret the nodes prove to each other; default: a random one")] = None,
) -> None:
    """Start a local cluster for trying it out: Redis (unless --redis), then N nodes; Ctrl-C stops them all."""
    cbase = cluster_base_port if cluster_base_port is not None else base_port + 10000
    if base_port + nodes - 1 > 65535 or cbase + nodes - 1 > 65535:
        raise typer.BadParameter("ports beyond 65535")
    if not (cbase + nodes <= base_port or base_port + nodes <= cbase):
        raise typer.BadParameter("the MQTT and cluster port ranges overlap")
    temp = data_dir is None
    root = Path(tempfile.mkdtemp(prefix="tidewire-cluster-")) if data_dir is None else data_dir
    root.mkdir(parents=True, exist_ok=True)
    secret = cluster_secret or secrets.token_urlsafe(24)
    sup = _Supervisor(host)
    previous = {sig: signal.signal(sig, sup.on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    code = 0
    try:
        store = redis or _start_redis(sup, root, redis_port)
        _start_nodes(sup, nodes, store, root, base_port, cbase, secret)
        typer.echo(f"ready: {nodes} node(s); clients may connect to any. Ctrl-C stops them all. "
                   f"(`tidewire cluster status --redis {redact(store)}`)")
        sup.watch()
    except _Stopped:
        pass
    except _Failed as exc:
        typer.echo(f"tidewire cluster up: {exc}", err=True)
        code = 1
    finally:
        typer.echo("stopping")
        sup.shutdown()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if temp:
            shutil.rmtree(root, ignore_errors=True)
    typer.echo("stopped")
    raise typer.Exit(code)


# --- status ------------------------------------------------------------------------------------------------


def _redis_client(url: str) -> Any:
    import redis as redis_py  # an extra (tidewire[redis]): imported only when asked for

    if url.startswith("redis-cluster://"):
        from redis.cluster import ClusterNode, RedisCluster

        hosts = [h.rsplit(":", 1) for h in url.removeprefix("redis-cluster://").split("/")[0].split(",") if h]
        return RedisCluster(startup_nodes=[ClusterNode(h, int(p)) for h, p in hosts], socket_timeout=5)
    return redis_py.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)


def read_status(client: Any, prefix: str = MEMBERS_PREFIX) -> dict[str, Any]:
    """The membership as stored by `lookup.membership`: epoch and, per member, its address, how long it has been
    live, when its entry expires, and how many of the 4096 lookup slots it owns."""
    from tidewire.lookup.slots import SlotTable

    tag = "{" + prefix + "}:members"

    def text(v: Any) -> str:
        return v.decode() if isinstance(v, bytes) else str(v)

    members = {text(k): text(v) for k, v in client.hgetall(tag).items()}
    expiry = {text(k): float(v) for k, v in client.zrange(tag + ":exp", 0, -1, withscores=True)}
    since = {text(k): int(v) for k, v in client.hgetall(tag + ":since").items()}
    epoch = int(client.get(tag + ":epoch") or 0)
    seconds, micros = client.time()
    now_ms = seconds * 1000 + micros // 1000
    table = SlotTable(epoch, members)
    rows = [{"node": node, "address": addr,
             "live_for_s": round((now_ms - since[node]) / 1000, 1) if node in since else None,
             "expires_in_s": round((expiry[node] - now_ms) / 1000, 1) if node in expiry else None,
             "slots": len(table.slots_of(node))} for node, addr in sorted(members.items())]
    return {"epoch": epoch, "members": rows}


@cluster_app.command("status")
def status_command(
    redis: Annotated[str, typer.Option(envvar="TIDEWIRE_STORE", help="the cluster's store: redis://HOST:PORT/DB "
                                       "or redis-cluster://HOST:PORT,...")],
    prefix: Annotated[str, typer.Option(help="membership key prefix")] = MEMBERS_PREFIX,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """Members, membership epoch and lookup slots per member, read from the store."""
    try:
        client = _redis_client(redis)
    except ImportError:
        typer.echo("tidewire cluster status: needs redis-py (pip install 'tidewire[redis]')", err=True)
        raise typer.Exit(2) from None
    try:
        status = read_status(client, prefix)
    except Exception as exc:  # redis-py's errors: connection refused, timeout, wrong URL
        typer.echo(f"tidewire cluster status: cannot read {redact(redis)}: {type(exc).__name__}: {exc}", err=True)
        raise typer.Exit(2) from None
    finally:
        client.close()
    if as_json:
        typer.echo(json.dumps(status))
        return
    rows = status["members"]
    typer.echo(f"epoch {status['epoch']}, {len(rows)} member(s)")
    if rows:
        typer.echo(f"{'node':<12} {'cluster address':<24} {'live for':>9} {'expires in':>10} {'slots':>6}")
    for r in rows:
        live = "-" if r["live_for_s"] is None else f"{r['live_for_s']}s"
        exp = "-" if r["expires_in_s"] is None else f"{r['expires_in_s']}s"
        typer.echo(f"{r['node']:<12} {r['address']:<24} {live:>9} {exp:>10} {r['slots']:>6}")


if __name__ == "__main__":
    cluster_app()
