"""Fixtures for end-to-end tests: a real gateway process (Tidewire or Mosquitto) and paho clients
(`tests.integration.paho`, re-exported here).

Target: env `TIDEWIRE_TEST_TARGET` = `tidewire` (default) or `mosquitto` (reference broker, used to validate
the tests themselves). Tests that Mosquitto fails by design are marked `@pytest.mark.tidewire_only`.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from loadtest.ports import free_port
from tests.integration.paho import ConnResult, PahoClient, PahoFactory, Received, props_dict, v5_props
from tests.store.redis_server import RedisServer
from tests.waiting import wait_until

__all__ = ["ConnResult", "Gateway", "GatewayFactory", "PahoClient", "PahoFactory", "Received", "props_dict",
           "v5_props"]

TARGET = os.environ.get("TIDEWIRE_TEST_TARGET", "tidewire")
# Tidewire's store for the whole suite: `embedded` (default) or `redis` (each gateway gets a private redis-server).
STORE = os.environ.get("TIDEWIRE_TEST_STORE", "embedded")
START_TIMEOUT = 10.0
MOSQUITTO = "/usr/sbin/mosquitto"
MOSQUITTO_PASSWD = "/usr/bin/mosquitto_passwd"

# Tidewire settings that have a Mosquitto equivalent: env name -> mosquitto.conf option.
_MOSQUITTO_OPTIONS = {
    "TIDEWIRE_MAX_PACKET_SIZE": "max_packet_size",
    "TIDEWIRE_MAX_INFLIGHT": "max_inflight_messages",
    "TIDEWIRE_MAX_KEEPALIVE": "max_keepalive",
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if TARGET != "mosquitto":
        return
    skip = pytest.mark.skip(reason="Tidewire-specific behaviour; Mosquitto differs by design")
    for item in items:
        if item.get_closest_marker("tidewire_only") is not None:
            item.add_marker(skip)


def write_password_file(path: Path, users: dict[str, str], create: bool = True) -> Path:
    """Make (or with `create=False` add to) a Mosquitto password_file with the real `mosquitto_passwd`:
    `-c -b` for the first user of a new file, `-b` for every other."""
    first = create
    if create and not users:
        path.write_text("")
    for user, password in users.items():
        args = [MOSQUITTO_PASSWD, *(["-c"] if first else []), "-b", str(path), user, password]
        subprocess.run(args, check=True, capture_output=True, timeout=10)
        first = False
    return path


def delete_password_user(path: Path, user: str) -> None:
    subprocess.run([MOSQUITTO_PASSWD, "-D", str(path), user], check=True, capture_output=True, timeout=10)


def wait_accepting(port: int, timeout: float = 10.0) -> None:
    """Until something accepts TCP connections on 127.0.0.1:`port`."""
    wait_until(lambda: Gateway._accepts(port), timeout, what=f"something listening on port {port}", interval=0.05)


@dataclass(frozen=True, slots=True)
class TlsOptions:
    """The TLS settings of the mqtts/wss listeners (Mosquitto's options of the same names)."""

    certfile: Path
    keyfile: Path
    cafile: Path | None = None
    require_certificate: bool = False
    use_identity_as_username: bool = False
    use_subject_as_username: bool = False


class Gateway:
    """One broker process on a fixed port and data dir; restartable, always killed at teardown.

    Optional listeners get their own free ports: `tls_port` (when `tls` is given), `ws_port` (`ws=True`),
    `wss_port` (`wss=True`, needs `tls`), `amqp_port` (`amqp=True`), `rocketmq_port` (`rocketmq=True`) and
    `admin_port` (`admin=True`; the API's bearer token is `api_token`, passed as TIDEWIRE_API_TOKEN).
    `target` picks the broker for this one (default: the suite's `TIDEWIRE_TEST_TARGET`): a bridge test runs a
    Tidewire and a real Mosquitto side by side; `conf_lines` go into a Mosquitto's configuration file as they are.
    Authentication: `password_file`, `allow_anonymous` (None: the target's default, which is off once a password
    file is set).
    """

    def __init__(
        self,
        workdir: Path,
        acl_text: str | None = None,
        env: dict[str, str] | None = None,
        max_keepalive: int | None = None,
        *,
        password_file: Path | None = None,
        allow_anonymous: bool | None = None,
        tls: TlsOptions | None = None,
        ws: bool = False,
        wss: bool = False,
        amqp: bool = False,
        rocketmq: bool = False,
        admin: bool = False,
        extra_args: Sequence[str] = (),
        target: str | None = None,
        conf_lines: Sequence[str] = (),
    ) -> None:
        self.target = target or TARGET
        self.conf_lines = list(conf_lines)
        self.port = free_port()
        self.workdir = workdir
        self.data_dir = workdir / "data"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.env = dict(env or {})
        self.max_keepalive = max_keepalive
        self.acl_file: Path | None = None
        if acl_text is not None:
            self.acl_file = workdir / "acl.txt"
            self.acl_file.write_text(acl_text)
        self.password_file = password_file
        self.allow_anonymous = allow_anonymous
        self.tls = tls
        assert tls is not None or not wss, "wss needs tls"
        self.tls_port = free_port() if tls is not None else None
        self.ws_port = free_port() if ws else None
        self.wss_port = free_port() if wss else None
        # The backend listeners are on by default (5672, 8081): off here unless asked for, on free ports.
        self.amqp_port = free_port() if amqp else None
        self.rocketmq_port = free_port() if rocketmq else None
        # The admin HTTP port (metrics, API, dashboard) is on by default (18083): off unless asked for.
        self.admin_port = free_port() if admin else None
        self.api_token = secrets.token_urlsafe(16)
        if admin:
            self.env.setdefault("TIDEWIRE_API_TOKEN", self.api_token)
        self.extra_args = list(extra_args)
        self.log_path = workdir / "gateway.log"
        self.proc: subprocess.Popen[bytes] | None = None
        # Outlives gateway restarts and kill -9, as an external store does; stopped by `close`.
        self.redis = RedisServer(workdir / "redis") if STORE == "redis" and self.target == "tidewire" else None

    # -- process control ---------------------------------------------------------------------------
    def command(self) -> list[str]:
        if self.target == "mosquitto":
            return [MOSQUITTO, "-c", str(self._write_mosquitto_conf())]
        cmd = [sys.executable, "-m", "tidewire", "serve", "--host", "127.0.0.1", "--port", str(self.port),
               "--data-dir", str(self.data_dir), "--amqp-port", str(self.amqp_port or "off"),
               "--rocketmq-port", str(self.rocketmq_port or "off"), "--admin-port", str(self.admin_port or "off")]
        if self.redis is not None:
            cmd += ["--store", self.redis.url]
        if self.acl_file is not None:
            cmd += ["--acl-file", str(self.acl_file)]
        if self.max_keepalive is not None:
            cmd += ["--max-keepalive", str(self.max_keepalive)]
        if self.password_file is not None:
            cmd += ["--password-file", str(self.password_file)]
        if self.allow_anonymous is not None:
            cmd.append("--allow-anonymous" if self.allow_anonymous else "--no-allow-anonymous")
        for flag, port in (("--tls-port", self.tls_port), ("--ws-port", self.ws_port),
                           ("--wss-port", self.wss_port)):
            if port is not None:
                cmd += [flag, str(port)]
        if self.tls is not None:
            cmd += ["--certfile", str(self.tls.certfile), "--keyfile", str(self.tls.keyfile)]
            if self.tls.cafile is not None:
                cmd += ["--cafile", str(self.tls.cafile)]
            for flag, on in (("--require-certificate", self.tls.require_certificate),
                             ("--use-identity-as-username", self.tls.use_identity_as_username),
                             ("--use-subject-as-username", self.tls.use_subject_as_username)):
                if on:
                    cmd.append(flag)
        return cmd + self.extra_args

    def _write_mosquitto_conf(self) -> Path:
        # Mosquitto 2 defaults allow_anonymous to false; the suite's historical default is true unless a
        # password file is configured (as Tidewire's default).
        anonymous = self.allow_anonymous if self.allow_anonymous is not None else self.password_file is None
        lines = [f"listener {self.port} 127.0.0.1", f"allow_anonymous {str(anonymous).lower()}", "persistence true",
                 f"persistence_location {self.data_dir}/", "autosave_interval 1", "log_dest stderr",
                 "log_type all", "log_timestamp false", "max_queued_messages 100000",
                 "user root"]  # else mosquitto drops to a user that cannot read pytest's tmp dirs
        if self.acl_file is not None:
            lines.append(f"acl_file {self.acl_file}")
        if self.password_file is not None:
            lines.append(f"password_file {self.password_file}")
        if self.max_keepalive is not None:
            lines.append(f"max_keepalive {self.max_keepalive}")
        for name, value in self.env.items():
            if name in _MOSQUITTO_OPTIONS:
                lines.append(f"{_MOSQUITTO_OPTIONS[name]} {value}")
        # Listener sections last: per-listener options apply to the `listener` line above them.
        if self.tls_port is not None:
            lines += [f"listener {self.tls_port} 127.0.0.1", *self._mosquitto_tls_lines()]
        if self.ws_port is not None:
            lines += [f"listener {self.ws_port} 127.0.0.1", "protocol websockets"]
        if self.wss_port is not None:
            lines += [f"listener {self.wss_port} 127.0.0.1", "protocol websockets", *self._mosquitto_tls_lines()]
        conf = self.workdir / "mosquitto.conf"
        conf.write_text("\n".join([*lines, *self.conf_lines]) + "\n")
        return conf

    def _mosquitto_tls_lines(self) -> list[str]:
        tls = self.tls
        assert tls is not None
        # Tidewire's default minimum is TLS 1.2; Mosquitto 2.0.11 also accepts 1.1 unless told.
        version = self.env.get("TIDEWIRE_TLS_MIN_VERSION", "1.2")
        lines = [f"certfile {tls.certfile}", f"keyfile {tls.keyfile}", f"tls_version tlsv{version}"]
        if tls.cafile is not None:
            lines.append(f"cafile {tls.cafile}")
        for option, on in (("require_certificate", tls.require_certificate),
                           ("use_identity_as_username", tls.use_identity_as_username),
                           ("use_subject_as_username", tls.use_subject_as_username)):
            if on:
                lines.append(f"{option} true")
        if "TIDEWIRE_TLS_CIPHERS" in self.env:
            lines.append(f"ciphers {self.env['TIDEWIRE_TLS_CIPHERS']}")
        return lines

    def start(self) -> None:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        if self.redis is not None:
            self.redis.start()  # a no-op while it runs
        env = {**os.environ, "TIDEWIRE_LOG_LEVEL": "info", **self.env}
        with self.log_path.open("ab") as log:
            log.write(f"---- start {self.target} on port {self.port}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, env=env,
                                         cwd=self.workdir)
        deadline = time.monotonic() + START_TIMEOUT
        for port in self.ports:
            while not self._accepts(port):
                if self.proc.poll() is not None:
                    pytest.fail(f"{self.target} exited with {self.proc.returncode} at start:\n{self.stderr}")
                if time.monotonic() > deadline:
                    self.kill9()
                    pytest.fail(f"{self.target} did not accept connections on {port} within {START_TIMEOUT}s:"
                                f"\n{self.stderr}")
                time.sleep(0.05)  # the start-up wait's poll interval

    @staticmethod
    def _accepts(port: int) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return True
        except OSError:
            return False

    @property
    def ports(self) -> list[int]:
        """Every listening port: TCP first, then TLS, WebSocket, secure WebSocket, AMQP, RocketMQ, admin (those
        on)."""
        return [p for p in (self.port, self.tls_port, self.ws_port, self.wss_port, self.amqp_port,
                            self.rocketmq_port, self.admin_port) if p]

    def reload(self) -> None:
        """SIGHUP: re-read password, ACL and certificate files without dropping connections."""
        assert self.proc is not None and self.proc.poll() is None, "not running"
        self.proc.send_signal(signal.SIGHUP)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM and wait (a graceful shutdown must persist everything)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            pytest.fail(f"{self.target} ignored SIGTERM for {timeout}s:\n{self.stderr}")

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def restart(self) -> None:
        self.stop()
        self.start()

    def __enter__(self) -> Gateway:
        """Started (every port accepting, the admin port too), closed on exit."""
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Teardown: the broker and its store server."""
        self.kill9()
        if self.redis is not None:
            self.redis.stop()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def stderr(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""


GatewayFactory = Callable[..., Gateway]


@pytest.fixture
def gateway_factory(tmp_path: Path) -> Iterator[GatewayFactory]:
    """`gateway_factory(acl_text=..., env={...}, max_keepalive=..., start=True, **Gateway keywords)` -> Gateway.

    Keywords: password_file, allow_anonymous, tls (TlsOptions), ws, wss, amqp, rocketmq, extra_args (see `Gateway`).
    """
    made: list[Gateway] = []

    def make(acl_text: str | None = None, env: dict[str, str] | None = None,
             max_keepalive: int | None = None, start: bool = True, **kwargs: Any) -> Gateway:
        gw = Gateway(tmp_path / f"gw{len(made)}", acl_text=acl_text, env=env, max_keepalive=max_keepalive,
                     **kwargs)
        made.append(gw)
        if start:
            gw.start()
        return gw

    yield make
    for gw in made:
        gw.close()


@pytest.fixture
def gateway(gateway_factory: GatewayFactory) -> Gateway:
    return gateway_factory()


@pytest.fixture
def paho_factory() -> Iterator[PahoFactory]:
    """`paho_factory(port, client_id="", version=5, clean=True, keepalive=60, username=None, password=None,
    **PahoClient keywords)` (not connected): ca_certs/certfile/keyfile or tls_context, websocket, ws_path."""
    made: list[PahoClient] = []

    def make(port: int, client_id: str = "", version: int = 5, clean: bool = True, keepalive: int = 60,
             username: str | None = None, password: str | None = None, **kwargs: Any) -> PahoClient:
        c = PahoClient(port, client_id, version, clean, keepalive, username, password, **kwargs)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


@pytest.fixture
def connected(gateway: Gateway, paho_factory: PahoFactory) -> Callable[..., PahoClient]:
    """`connected(client_id="", version=5, clean=True, **connect_kwargs)` -> a connected PahoClient."""

    def make(client_id: str = "", version: int = 5, clean: bool = True, keepalive: int = 60,
             username: str | None = None, **connect_kwargs: Any) -> PahoClient:
        c = paho_factory(gateway.port, client_id, version, clean, keepalive, username)
        c.connect(**connect_kwargs)
        return c

    return make
