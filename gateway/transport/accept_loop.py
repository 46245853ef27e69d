"""A listener with its own accept loop, for what asyncio's servers cannot do: read a PROXY protocol header off each
accepted socket, byte-exact, before TLS, WebSocket and MQTT see the connection (and only from the load balancers it
trusts); and see a failed TLS handshake, which asyncio's servers drop silently, so that it costs one log line."""

from __future__ import annotations

import asyncio
import errno
import functools
import ipaddress
import logging
import socket
import ssl as ssl_module
from collections.abc import Callable, Sequence

from tidewire.gateway.transport.proxy_protocol import (
    DEFAULT_MAX_V2_LENGTH,
    MIN_MAX_V2_LENGTH,
    V1_MAX_LENGTH,
    Address,
    ParseResult,
    ProxyError,
    ProxyHeader,
    parse_proxy_header,
)

log = logging.getLogger("tidewire.proxy_protocol")

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

ProtocolFactory = Callable[[Address | None], asyncio.BaseProtocol]
RefusedHook = Callable[[str, str], None]  # (the socket's peer as "host:port", reason)

_TRANSIENT_ACCEPT_ERRORS = frozenset({errno.ECONNABORTED, errno.EPROTO, errno.EAGAIN, errno.EINTR})


class _Pending:
    """A socket accepted and not yet handed to a transport; whoever ends the admission closes it if still held."""

    __slots__ = ("sock",)

    def __init__(self, sock: socket.socket) -> None:
        self.sock: socket.socket | None = sock

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


