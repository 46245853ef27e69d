"""Test helper: a private `redis-server` on a free port in a temp dir, with AOF `appendfsync always`.

`start()` waits until it answers PING; `kill()` is SIGKILL (a crash: only what AOF fsynced survives);
`restart()` kills and starts it again on the same port and dir; `stop()` ends it. Tests only.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
START_TIMEOUT = 10.0  # seconds until PING must answer


def available() -> bool:
    return Path(REDIS_SERVER).exists()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    def __init__(self, data_dir: Path, *, appendfsync: str = "always") -> None:
        self.dir = data_dir
        self.appendfsync = appendfsync
        self.port = _free_port()
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
                 "--daemonize", "no", "--loglevel", "warning"],
                stdout=log, stderr=subprocess.STDOUT,
            )
        finally:
            log.close()
        deadline = time.monotonic() + START_TIMEOUT
        while not _ping(self.port):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"redis-server did not start; see {self.dir / 'redis.log'}")
            time.sleep(0.01)

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
