"""Start and stop the brokers under test (Tidewire, Mosquitto) on free ports, pinned to one core.

Also samples a server's RSS (/proc/<pid>/status VmRSS) and CPU time (/proc/<pid>/stat) for the reports.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from loadtest.client import DISCONNECT, connect_packet

SERVER_CORE = 0
MOSQUITTO_FALLBACK = "/usr/sbin/mosquitto"
_CLK_TCK = os.sysconf("SC_CLK_TCK")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


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

    @property
    def pid(self) -> int:
        return self.proc.pid

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
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def wait_ready(host: str, port: int, proc: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
    """Poll until the broker answers a CONNECT with a CONNACK; fail fast if the process exits."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with code {proc.returncode}")
        try:
            with socket.create_connection((host, port), timeout=1.0) as s:
                s.sendall(connect_packet("loadtest-probe", keepalive=10))
                reply = s.recv(4)
                if reply[:1] == b"\x20":
                    s.sendall(DISCONNECT)
                    return
                last = RuntimeError(f"unexpected reply {reply!r}")
        except OSError as e:
            last = e
        time.sleep(0.05)
    raise TimeoutError(f"server on {host}:{port} not ready after {timeout}s: {last}")


def _spawn(name: str, cmd: list[str], host: str, port: int, workdir: Path, label: str,
           env: dict[str, str] | None = None, timeout: float = 15.0) -> Server:
    log = (workdir / "server.log").open("wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env=env, cwd=workdir)
    log.close()  # the child holds its own copy of the descriptor
    server = Server(name, host, port, proc, workdir, label or name)
    try:
        wait_ready(host, port, proc, timeout)
    except BaseException as e:
        tail = server.log_tail()
        server.stop()
        raise RuntimeError(f"{name} failed to start ({e}); command: {' '.join(cmd)}\n{tail}") from e
    return server


def start_mosquitto(host: str = "127.0.0.1", port: int | None = None, *, core: int | None = SERVER_CORE,
                    max_inflight: int = 0, max_queued: int = 100_000) -> Server:
    """Mosquitto with a generated config: anonymous, no persistence, TCP_NODELAY like asyncio servers."""
    exe = mosquitto_path()
    if exe is None:
        raise RuntimeError("mosquitto not found on PATH")
    port = port or free_port(host)
    workdir = Path(tempfile.mkdtemp(prefix="loadtest-mosquitto-"))
    conf = workdir / "mosquitto.conf"
    conf.write_text(
        f"listener {port} {host}\n"
        "allow_anonymous true\n"
        f"max_inflight_messages {max_inflight}\n"
        f"max_queued_messages {max_queued}\n"
        "max_connections -1\n"
        "set_tcp_nodelay true\n"
        "persistence false\n"
        "log_dest stderr\n"
        "log_type error\n"
        "log_type warning\n"
    )
    return _spawn("mosquitto", [*_pin_prefix(core), exe, "-c", str(conf)], host, port, workdir, "mosquitto")


def tidewire_command(host: str, port: int, data_dir: Path) -> list[str]:
    return [sys.executable, "-m", "gateway", "serve", "--host", host, "--port", str(port),
            "--data-dir", str(data_dir)]


def start_tidewire(host: str = "127.0.0.1", port: int | None = None, *, core: int | None = SERVER_CORE,
                   fsync: str | None = None, extra_env: dict[str, str] | None = None) -> Server:
    """`python -m gateway serve` on a fresh data dir; fsync None keeps the gateway's own default."""
    port = port or free_port(host)
    workdir = Path(tempfile.mkdtemp(prefix="loadtest-tidewire-"))
    env = dict(os.environ)
    env.setdefault("TIDEWIRE_LOG_LEVEL", "warning")
    if fsync:
        env["TIDEWIRE_FSYNC"] = fsync
    env.update(extra_env or {})
    cmd = [*_pin_prefix(core), *tidewire_command(host, port, workdir / "data")]
    label = f"tidewire(fsync={fsync})" if fsync else "tidewire"
    return _spawn("tidewire", cmd, host, port, workdir, label, env=env, timeout=30.0)


def start(name: str, *, host: str = "127.0.0.1", core: int | None = SERVER_CORE,
          fsync: str | None = None) -> Server:
    if name == "mosquitto":
        return start_mosquitto(host, core=core)
    if name == "tidewire":
        return start_tidewire(host, core=core, fsync=fsync)
    raise ValueError(f"unknown target {name!r}")
