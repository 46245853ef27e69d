"""MQTT over WebSocket: a transport layer that carries the MQTT byte stream to an unchanged inner protocol.

`WebSocketProtocol` answers the HTTP upgrade, then unwraps the client's binary frames into the inner protocol's
`data_received` and hands it a `WebSocketTransport` whose writes go out as one binary frame per call. The MQTT
parser already reassembles its stream, so payloads are streamed on as they arrive: no message is buffered.

The handshake and frame layers are hand-written sans-IO code (`handshake`, `FrameReader`) rather than
`websockets.ServerProtocol`: on this machine its handshake cost 74 us against about 15 us here, it parsed a
100-byte frame in 4 us against about 1 us here, it buffers whole frames and limits whole messages, and its send
path copies the payload. Only its C `apply_mask` is used. No extension is negotiated: permessage-deflate would
cost a zlib context per connection for MQTT payloads that are mostly small or already compact.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import logging
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, cast

try:
    from websockets.speedups import apply_mask
except ImportError:  # pragma: no cover - the C speedups ship in the wheels; this is the pure-Python fallback
    from websockets.utils import apply_mask

log = logging.getLogger("tidewire.ws")

SUBPROTOCOLS = ("mqtt", "mqttv3.1")  # in order of preference; "mqttv3.1" for clients older than MQTT 3.1.1
_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

OP_CONT, OP_TEXT, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG = 0, 1, 2, 8, 9, 10
OP_FAIL = -1  # a FrameReader event: the client broke the protocol; its payload is our close frame's payload

CLOSE_NORMAL, CLOSE_PROTOCOL, CLOSE_UNSUPPORTED, CLOSE_INVALID_DATA, CLOSE_TOO_BIG = 1000, 1002, 1003, 1007, 1009

# Server frames are never masked, so a binary frame's header depends only on the payload length.
_SHORT_HEADERS = tuple(bytes((0x80 | OP_BINARY, n)) for n in range(126))
_HEADER16 = struct.Struct("!BBH").pack
_HEADER64 = struct.Struct("!BBQ").pack


def binary_header(length: int) -> bytes:
    """The header of an unmasked, final binary frame carrying `length` bytes."""
    if length < 126:
        return _SHORT_HEADERS[length]
    if length < 65536:
        return _HEADER16(0x80 | OP_BINARY, 126, length)
    return _HEADER64(0x80 | OP_BINARY, 127, length)


def control_frame(opcode: int, payload: bytes) -> bytes:
    return bytes((0x80 | opcode, len(payload))) + payload


def close_payload(code: int, reason: str = "") -> bytes:
    return code.to_bytes(2, "big") + reason.encode()[:123]


# --- sans-IO: the opening handshake ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class WebSocketOptions:
    """A listener's settings, shared by all its connections (one object, not eight fields per connection)."""

    path: str = "/mqtt"
    max_frame: int = 1 << 20  # largest data frame accepted (the lead passes max_packet_size plus slack)
    max_request: int = 8192  # largest HTTP upgrade request, request line and headers together
    handshake_timeout: float = 10.0  # from TCP (or TLS) accept until the upgrade request is complete
    close_timeout: float = 5.0  # how long a closing connection waits for the client's close frame
    # A client that offers no subprotocol is accepted by default: the MQTT parser refuses anything but CONNECT
    # anyway, and some embedded clients send none. EMQX refuses such clients; set True to do the same.
    require_subprotocol: bool = False
    origins: frozenset[str] | None = None  # allowed Origin values (browsers with client certificates); None: any
    keep_headers: frozenset[str] = frozenset()  # lower-case names of request headers kept for get_extra_info


@dataclass(frozen=True, slots=True)
class WebSocketRequest:
    """What is kept of an accepted upgrade request; `get_extra_info("websocket_request")` returns it."""

    target: str  # path and query string, as sent
    subprotocol: str | None
    headers: tuple[tuple[str, str], ...] = ()  # only those named in `keep_headers`, names lower case


@dataclass(frozen=True, slots=True)
class Accepted:
    response: bytes
    request: WebSocketRequest


@dataclass(frozen=True, slots=True)
class Rejected:
    status: int
    detail: str  # fixed text, never client data
    response: bytes


_PHRASES = {400: "Bad Request", 403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed",
            426: "Upgrade Required", 431: "Request Header Fields Too Large"}


