"""Fixtures for end-to-end tests: a real gateway process (Tidewire or Mosquitto) and paho client helpers.

Target: env `TIDEWIRE_TEST_TARGET` = `tidewire` (default) or `mosquitto` (reference broker, used to validate
the tests themselves). Tests that Mosquitto fails by design are marked `@pytest.mark.tidewire_only`.
"""

from __future__ import annotations

import os
import queue
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

TARGET = os.environ.get("TIDEWIRE_TEST_TARGET", "tidewire")
START_TIMEOUT = 10.0
MOSQUITTO = "/usr/sbin/mosquitto"
MOSQUITTO_PASSWD = "/usr/bin/mosquitto_passwd"

# Tidewire settings that have a Mosquitto equivalent: env name -> mosquitto.conf option.
_MOSQUITTO_OPTIONS = {
    "TIDEWIRE_MAX_PACKET_SIZE": "max_packet_size",
    "TIDEWIRE_MAX_INFLIGHT": "max_inflight_messages",
    "TIDEWIRE_MAX_KEEPALIVE": "max_keepalive",
}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "tidewire_only: Mosquitto fails this by design (skipped there)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if TARGET != "mosquitto":
        return
    skip = pytest.mark.skip(reason="Tidewire-specific behaviour; Mosquitto differs by design")
    for item in items:
        if item.get_closest_marker("tidewire_only") is not None:
            item.add_marker(skip)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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


