"""paho-mqtt 2.x as a test client: a blocking wrapper with queues for messages, CONNACKs and disconnects,
over TCP, TLS or WebSocket."""

from __future__ import annotations

import queue
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties


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
        # paho writes from the calling thread unless a write hook is set: an SSL object or paho's WebSocket
        # framing read and written from two threads at once loses packets, and even on plain TCP a partial write
        # racing the loop thread's can put packets on the wire out of order. So every write is left to our loop
        # thread, woken by paho's socket pair.
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
                time.sleep(0.02)  # the loop thread idles while not connected

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
            time.sleep(0.01)  # the poll interval of this (best-effort) wait for the close
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
