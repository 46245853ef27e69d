"""A private RabbitMQ node for the AMQP benchmarks: start it on free ports in a temp dir, wait until AMQP answers,
and stop every process it started (epmd, the rabbitmq-server script, beam.smp and its port programs).

Debian's `rabbitmq-server` package (3.10): /usr/sbin/rabbitmq-server switches to the `rabbitmq` user and the
system dirs, so the node is started through /usr/lib/rabbitmq/bin/rabbitmq-server with everything redirected by
environment: RABBITMQ_NODENAME (unique per process), RABBITMQ_NODE_IP_ADDRESS/RABBITMQ_NODE_PORT (AMQP),
RABBITMQ_DIST_PORT (Erlang distribution), RABBITMQ_MNESIA_BASE, RABBITMQ_LOG_BASE, RABBITMQ_CONFIG_FILE,
RABBITMQ_ENABLED_PLUGINS_FILE (`[].`: no management plugin), RABBITMQ_PID_FILE, RABBITMQ_CONF_ENV_FILE (so
/etc/rabbitmq/rabbitmq-env.conf is not read) and HOME (the Erlang cookie). Erlang starts a detached `epmd
-daemon` when none answers, which would outlive us; so we run our own epmd in the foreground on a free port
(ERL_EPMD_PORT) and end it ourselves. The node runs in its own session, so one killpg reaches beam.smp and its
children (erl_child_setup, inet_gethost).
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from loadtest.ports import free_port
from loadtest.redis_proc import terminate

RABBITMQ_SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"  # the unwrapped script (the /usr/sbin one su's)
EPMD_FALLBACK = "/usr/lib/erlang/bin/epmd"
START_TIMEOUT = 60.0  # s until AMQP answers: a first boot creates the mnesia schema (~5 s on an idle machine)
EPMD_TIMEOUT = 5.0  # s until our epmd accepts connections
STOP_TIMEOUT = 15.0  # s for a graceful stop (SIGTERM) before SIGKILL
PROBE_TIMEOUT = 1.0  # s for one AMQP handshake probe
AMQP_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_METHOD = 1  # an AMQP 0-9-1 method frame: the server's Connection.Start answers our protocol header


def rabbitmq_server_path() -> str | None:
    return RABBITMQ_SERVER if os.access(RABBITMQ_SERVER, os.X_OK) else None


def epmd_path() -> str | None:
    found = shutil.which("epmd")
    if found:
        return found
    return EPMD_FALLBACK if os.access(EPMD_FALLBACK, os.X_OK) else None


def available() -> bool:
    """Whether a RabbitMQ node can be started here (Debian's rabbitmq-server package, with epmd)."""
    return rabbitmq_server_path() is not None and epmd_path() is not None


def amqp_answers(host: str, port: int, timeout: float = PROBE_TIMEOUT) -> bool:
    """True when the server answers an AMQP 0-9-1 protocol header with a method frame (Connection.Start)."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.sendall(AMQP_HEADER)
            first = s.recv(1)
    except OSError:
        return False
    return first == bytes([FRAME_METHOD])


def wait_amqp(host: str, port: int, proc: subprocess.Popen[bytes] | None, timeout: float) -> None:
    """Poll until AMQP answers; RuntimeError when `proc` exits first or the time is up."""
    deadline = time.monotonic() + timeout
    while not amqp_answers(host, port):
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"exited with code {proc.returncode} before AMQP answered on {host}:{port}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"AMQP did not answer on {host}:{port} within {timeout:.0f} s")
        time.sleep(0.1)


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=PROBE_TIMEOUT):
            return True
    except OSError:
        return False


def _process_table() -> dict[int, tuple[int, str]]:
    """pid → (parent pid, start time in clock ticks) of every process, from /proc."""
    table: dict[int, tuple[int, str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_text()
        except OSError:
            continue  # it exited meanwhile
        fields = raw[raw.rindex(")") + 2:].split()  # the command name may contain spaces
        table[int(entry.name)] = (int(fields[1]), fields[19])
    return table


def descendants(root: int) -> dict[int, str]:
    """pid → start time of every process below `root` (the start time tells a reused pid apart)."""
    table = _process_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found: dict[int, str] = {}
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        found[pid] = table[pid][1]
        todo += children.get(pid, [])
    return found


def _alive(procs: dict[int, str]) -> list[int]:
    table = _process_table()
    return [pid for pid, started in procs.items() if pid in table and table[pid][1] == started]


def _signal_all(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _end_tree(proc: subprocess.Popen[bytes], timeout: float) -> None:
    """SIGTERM to the process group `proc` leads (beam.smp stops the node cleanly); then whatever is left of
    the processes below it, which includes port programs that erl_child_setup put in sessions of their own
    (inet_gethost): SIGTERM, then SIGKILL."""
    below = descendants(proc.pid)
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        left = _alive(below)
        if proc.poll() is not None and not left:
            break
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass
        _signal_all(left, sig)
        grace = time.monotonic() + min(timeout, 2.0)
        while (proc.poll() is None or _alive(below)) and time.monotonic() < grace:
            time.sleep(0.05)
    proc.wait(timeout)


class RabbitProc:
    """A RabbitMQ node (guest/guest, vhost /, no plugins) on free ports; `prefix` is prepended to its command
    (e.g. `taskset -c 0`: beam then runs one scheduler per allowed core). A context manager: leaving it stops
    the node and its epmd and removes the dir."""

    def __init__(self, *, prefix: list[str] | None = None, host: str = "127.0.0.1",
                 start_timeout: float = START_TIMEOUT) -> None:
        self.host = host
        self.prefix = list(prefix or [])
        self.start_timeout = start_timeout
        self.port = free_port(host)
        self.dist_port = free_port(host)
        self.epmd_port = free_port(host)
        self.nodename = f"loadtest-{os.getpid()}-{secrets.token_hex(3)}@localhost"
        self.dir = Path(tempfile.mkdtemp(prefix="loadtest-rabbitmq-"))
        self.proc: subprocess.Popen[bytes] | None = None
        self.epmd: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@{self.host}:{self.port}/%2F"

    @property
    def pid(self) -> int:
        """beam.smp's pid once it has written its pid file, else the start script's (0 before start)."""
        try:
            return int((self.dir / "rabbit.pid").read_text().strip())
        except (OSError, ValueError):
            return self.proc.pid if self.proc is not None else 0

    def environment(self) -> dict[str, str]:
        d = self.dir
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RABBITMQ_", "ERL_"))}
        env.update({
            "HOME": str(d),
            "ERL_EPMD_PORT": str(self.epmd_port),
            "ERL_EPMD_ADDRESS": self.host,
            "RABBITMQ_NODENAME": self.nodename,
            "RABBITMQ_NODE_IP_ADDRESS": self.host,
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_MNESIA_BASE": str(d / "mnesia"),
            "RABBITMQ_LOG_BASE": str(d / "log"),
            "RABBITMQ_LOGS": "-",  # to stdout, i.e. rabbit.log below
            "RABBITMQ_CONFIG_FILE": str(d / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(d / "advanced.config"),  # absent: nothing advanced
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(d / "enabled_plugins"),
            "RABBITMQ_CONF_ENV_FILE": str(d / "rabbitmq-env.conf"),
            "RABBITMQ_PID_FILE": str(d / "rabbit.pid"),
        })
        return env

    def _write_files(self) -> None:
        d = self.dir
        (d / "enabled_plugins").write_text("[].\n")
        (d / "rabbitmq-env.conf").write_text("")
        (d / "rabbitmq.conf").write_text(f"listeners.tcp.1 = {self.host}:{self.port}\n")
        for sub in ("mnesia", "log"):
            (d / sub).mkdir(exist_ok=True)

    def _start_epmd(self) -> None:
        exe = epmd_path()
        if exe is None:
            raise RuntimeError("epmd not found (Erlang is not installed)")
        with (self.dir / "epmd.log").open("ab") as log:
            self.epmd = subprocess.Popen([exe, "-port", str(self.epmd_port), "-address", self.host], stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + EPMD_TIMEOUT
        while not _port_open(self.host, self.epmd_port):
            if self.epmd.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"epmd did not start on port {self.epmd_port}: {self.log_tail('epmd.log')}")
            time.sleep(0.02)

    def start(self) -> RabbitProc:
        exe = rabbitmq_server_path()
        if exe is None:
            raise RuntimeError("rabbitmq-server not installed")
        try:
            self._write_files()
            self._start_epmd()
            with (self.dir / "rabbit.log").open("ab") as log:
                self.proc = subprocess.Popen([*self.prefix, exe], stdout=log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, env=self.environment(), cwd=self.dir,
                                             start_new_session=True)
            wait_amqp(self.host, self.port, self.proc, self.start_timeout)
        except BaseException as e:
            tail = self.log_tail()
            self.stop()
            raise RuntimeError(f"rabbitmq-server did not start ({e}): {tail}") from e
        return self

    def log_tail(self, name: str = "rabbit.log", chars: int = 2000) -> str:
        try:
            return (self.dir / name).read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            _end_tree(proc, timeout)
        epmd, self.epmd = self.epmd, None
        if epmd is not None:
            terminate(epmd, timeout)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RabbitProc:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
