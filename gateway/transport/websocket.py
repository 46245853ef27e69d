"""MQTT over WebSocket: a transport layer that carries the MQTT byte stream to an unchanged inner protocol.

`WebSocketProtocol` answers the HTTP upgrade, then unwraps the client's binary frames into the inner protocol's
`data_received` and hands it a `WebSocketTransport` whose writes go out as one binary frame per call. The MQTT
parser already reassembles its stream, so payloads are streamed on as they arrive: no message is buffered. The
protocol rules are in `gateway.transport.websocket_core`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Any, cast

from tidewire.errors import TidewireError
from tidewire.gateway.transport.websocket_core import (
    CLOSE_NORMAL,
    OP_CLOSE,
    OP_FAIL,
    OP_PING,
    OP_PONG,
    FrameReader,
    Rejected,
    WebSocketOptions,
    WebSocketRequest,
    binary_header,
    close_payload,
    control_frame,
    handshake,
    reject,
)

log = logging.getLogger("tidewire.ws")

_HANDSHAKE, _OPEN, _CLOSING, _CLOSED = range(4)


class WebSocketError(TidewireError, ConnectionError):
    """Passed to the inner protocol's connection_lost when the client broke the WebSocket protocol."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(f"websocket close {code}: {reason}")
        self.code = code


class WebSocketProtocol(asyncio.Protocol):
    """One WebSocket connection: the HTTP upgrade, then frames to and from an inner protocol built on upgrade.

    Use as `loop.create_server(lambda: WebSocketProtocol(inner_factory, options), host, port, ssl=...)`.
    """

    __slots__ = ("_buf", "_factory", "_inner", "_opts", "_paused", "_reader", "_request", "_state",
                 "_timer", "_transport")

    def __init__(self, inner_factory: Callable[[], asyncio.BaseProtocol], options: WebSocketOptions) -> None:
        self._opts = options
        self._factory: Callable[[], asyncio.BaseProtocol] | None = inner_factory  # dropped once used
        self._state = _HANDSHAKE
        self._transport: asyncio.Transport | None = None
        self._inner: Any = None  # set on upgrade; None again once told the connection is lost
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
        self._inner.connection_made(WebSocketTransport(self, self._transport))
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
                    self.close(payload[:2])
                    self._lose(None)
                self._transport.close()  # the close timer still bounds the flush; connection_lost cancels it
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


class WebSocketTransport(asyncio.Transport):
    """The transport the inner protocol sees: each write is one binary frame, the rest passes through."""

    __slots__ = ("_transport", "_ws")

    def __init__(self, ws: WebSocketProtocol, transport: asyncio.Transport) -> None:
        # BaseTransport.__init__ is skipped: its per-connection `_extra` dict would never be used
        self._ws = ws
        self._transport = transport

    def write(self, data: bytes | bytearray | memoryview) -> None:
        n = len(data)
        if n and self._ws._state == _OPEN:
            self._transport.writelines((binary_header(n), data))

    def writelines(self, list_of_data: Iterable[bytes | bytearray | memoryview]) -> None:
        if self._ws._state == _OPEN:
            chunks = list_of_data if isinstance(list_of_data, list) else list(list_of_data)
            n = sum(map(len, chunks))
            if n:
                self._transport.writelines([binary_header(n), *chunks])

    def close(self) -> None:
        self._ws.close()

    def abort(self) -> None:
        self._ws._state = _CLOSED  # nothing more is written; connection_lost still reaches the inner protocol
        self._transport.abort()

    def is_closing(self) -> bool:
        return self._ws._state != _OPEN or self._transport.is_closing()

    def can_write_eof(self) -> bool:
        return False

    def write_eof(self) -> None:
        raise NotImplementedError("a WebSocket cannot be half-closed")

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "websocket_request":
            return self._ws._request
        return self._transport.get_extra_info(name, default)

    def pause_reading(self) -> None:
        if self._ws._state == _OPEN and not self._ws._paused:
            self._ws._paused = True
            self._transport.pause_reading()

    def resume_reading(self) -> None:
        if self._ws._paused:
            self._ws._paused = False
            self._transport.resume_reading()

    def is_reading(self) -> bool:
        return self._transport.is_reading()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._transport.set_write_buffer_limits(high, low)

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size()

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._transport.get_write_buffer_limits()
