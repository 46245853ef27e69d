"""A tiny blocking raw-socket MQTT client on `gateway.protocols.mqtt.codec`, for protocol edges no real client produces.

It sends exactly what the test says (repeated QoS 2 packet ids, withheld acks, malformed bytes) and returns
exactly what the server sent, so a test can assert on DUP flags, packet ids and DISCONNECT reason codes.
"""

from __future__ import annotations

import socket
import time
from collections import deque
from typing import Any

from tidewire.gateway.protocols.mqtt.codec import Connack, Connect, Disconnect, Packet, Parser, Publish, Will, encode


class ConnectionClosed(Exception):
    """The server closed the connection (EOF or reset)."""


def varint(n: int) -> bytes:
    """Remaining-length encoding, also used to build deliberately broken packets by hand."""
    out = bytearray()
    while True:
        byte, n = n % 128, n // 128
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def mqtt_str(s: str | bytes) -> bytes:
    raw = s.encode() if isinstance(s, str) else s
    return len(raw).to_bytes(2, "big") + raw


class RawClient:
    """One TCP connection; `level` 4 (3.1.1) or 5 selects how packets are encoded and decoded."""

    def __init__(self, port: int, level: int = 4, timeout: float = 3.0) -> None:
        self.level = level
        self.timeout = timeout
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.parser = Parser()
        # The codec's Parser is written for the server side: it wants a CONNECT first to learn the protocol
        # level. Feeding it one synthetic CONNECT makes it decode the server's packets at our level.
        self.parser.feed(encode(Connect(client_id="rawmqtt-parser", protocol_level=level), level))
        self.pending: deque[Packet] = deque()
        self.eof = False

    # -- sending ---------------------------------------------------------------------------------------
    def send(self, packet: Packet) -> None:
        self.send_raw(encode(packet, self.level))

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def connect(self, client_id: str, clean_start: bool = True, keepalive: int = 60, will: Will | None = None,
                properties: dict[int, Any] | None = None, username: str | None = None,
                check: bool = True) -> Connack:
        self.send(Connect(client_id=client_id, protocol_level=self.level, clean_start=clean_start,
                          keepalive=keepalive, will=will, username=username, properties=properties or {}))
        connack = self.expect(Connack)
        if check:
            assert connack.reason_code == 0, f"CONNACK refused: {connack}"
        return connack

    def publish(self, topic: str, payload: bytes, qos: int = 0, packet_id: int = 0, dup: bool = False,
                retain: bool = False) -> None:
        self.send(Publish(topic=topic, payload=payload, qos=qos, retain=retain, dup=dup, packet_id=packet_id))

    def disconnect(self) -> None:
        self.send(Disconnect())
        self.close()

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    # -- receiving -------------------------------------------------------------------------------------
    def recv(self, timeout: float | None = None) -> Packet:
        """Next packet from the server; AssertionError on timeout, ConnectionClosed on EOF."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while not self.pending:
            if self.eof:
                raise ConnectionClosed()
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError("no packet from server in time")
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            except (ConnectionResetError, BrokenPipeError):
                data = b""
            if not data:
                self.eof = True
                continue
            self.pending.extend(self.parser.feed(data))
        return self.pending.popleft()

    def expect(self, kind: type[Any], timeout: float | None = None) -> Any:
        packet = self.recv(timeout)
        assert isinstance(packet, kind), f"expected {kind.__name__}, got {packet!r}"
        return packet

    def nothing(self, timeout: float = 0.5) -> None:
        """Assert the server sends nothing (and keeps the connection open) for `timeout` seconds."""
        try:
            packet = self.recv(timeout)
        except AssertionError:
            return
        raise AssertionError(f"unexpected packet {packet!r}")

    def until_closed(self, timeout: float = 2.0) -> list[Packet]:
        """Read until the server closes; returns what it sent before. AssertionError if still open."""
        got: list[Packet] = []
        deadline = time.monotonic() + timeout
        while True:
            try:
                got.append(self.recv(max(0.0, deadline - time.monotonic())))
            except ConnectionClosed:
                return got
            except AssertionError:
                raise AssertionError(f"connection still open after {timeout}s; got {got}") from None