def wait_until(predicate: Callable[[], bool], timeout: float = 3.0, interval: float = 0.1,
               what: str = "condition") -> None:
    """Poll `predicate` until true (e.g. a SIGHUP reload has taken effect); fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout}s")
        time.sleep(interval)


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

    Optional listeners get their own free ports: `tls_port` (when `tls` is given), `ws_port` (`ws=True`) and
    `wss_port` (`wss=True`, needs `tls`). Authentication: `password_file`, `allow_anonymous` (None: the
    target's default, which is off once a password file is set).
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
        extra_args: Sequence[str] = (),
    ) -> None:
        self.target = TARGET
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
        self.extra_args = list(extra_args)
        self.log_path = workdir / "gateway.log"
        self.proc: subprocess.Popen[bytes] | None = None

    # -- process control ---------------------------------------------------------------------------
    def command(self) -> list[str]:
        if self.target == "mosquitto":
            return [MOSQUITTO, "-c", str(self._write_mosquitto_conf())]
        cmd = [sys.executable, "-m", "gateway", "serve", "--host", "127.0.0.1", "--port", str(self.port),
               "--data-dir", str(self.data_dir)]
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
        conf.write_text("\n".join(lines) + "\n")
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
                time.sleep(0.05)

    @staticmethod
    def _accepts(port: int) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return True
        except OSError:
            return False

    @property
    def ports(self) -> list[int]:
        """Every listening port: TCP first, then TLS, WebSocket, secure WebSocket (those configured)."""
        return [p for p in (self.port, self.tls_port, self.ws_port, self.wss_port) if p is not None]

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

    Keywords: password_file, allow_anonymous, tls (TlsOptions), ws, wss, extra_args (see `Gateway`).
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
        gw.kill9()


@pytest.fixture
def gateway(gateway_factory: GatewayFactory) -> Gateway:
    return gateway_factory()


# -- paho helper -----------------------------------------------------------------------------------

@dataclass(slots=True)
class ConnResult:
    session_present: bool
    reason_code: int
    properties: dict[str, Any]


@dataclass(slots=True)
class Received:
    topic: str
    payload: bytes
    qos: int
    retain: bool
    dup: bool
    properties: dict[str, Any] = field(default_factory=dict)


def props_dict(props: Properties | None) -> dict[str, Any]:
    if props is None:
        return {}
    return {k: v for k, v in props.json().items()}


def v5_props(packet_type: int, **values: Any) -> Properties:
    p = Properties(packet_type)
    for k, v in values.items():
        setattr(p, k, v)
    return p


class PahoClient:
    """A paho 2.x client with queues: received messages, CONNACKs, disconnects; acks awaited synchronously.

    The network loop runs in our own thread calling `loop()` so paho never auto-reconnects (an old client
    reconnecting would otherwise steal its session back in takeover tests).
    """

    def __init__(self, port: int, client_id: str = "", version: int = 5, clean: bool = True,
                 keepalive: int = 60, username: str | None = None, password: str | None = None, *,
                 ca_certs: Path | None = None, certfile: Path | None = None, keyfile: Path | None = None,
                 tls_context: ssl.SSLContext | None = None, websocket: bool = False,
                 ws_path: str = "/mqtt") -> None:
        """`ca_certs` (and `certfile`/`keyfile` for mTLS) turn TLS on through paho's `tls_set`;
        `tls_context` instead uses that context; `websocket` speaks MQTT over WebSocket at `ws_path`."""
        self.port = port
        self.version = version
        self.clean = clean
        self.keepalive = keepalive
        proto = mqtt.MQTTv5 if version == 5 else mqtt.MQTTv311
        kwargs: dict[str, Any] = {"client_id": client_id, "protocol": proto,
                                  "transport": "websockets" if websocket else "tcp"}
        if version != 5:
            kwargs["clean_session"] = clean
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, **kwargs)
        self.client.max_inflight_messages_set(1000)
        self.client.max_queued_messages_set(0)
        if username is not None or password is not None:
            self.client.username_pw_set(username, password)
        if ca_certs is not None:
            self.client.tls_set(ca_certs=str(ca_certs), certfile=None if certfile is None else str(certfile),
                                keyfile=None if keyfile is None else str(keyfile))
        elif tls_context is not None:
            self.client.tls_set_context(tls_context)
        if websocket:
            self.client.ws_set_options(path=ws_path)
        if websocket or ca_certs is not None or tls_context is not None:
            # paho writes from the calling thread unless a write hook is set; an SSL object or paho's WebSocket
            # framing must not be read and written from two threads at once (it loses packets), so every
            # write is left to our loop thread, woken by paho's socket pair.
            self.client.on_socket_register_write = self._write_in_loop_thread
        self.messages: queue.Queue[Received] = queue.Queue()
        self.connacks: queue.Queue[ConnResult] = queue.Queue()
        self.disconnects: queue.Queue[int] = queue.Queue()
        self._acks: dict[int, Any] = {}
        self._acks_cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._running = False
        c = self.client
        c.on_connect = self._on_connect
        c.on_disconnect = self._on_disconnect
        c.on_message = self._on_message
        c.on_publish = self._on_publish
        c.on_subscribe = self._on_subscribe
        c.on_unsubscribe = self._on_unsubscribe

    # callbacks (run in the loop thread)
    def _write_in_loop_thread(self, client: Any, userdata: Any, sock: Any) -> None:
        """Nothing to do: `loop()` selects for writing whenever paho has output queued."""

    def _on_connect(self, client: Any, userdata: Any, flags: Any, rc: Any, props: Any) -> None:
        self.connacks.put(ConnResult(bool(flags.session_present), int(rc.value), props_dict(props)))

    def _on_disconnect(self, client: Any, userdata: Any, flags: Any, rc: Any, props: Any) -> None:
        self.disconnects.put(int(rc.value))

    def _on_message(self, client: Any, userdata: Any, msg: mqtt.MQTTMessage) -> None:
        props = props_dict(getattr(msg, "properties", None))
        self.messages.put(Received(msg.topic, bytes(msg.payload), msg.qos, bool(msg.retain), bool(msg.dup), props))

    def _ack(self, mid: int, value: Any) -> None:
        with self._acks_cond:
            self._acks[mid] = value
            self._acks_cond.notify_all()

    def _on_publish(self, client: Any, userdata: Any, mid: int, rc: Any, props: Any) -> None:
        self._ack(mid, int(rc.value))

    def _on_subscribe(self, client: Any, userdata: Any, mid: int, rcs: Any, props: Any) -> None:
        self._ack(mid, [int(r.value) for r in rcs])

    def _on_unsubscribe(self, client: Any, userdata: Any, mid: int, rcs: Any, props: Any) -> None:
        self._ack(mid, [int(r.value) for r in rcs])

    def wait_ack(self, mid: int, timeout: float = 5.0) -> Any:
        deadline = time.monotonic() + timeout
        with self._acks_cond:
            while mid not in self._acks:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no ack for mid {mid} within {timeout}s")
                self._acks_cond.wait(left)
            return self._acks.pop(mid)

    def acks_snapshot(self) -> dict[int, Any]:
        """mid -> ack result for every ack not yet consumed by `wait_ack` (for fire-and-forget publishes)."""
        with self._acks_cond:
            return dict(self._acks)

    # loop thread
    def _loop(self) -> None:
        while self._running:
            rc = self.client.loop(0.02)
            if rc != mqtt.MQTT_ERR_SUCCESS:
                time.sleep(0.02)

    def _start_loop(self) -> None:
        self._running = True
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _stop_loop(self) -> None:
        self._running = False
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None

    # API
    def connect(self, clean_start: bool | None = None, session_expiry: int | None = None,
                properties: Properties | None = None, timeout: float = 5.0, check: bool = True) -> ConnResult:
        self._stop_loop()
        kwargs: dict[str, Any] = {"keepalive": self.keepalive}
        if self.version == 5:
            kwargs["clean_start"] = self.clean if clean_start is None else clean_start
            if session_expiry is not None:
                properties = properties or Properties(PacketTypes.CONNECT)
                properties.SessionExpiryInterval = session_expiry
            if properties is not None:
                kwargs["properties"] = properties
        self.client.connect("127.0.0.1", self.port, **kwargs)
        self._start_loop()
        try:
            res = self.connacks.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no CONNACK within {timeout}s") from None
        if check:
            assert res.reason_code == 0, f"CONNACK refused: {res}"
        return res

    def subscribe(self, topic: str | list[tuple[str, int]], qos: int = 0, timeout: float = 5.0) -> list[int]:
        if isinstance(topic, str):
            rc, mid = self.client.subscribe(topic, qos)
        else:
            rc, mid = self.client.subscribe(topic)
        assert rc == mqtt.MQTT_ERR_SUCCESS and mid is not None, rc
        return list(self.wait_ack(mid, timeout))

    def unsubscribe(self, topic: str, timeout: float = 5.0) -> list[int]:
        rc, mid = self.client.unsubscribe(topic)
        assert rc == mqtt.MQTT_ERR_SUCCESS and mid is not None, rc
        return list(self.wait_ack(mid, timeout))

    def publish(self, topic: str, payload: bytes | str, qos: int = 0, retain: bool = False,
                properties: Properties | None = None, wait: bool = True, timeout: float = 5.0) -> int:
        """Publish; for QoS > 0 wait for the ack flow and return its reason code (0 in 3.1.1)."""
        info = self.client.publish(topic, payload, qos, retain, properties)
        if not wait:
            return info.mid
        return int(self.wait_ack(info.mid, timeout))

    def get(self, timeout: float = 3.0) -> Received:
        try:
            return self.messages.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no message within {timeout}s") from None

    def expect(self, n: int, timeout: float = 3.0) -> list[Received]:
        deadline = time.monotonic() + timeout
        out: list[Received] = []
        while len(out) < n:
            try:
                out.append(self.messages.get(timeout=max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                raise AssertionError(f"got {len(out)} of {n} messages: {out}") from None
        return out

    def assert_nothing(self, timeout: float = 0.5) -> None:
        try:
            msg = self.messages.get(timeout=timeout)
        except queue.Empty:
            return
        raise AssertionError(f"unexpected message {msg}")

    def wait_disconnect(self, timeout: float = 3.0) -> int:
        try:
            return self.disconnects.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"not disconnected within {timeout}s") from None

    def disconnect(self, reason_code: int | None = None) -> None:
        """Normal DISCONNECT (5.0: optional reason code), then stop the loop."""
        if reason_code is not None:
            from paho.mqtt.reasoncodes import ReasonCode

            rc = ReasonCode(PacketTypes.DISCONNECT, identifier=reason_code)
            self.client.disconnect(reasoncode=rc)
        else:
            self.client.disconnect()
        deadline = time.monotonic() + 2
        while self.client.is_connected() and time.monotonic() < deadline:
            time.sleep(0.01)
        self._stop_loop()

    def drop(self) -> None:
        """Abnormal close: the socket goes away without DISCONNECT."""
        self._stop_loop()
        sock = self.client.socket()
        if isinstance(sock, socket.socket):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def close(self) -> None:
        self._stop_loop()
        sock = self.client.socket()
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass


PahoFactory = Callable[..., PahoClient]


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