def reject(status: int, detail: str, extra: str = "") -> Rejected:
    body = detail.encode() + b"\n"
    head = (f"HTTP/1.1 {status} {_PHRASES[status]}\r\nConnection: close\r\nContent-Type: text/plain; charset=utf-8"
            f"\r\nContent-Length: {len(body)}\r\n{extra}\r\n")
    return Rejected(status, detail, head.encode() + body)


def _tokens(value: str) -> list[str]:
    return [token.strip() for token in value.split(",") if token.strip()]


def handshake(head: bytes, options: WebSocketOptions) -> Accepted | Rejected:
    """Answer an upgrade request: `head` is everything before the blank line that ends it."""
    lines = head.decode("latin-1").split("\r\n")  # latin-1 maps every byte: decoding cannot fail
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        return reject(400, "malformed request line")
    method, target, version = parts
    if method != "GET":
        return reject(405, "only GET upgrades to a WebSocket", "Allow: GET\r\n")
    if version != "HTTP/1.1":
        return reject(400, "a WebSocket upgrade needs HTTP/1.1")
    if target.partition("?")[0] != options.path:
        return reject(404, "no WebSocket endpoint at this path")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon or not name or name != name.strip() or not name.isascii():
            return reject(400, "malformed header line")
        name = name.lower()
        value = value.strip(" \t")
        headers[name] = f"{headers[name]}, {value}" if name in headers else value  # RFC 9110 5.3: join repeats
    upgrade_headers = "Upgrade: websocket\r\nConnection: Upgrade\r\n"
    if "websocket" not in (token.lower() for token in _tokens(headers.get("upgrade", ""))):
        return reject(426, "this endpoint speaks WebSocket only", upgrade_headers)
    if "upgrade" not in (token.lower() for token in _tokens(headers.get("connection", ""))):
        return reject(426, "missing Connection: Upgrade", upgrade_headers)
    if headers.get("sec-websocket-version") != "13":
        return reject(426, "unsupported WebSocket version", upgrade_headers + "Sec-WebSocket-Version: 13\r\n")
    key = headers.get("sec-websocket-key", "")
    try:
        valid_key = len(base64.b64decode(key, validate=True)) == 16
    except (binascii.Error, ValueError):
        valid_key = False
    if not valid_key:
        return reject(400, "missing or malformed Sec-WebSocket-Key")
    if options.origins is not None and headers.get("origin") not in options.origins:
        return reject(403, "origin not allowed")
    offered = _tokens(headers.get("sec-websocket-protocol", ""))
    subprotocol = next((name for name in SUBPROTOCOLS if name in offered), None)
    if subprotocol is None and (offered or options.require_subprotocol):
        return reject(400, "subprotocol mqtt required")
    accept = base64.b64encode(hashlib.sha1(key.encode() + _GUID, usedforsecurity=False).digest()).decode()
    response = ("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                f"Sec-WebSocket-Accept: {accept}\r\n")
    if subprotocol is not None:
        response += f"Sec-WebSocket-Protocol: {subprotocol}\r\n"
    kept = tuple((name, value) for name, value in headers.items() if name in options.keep_headers)
    request = WebSocketRequest(options.path if target == options.path else target, subprotocol, kept)
    return Accepted((response + "\r\n").encode(), request)


# --- sans-IO: client frames -----------------------------------------------------------------------------------
def _check_close(payload: bytes) -> tuple[int, bytes]:
    """A received close frame's payload: (OP_CLOSE, payload) if well formed, else (OP_FAIL, our payload)."""
    if not payload:
        return OP_CLOSE, payload
    code = int.from_bytes(payload[:2], "big")
    if len(payload) == 1 or not (1000 <= code <= 1003 or 1007 <= code <= 1014 or 3000 <= code <= 4999):
        return OP_FAIL, close_payload(CLOSE_PROTOCOL, "invalid close code")
    try:
        payload[2:].decode()
    except UnicodeDecodeError:
        return OP_FAIL, close_payload(CLOSE_INVALID_DATA, "close reason not UTF-8")
    return OP_CLOSE, payload


class FrameReader:
    """Unmasks client frames as bytes arrive: `feed` returns the data payload bytes found, in order, and leaves
    control frames and protocol failures in `events` as (opcode, payload). After a close frame or a failure it is
    `done` and ignores further input. It holds at most one partial frame header or control frame (139 bytes)."""

    __slots__ = ("_frag", "_head", "_left", "_mask", "done", "events", "max_frame")

    def __init__(self, max_frame: int) -> None:
        self.max_frame = max_frame
        self.events: list[tuple[int, bytes]] | None = None
        self.done = False
        self._head = b""  # a frame header (or a whole control frame) not yet complete
        self._left = 0  # data payload bytes still to come in the current frame
        self._mask = b""  # its mask, rotated to the next byte's position
        self._frag = False  # inside a fragmented binary message: only continuation frames may follow

    def _fail(self, code: int, reason: str) -> None:
        self._event(OP_FAIL, close_payload(code, reason))

    def _event(self, opcode: int, payload: bytes) -> None:
        if self.events is None:
            self.events = []
        self.events.append((opcode, payload))
        if opcode in (OP_CLOSE, OP_FAIL):
            self.done = True

    def feed(self, data: bytes) -> bytes:
        if self.done:
            return b""
        if self._head:
            data = self._head + data
            self._head = b""
        n = len(data)
        view: Any = memoryview(data) if n > 1024 else data  # large payloads are unmasked without a slice copy
        out: list[bytes] = []
        pos = 0
        if self._left:  # the rest of a data frame begun in an earlier read
            pos = min(self._left, n)
            out.append(apply_mask(view[:pos], self._mask))
            self._left -= pos
            if self._left and pos & 3:
                self._mask = self._mask[pos & 3:] + self._mask[:pos & 3]
        while pos < n:
            if n - pos < 2:
                self._head = data[pos:]
                break
            b0 = data[pos]
            b1 = data[pos + 1]
            if not b1 & 0x80:
                self._fail(CLOSE_PROTOCOL, "client frame not masked")
                break
            if b0 & 0x70:
                self._fail(CLOSE_PROTOCOL, "reserved bits set")
                break
            length = b1 & 0x7F
            size = 6 if length < 126 else 8 if length == 126 else 14  # header with the 4-byte mask
            if n - pos < size:
                self._head = data[pos:]
                break
            if length == 126:
                length = int.from_bytes(data[pos + 2:pos + 4], "big")
            elif length == 127:
                length = int.from_bytes(data[pos + 2:pos + 10], "big")
            opcode = b0 & 0x0F
            mask = data[pos + size - 4:pos + size]
            pos += size
            if opcode == OP_BINARY or opcode == OP_CONT:  # noqa: SIM109 - constants compare faster than a tuple
                if self._frag != (opcode == OP_CONT):
                    self._fail(CLOSE_PROTOCOL, "continuation frame out of place")
                    break
                if length > self.max_frame:
                    self._fail(CLOSE_TOO_BIG, "frame too large")
                    break
                self._frag = not b0 & 0x80
                end = pos + length
                if end > n:  # the payload goes on in later reads: pass on what is here, unmasked
                    self._left = end - n
                    shift = (n - pos) & 3
                    self._mask = mask[shift:] + mask[:shift] if shift else mask
                    end = n
                if end > pos:
                    out.append(apply_mask(view[pos:end], mask))
                pos = end
            elif opcode == OP_TEXT:
                self._fail(CLOSE_UNSUPPORTED, "MQTT needs binary frames")
                break
            elif OP_CLOSE <= opcode <= OP_PONG:
                if not b0 & 0x80 or length > 125:
                    self._fail(CLOSE_PROTOCOL, "bad control frame")
                    break
                if n - pos < length:
                    self._head = data[pos - size:]  # a control frame is acted on whole; at most 139 bytes
                    break
                payload = apply_mask(data[pos:pos + length], mask)
                pos += length
                if opcode == OP_CLOSE:
                    self._event(*_check_close(payload))
                    break
                self._event(opcode, payload)
            else:
                self._fail(CLOSE_PROTOCOL, "reserved opcode")
                break
        if len(out) == 1:
            return out[0]
        return b"".join(out)  # one call into the MQTT parser per read, as over plain TCP


# --- asyncio ----------------------------------------------------------------------------------------------------
_HANDSHAKE, _OPEN, _CLOSING, _CLOSED = range(4)


class WebSocketError(ConnectionError):
    """Passed to the inner protocol's connection_lost when the client broke the WebSocket protocol."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(f"websocket close {code}: {reason}")
        self.code = code


class WebSocketProtocol(asyncio.Protocol):
    """One WebSocket connection: the HTTP upgrade, then frames to and from an inner protocol built on upgrade.

    Use as `loop.create_server(lambda: WebSocketProtocol(inner_factory, options), host, port, ssl=...)`.
    """

    __slots__ = ("_adapter", "_buf", "_factory", "_inner", "_opts", "_paused", "_reader", "_request", "_state",
                 "_timer", "_transport")

    def __init__(self, inner_factory: Callable[[], asyncio.BaseProtocol], options: WebSocketOptions) -> None:
        self._opts = options
        self._factory: Callable[[], asyncio.BaseProtocol] | None = inner_factory  # dropped once used
        self._state = _HANDSHAKE
        self._transport: asyncio.Transport | None = None
        self._inner: Any = None  # set on upgrade; None again once told the connection is lost
        self._adapter: WebSocketTransport | None = None
        self._reader: FrameReader | None = None
        self._request: WebSocketRequest | None = None
        self._buf: bytearray | None = bytearray()  # the upgrade request so far; None after the handshake
        self._timer: asyncio.TimerHandle | None = None
        self._paused = False  # the inner protocol paused reading

    # --- asyncio.Protocol ---------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's transports aren't asyncio subclasses
        self._timer = asyncio.get_running_loop().call_later(self._opts.handshake_timeout, self._handshake_timeout)

    def data_received(self, data: bytes) -> None:
        if self._state == _OPEN:
            reader = self._reader
            assert reader is not None
            payload = reader.feed(data)
            if payload:
                self._inner.data_received(payload)
            if reader.events is not None:
                self._on_events()
        elif self._state == _HANDSHAKE:
            self._handshake_data(data)
        elif self._state == _CLOSING and self._reader is not None:
            self._reader.feed(data)  # data after our close frame is dropped; we wait for the client's close
            if self._reader.events is not None:
                self._on_events()

    def eof_received(self) -> bool | None:
        if self._state == _OPEN and self._inner is not None:
            self._inner.eof_received()
        return None  # no close frame came first: the connection is of no further use

    def connection_lost(self, exc: Exception | None) -> None:
        self._state = _CLOSED
        self._cancel_timer()
        self._buf = self._reader = self._factory = None
        self._lose(exc)

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()

    # --- handshake ----------------------------------------------------------------------------------------
    def _handshake_data(self, data: bytes) -> None:
        buf = self._buf
        assert buf is not None and self._transport is not None
        start = max(0, len(buf) - 3)
        buf += data
        end = buf.find(b"\r\n\r\n", start, self._opts.max_request + 4)
        if end < 0:
            if len(buf) > self._opts.max_request:
                self._refuse(reject(431, "upgrade request too large"))
            return
        result = handshake(bytes(buf[:end]), self._opts)
        if isinstance(result, Rejected):
            self._refuse(result)
            return
        rest = bytes(buf[end + 4:])
        self._buf = None
        self._cancel_timer()
        self._transport.write(result.response)
        self._request = result.request
        self._reader = FrameReader(self._opts.max_frame)
        self._state = _OPEN
        factory, self._factory = self._factory, None
        assert factory is not None
        self._inner = factory()
        self._adapter = WebSocketTransport(self, self._transport)
        self._inner.connection_made(self._adapter)
        if rest:  # frames sent without waiting for our response
            self.data_received(rest)

    def _refuse(self, rejected: Rejected) -> None:
        assert self._transport is not None
        log.debug("ws.rejected", extra={"peer": self._transport.get_extra_info("peername"),
                                        "status": rejected.status, "detail": rejected.detail})
        self._state = _CLOSED
        self._buf = None
        self._cancel_timer()
        self._transport.write(rejected.response)
        self._transport.close()

    def _handshake_timeout(self) -> None:
        self._timer = None
        if self._state == _HANDSHAKE and self._transport is not None:
            self._state = _CLOSED
            self._transport.abort()

    # --- frames -------------------------------------------------------------------------------------------
    def _on_events(self) -> None:
        reader = self._reader
        assert reader is not None and self._transport is not None
        events, reader.events = reader.events or [], None
        for opcode, payload in events:
            if opcode == OP_PING:
                if self._state == _OPEN:
                    self._transport.write(control_frame(OP_PONG, payload))
            elif opcode == OP_CLOSE:
                if self._state == _OPEN:  # the client starts the closing handshake: answer, then close TCP
                    self._state = _CLOSING
                    self._transport.write(control_frame(OP_CLOSE, payload[:2]))
                    self._lose(None)
                self._cancel_timer()
                self._transport.close()
            elif opcode == OP_FAIL:
                code = int.from_bytes(payload[:2], "big")
                log.debug("ws.protocol_error", extra={"peer": self._transport.get_extra_info("peername"),
                                                      "code": code, "detail": payload[2:].decode()})
                if self._state == _OPEN:
                    self.close(payload)
                    if self._transport.can_write_eof():
                        # the rest of the stream can't be parsed, so no close reply will be seen: our FIN makes
                        # the client close; closing now instead could reset the connection before it reads ours
                        self._transport.write_eof()
                    self._lose(WebSocketError(code, payload[2:].decode()))
                else:
                    self._cancel_timer()
                    self._transport.close()

    def close(self, payload: bytes = close_payload(CLOSE_NORMAL)) -> None:
        """Start the closing handshake: send our close frame and wait, bounded, for the client's."""
        if self._state != _OPEN or self._transport is None:
            return
        self._state = _CLOSING
        self._transport.write(control_frame(OP_CLOSE, payload))
        if self._paused:
            self._transport.resume_reading()  # to see the client's close frame
        self._timer = asyncio.get_running_loop().call_later(self._opts.close_timeout, self._close_timeout)

    def _close_timeout(self) -> None:
        self._timer = None
        if self._transport is not None and self._state == _CLOSING:
            if self._transport.get_write_buffer_size():
                self._transport.abort()  # the client reads nothing: don't wait for the buffer to drain
            else:
                self._transport.close()

    def _lose(self, exc: Exception | None) -> None:
        inner, self._inner = self._inner, None  # exactly once; also breaks the inner -> transport -> self cycle
        if inner is not None:
            inner.connection_lost(exc)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def pause(self) -> None:
        if self._state == _OPEN and not self._paused and self._transport is not None:
            self._paused = True
            self._transport.pause_reading()

    def resume(self) -> None:
        if self._paused and self._transport is not None:
            self._paused = False
            self._transport.resume_reading()

    def extra(self, name: str, default: Any) -> Any:
        if name == "websocket_request":
            return self._request
        return default if self._transport is None else self._transport.get_extra_info(name, default)

    @property
    def is_open(self) -> bool:
        return self._state == _OPEN


class WebSocketTransport(asyncio.Transport):
    """The transport the inner protocol sees: each write is one binary frame, the rest passes through."""

    __slots__ = ("_transport", "_ws")

    def __init__(self, ws: WebSocketProtocol, transport: asyncio.Transport) -> None:
        # BaseTransport.__init__ is skipped: its per-connection `_extra` dict is never used here
        self._ws = ws
        self._transport = transport

    def write(self, data: bytes | bytearray | memoryview) -> None:
        n = len(data)
        if n and self._ws._state == _OPEN:
            self._transport.writelines((binary_header(n), data))

    def writelines(self, list_of_data: Iterable[bytes | bytearray | memoryview]) -> None:
        if self._ws._state != _OPEN:
            return
        chunks = list_of_data if isinstance(list_of_data, list) else list(list_of_data)
        n = sum(map(len, chunks))
        if n:
            self._transport.writelines([binary_header(n), *chunks])

    def close(self) -> None:
        self._ws.close()

    def abort(self) -> None:
        self._transport.abort()

    def is_closing(self) -> bool:
        return not self._ws.is_open or self._transport.is_closing()

    def can_write_eof(self) -> bool:
        return False

    def write_eof(self) -> None:
        raise NotImplementedError("a WebSocket cannot be half-closed")

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._ws.extra(name, default)

    def pause_reading(self) -> None:
        self._ws.pause()

    def resume_reading(self) -> None:
        self._ws.resume()

    def is_reading(self) -> bool:
        return self._transport.is_reading()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._transport.set_write_buffer_limits(high, low)

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size()

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._transport.get_write_buffer_limits()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._ws._inner = protocol

    def get_protocol(self) -> asyncio.BaseProtocol:
        return cast(asyncio.BaseProtocol, self._ws._inner)