class AcceptLoop:
    """A TCP listener. With `proxy_protocol`, every connection starts with a PROXY header, read off the accepted
    socket byte-exact (peek, then consume only the header). Then the socket goes to `loop.connect_accepted_socket`,
    so TLS and whatever protocol follows see the stream as the client sent it. At most `max_pending` sockets wait for
    their header and TLS handshake at once; beyond that accepting pauses, so half-sent headers or handshakes cannot
    exhaust fds."""

    def __init__(self, protocol_factory: ProtocolFactory, host: str | None, port: int, *,
                 ssl: ssl_module.SSLContext | None = None, header_timeout: float = 5.0,
                 ssl_handshake_timeout: float | None = None, backlog: int = 4096, max_pending: int = 1024,
                 max_v2_length: int = DEFAULT_MAX_V2_LENGTH, accept_retry_delay: float = 0.1,
                 reuse_address: bool = True, on_refused: RefusedHook | None = None, name: str = "proxy",
                 trusted: Sequence[str] = (), proxy_protocol: bool = True) -> None:
        """`trusted`: networks (CIDR) of the load balancers; a connection from elsewhere is refused before its
        header is read, since anyone who can reach the port could otherwise claim any address. Empty: any."""
        if header_timeout <= 0 or max_pending < 1 or accept_retry_delay <= 0:
            raise ValueError("header_timeout and accept_retry_delay must be > 0, max_pending >= 1")
        if max_v2_length < MIN_MAX_V2_LENGTH:
            raise ValueError(f"max_v2_length must be >= {MIN_MAX_V2_LENGTH}")
        self._factory = protocol_factory
        self._host = host or None
        self._port = port
        self._ssl = ssl
        self._header_timeout = header_timeout
        self._ssl_handshake_timeout = ssl_handshake_timeout
        self._backlog = backlog
        self._max_v2_length = max_v2_length
        self._peek_limit = max(V1_MAX_LENGTH, max_v2_length)
        self._retry_delay = accept_retry_delay
        self._reuse_address = reuse_address
        self._on_refused = on_refused or self._log_refused
        self._name = name
        self._proxy_protocol = proxy_protocol
        self._trusted: tuple[Network, ...] = tuple(ipaddress.ip_network(net, strict=False) for net in trusted)
        self._slots = asyncio.Semaphore(max_pending)
        self._sockets: list[socket.socket] = []
        self._accepting: list[asyncio.Task[None]] = []
        self._admitting: set[asyncio.Task[None]] = set()
        self._closed = False

    @property
    def sockets(self) -> tuple[socket.socket, ...]:
        return tuple(s for s in self._sockets if s.fileno() != -1)

    @property
    def pending(self) -> int:
        """Sockets accepted whose header (or TLS handshake) is not done yet."""
        return len(self._admitting)

    async def start(self) -> None:
        """Bind every address `host` resolves to (all interfaces for None/"") and start accepting."""
        if self._sockets or self._closed:
            raise RuntimeError("AcceptLoop.start() called twice or after close()")
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(self._host, self._port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        seen: set[tuple[int, object]] = set()
        try:
            for family, kind, proto, _, address in infos:
                if (family, address) in seen:
                    continue
                seen.add((family, address))
                sock = socket.socket(family, kind, proto)
                self._sockets.append(sock)
                if self._reuse_address:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:  # as asyncio: one socket per family, not dual-stack
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock.bind(address)
                sock.listen(self._backlog)
                sock.setblocking(False)
        except BaseException:
            for sock in self._sockets:
                sock.close()
            self._sockets.clear()
            raise
        for sock in self._sockets:
            task = loop.create_task(self._accept_loop(sock))
            task.add_done_callback(functools.partial(_close_listening, sock))
            self._accepting.append(task)

    def close(self) -> None:
        """Stop accepting and drop the connections still in their PROXY header or TLS handshake."""
        self._closed = True
        for task in (*self._accepting, *self._admitting):
            task.cancel()

    async def wait_closed(self) -> None:
        await asyncio.gather(*self._accepting, *self._admitting, return_exceptions=True)
        for sock in self._sockets:
            sock.close()

    # --- internals ----------------------------------------------------------------------------------------------
    async def _accept_loop(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        failing = False
        while True:
            await self._slots.acquire()
            accepted: tuple[socket.socket, object] | None = None
            try:
                accepted = await loop.sock_accept(sock)
            except OSError as exc:
                if exc.errno in _TRANSIENT_ACCEPT_ERRORS:
                    continue
                if not failing:  # one line per streak: EMFILE would otherwise log at 1/retry_delay
                    log.warning("proxy_protocol.accept_failed", extra={"listener": self._name, "error": str(exc)})
                failing = True
                await asyncio.sleep(self._retry_delay)
                continue
            finally:
                if accepted is None:
                    self._slots.release()
            if failing:
                failing = False
                log.info("proxy_protocol.accept_recovered", extra={"listener": self._name})
            conn, address = accepted
            pending = _Pending(conn)
            task = loop.create_task(self._admit(pending, address))
            self._admitting.add(task)
            task.add_done_callback(functools.partial(self._admitted, pending))

    def _admitted(self, pending: _Pending, task: asyncio.Task[None]) -> None:
        pending.close()  # also when the task was cancelled before it ever ran
        self._admitting.discard(task)
        self._slots.release()

    async def _admit(self, pending: _Pending, address: object) -> None:
        sock = pending.sock
        assert sock is not None
        peer = _format_address(address)
        if not self._proxy_protocol:
            return await self._connect(pending, sock, None, peer)
        if self._trusted and not _from(address, self._trusted):
            self._on_refused(peer, "not from a trusted proxy")
            return None
        try:
            sock.setblocking(False)
            async with asyncio.timeout(self._header_timeout):
                result = await self._read_header(sock)
        except TimeoutError:
            result = ProxyError(f"no complete PROXY header within {self._header_timeout:g} s")
        except OSError as exc:
            result = ProxyError(f"socket error before the PROXY header: {exc.strerror or exc}")
        if isinstance(result, ProxyError):
            self._on_refused(peer, result.reason)
            return None
        if not isinstance(result, ProxyHeader):  # _read_header never ends on NeedMore
            return None
        return await self._connect(pending, sock, result.client_address, peer)

    async def _connect(self, pending: _Pending, sock: socket.socket, client: Address | None, peer: str) -> None:
        try:
            protocol = self._factory(client)
        except Exception:
            log.exception("proxy_protocol.factory_failed", extra={"listener": self._name, "peer": peer})
            return
        pending.sock = None  # the transport owns it now, and closes it if the TLS handshake fails
        try:
            await asyncio.get_running_loop().connect_accepted_socket(
                lambda: protocol, sock, ssl=self._ssl,
                ssl_handshake_timeout=self._ssl_handshake_timeout if self._ssl is not None else None)
        except OSError as exc:  # ssl.SSLError, ConnectionError and TimeoutError are all OSError
            reason = exc.reason if isinstance(exc, ssl_module.SSLError) and exc.reason else None
            log.info("tls.handshake_failed",
                     extra={"listener": self._name, "peer": peer, "error": reason or str(exc) or type(exc).__name__})

    async def _read_header(self, sock: socket.socket) -> ParseResult:
        """Peek, parse, then consume only the bytes that the parser says are header: never any application byte."""
        buf = b""
        while True:
            try:
                chunk = sock.recv(self._peek_limit - len(buf), socket.MSG_PEEK)
            except (BlockingIOError, InterruptedError):
                await _readable(sock)
                continue
            if not chunk:
                return ProxyError("connection closed before the PROXY header was complete")
            result = parse_proxy_header(buf + chunk, max_v2_length=self._max_v2_length)
            if isinstance(result, ProxyError):
                return result
            # NeedMore means every byte seen is header; a header says exactly how many are
            buf += sock.recv(result.length - len(buf) if isinstance(result, ProxyHeader) else len(chunk))
            if isinstance(result, ProxyHeader) and len(buf) == result.length:
                return result

    def _log_refused(self, peer: str, reason: str) -> None:
        log.warning("proxy_protocol.refused", extra={"listener": self._name, "peer": peer, "reason": reason})


async def _readable(sock: socket.socket) -> None:
    loop = asyncio.get_running_loop()
    ready = loop.create_future()
    fd = sock.fileno()
    loop.add_reader(fd, _wake, ready)
    try:
        await ready
    finally:
        loop.remove_reader(fd)


def _wake(ready: asyncio.Future[None]) -> None:
    if not ready.done():
        ready.set_result(None)


def _close_listening(sock: socket.socket, _: asyncio.Task[None]) -> None:
    sock.close()  # only once the accept task is over: closing an fd the loop still polls upsets uvloop


def _from(address: object, networks: tuple[Network, ...]) -> bool:
    if not isinstance(address, tuple) or not address:
        return False
    try:
        ip = ipaddress.ip_address(address[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return any(ip in net for net in networks)


def _format_address(address: object) -> str:
    if isinstance(address, tuple) and len(address) >= 2:
        return f"{address[0]}:{address[1]}"
    return str(address)
