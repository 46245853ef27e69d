"""One hand-built CONNECT over TCP or TLS: the exact CONNACK code on the wire, and whether the server then closed.

paho reports a 3.1.1 return code as the equivalent 5.0 reason code, and hides whether the server closed the
socket; authentication tests need both as sent. Built from the spec, independent of the gateway's codec.
"""

from __future__ import annotations

import socket
import ssl
import time
from dataclasses import dataclass


def _mqtt_str(value: str | bytes) -> bytes:
    raw = value.encode() if isinstance(value, str) else value
    return len(raw).to_bytes(2, "big") + raw


def connect_packet(client_id: str, version: int, username: str | None = None,
                   password: str | bytes | None = None, keepalive: int = 30) -> bytes:
    """A clean-start CONNECT (3.1.1 when `version` is 4, 5.0 when 5), built by hand from the spec."""
    flags = 0x02
    payload = _mqtt_str(client_id)
    if username is not None:
        flags |= 0x80
        payload += _mqtt_str(username)
    if password is not None:
        flags |= 0x40
        payload += _mqtt_str(password)
    body = _mqtt_str("MQTT") + bytes([version, flags]) + keepalive.to_bytes(2, "big")
    if version == 5:
        body += b"\x00"  # no properties
    body += payload
    length = bytearray()
    n = len(body)
    while True:
        byte, n = n % 128, n // 128
        length.append(byte | (0x80 if n else 0))
        if not n:
            break
    return b"\x10" + bytes(length) + body


@dataclass(frozen=True, slots=True)
class RawConnack:
    code: int | None  # 3.1.1 return code or 5.0 reason code; None: no CONNACK came
    closed: bool  # the server closed the connection (after the CONNACK, if any) within the timeout
    error: str = ""  # the TLS handshake or socket error, if one ended the attempt


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError("EOF")
        out += chunk
    return out


def raw_connect(port: int, version: int, client_id: str = "", username: str | None = None,
                password: str | bytes | None = None, tls: ssl.SSLContext | None = None,
                timeout: float = 5.0) -> RawConnack:
    """Send one CONNECT and report the CONNACK code and whether the server then closed the socket.

    A connection accepted (code 0) is left to the server's keepalive: the socket is simply closed here.
    """
    deadline = time.monotonic() + timeout
    sock: socket.socket = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        if tls is not None:
            try:
                sock = tls.wrap_socket(sock, server_hostname="127.0.0.1")
            except (ssl.SSLError, OSError) as exc:
                return RawConnack(None, True, f"handshake: {exc!r}")
        try:
            sock.sendall(connect_packet(client_id, version, username, password))
            header = _recv_exact(sock, 1)
            if header[0] != 0x20:
                return RawConnack(None, True, f"not a CONNACK: first byte {header[0]:#x}")
            length, shift = 0, 0
            while True:
                byte = _recv_exact(sock, 1)[0]
                length |= (byte & 0x7F) << shift
                shift += 7
                if not byte & 0x80:
                    break
            body = _recv_exact(sock, length)
        except (ssl.SSLError, OSError) as exc:
            return RawConnack(None, True, repr(exc))
        code = body[1]
        if code == 0:
            return RawConnack(code, False)
        while time.monotonic() < deadline:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                if not sock.recv(4096):
                    return RawConnack(code, True)
            except TimeoutError:
                break
            except (ssl.SSLError, OSError):
                return RawConnack(code, True)
        return RawConnack(code, False)
    finally:
        sock.close()
