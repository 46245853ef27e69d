"""AcceptLoop over real sockets on both asyncio's and uvloop's loops: payload in the header's segment, TLS
right after the header, refusals, untrusted peers, timeouts, the pending bound, EMFILE, clean close."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import resource
import socket
import ssl
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import pytest
import trustme
import uvloop

from tests.gateway.transport.test_proxy_protocol import V1_TCP4, V1_TCP6, v2
from tests.waiting import until
from tidewire.gateway.transport.accept_loop import AcceptLoop
from tidewire.gateway.transport.proxy_protocol import (
    Address,
)

LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {"asyncio": asyncio.new_event_loop,
                                                             "uvloop": uvloop.new_event_loop}


@pytest.fixture(params=list(LOOPS))
def run(request: pytest.FixtureRequest) -> Callable[[Coroutine[Any, Any, None]], None]:
    def runner(coro: Coroutine[Any, Any, None]) -> None:
        with asyncio.Runner(loop_factory=LOOPS[request.param]) as r:
            r.run(asyncio.wait_for(coro, 20))
    return runner


class Echo(asyncio.Protocol):
    def __init__(self, peer: Address | None, seen: Seen) -> None:
        self.peer, self.seen = peer, seen

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: Any = transport
        self.seen.peers.append(self.peer)
        self.seen.tls.append(transport.get_extra_info("ssl_object") is not None)

    def data_received(self, data: bytes) -> None:
        self.transport.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.seen.ended += 1


@dataclass
class Seen:
    port: int = 0
    peers: list[Address | None] = field(default_factory=list)
    tls: list[bool] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)
    ended: int = 0  # served connections that are over (their socket closed)


@contextlib.asynccontextmanager
async def serving(**kwargs: Any) -> AsyncIterator[tuple[AcceptLoop, Seen]]:
    seen = Seen()
    kwargs.setdefault("header_timeout", 5.0)
    listener = AcceptLoop(lambda peer: Echo(peer, seen), "127.0.0.1", 0,
                             on_refused=lambda peer, reason: seen.refused.append((peer, reason)), **kwargs)
    await listener.start()
    seen.port = listener.sockets[0].getsockname()[1]
    try:
        yield listener, seen
    finally:
        listener.close()
        await listener.wait_closed()


async def echo_once(port: int, first: bytes, payload: bytes) -> bytes:
    """One send of `first + payload`, then read the echo of `payload`."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(first + payload)
        return await asyncio.wait_for(reader.readexactly(len(payload)), 5)
    finally:
        await close(writer)


async def close(writer: asyncio.StreamWriter) -> None:
    """Close our side and wait until the socket is closed (a reset by the server is fine)."""
    writer.close()
    with contextlib.suppress(ConnectionError):
        await writer.wait_closed()


async def closed_by_server(reader: asyncio.StreamReader) -> bool:
    with contextlib.suppress(ConnectionError):
        return await asyncio.wait_for(reader.read(), 5) == b""
    return True


def test_v2_header_and_payload_in_one_segment(run: Callable[[Any], None]) -> None:
    async def scenario() -> None:
        async with serving() as (_, seen):
            assert await echo_once(seen.port, v2(), b"\x10\x0c\x00\x04MQTT") == b"\x10\x0c\x00\x04MQTT"
            assert await echo_once(seen.port, v2(command=0), b"local") == b"local"
            assert seen.peers == [("203.0.113.7", 40000), None] and seen.tls == [False, False]
            assert seen.refused == []
    run(scenario())


def test_only_trusted_proxies_may_send_a_header(run: Callable[[Any], None]) -> None:
    async def scenario() -> None:
        async with serving(trusted=["10.0.0.0/8", "::1/128"]) as (_, seen):
            reader, writer = await asyncio.open_connection("127.0.0.1", seen.port)
            writer.write(v2() + b"spoofed")
            assert await closed_by_server(reader)
            writer.close()
            assert seen.peers == [] and seen.refused[0][1] == "not from a trusted proxy"
        async with serving(trusted=["127.0.0.0/8"]) as (_, seen):
            assert await echo_once(seen.port, v2(), b"ok") == b"ok"
            assert seen.peers == [("203.0.113.7", 40000)]
    run(scenario())


def test_v1_header_and_payload_in_one_segment(run: Callable[[Any], None]) -> None:
    async def scenario() -> None:
        async with serving() as (_, seen):
            assert await echo_once(seen.port, V1_TCP6, b"hello\r\n") == b"hello\r\n"
            assert await echo_once(seen.port, b"PROXY UNKNOWN\r\n", b"x") == b"x"
            assert seen.peers == [("2001:db8::1", 1), None]
    run(scenario())


def test_header_trickled_byte_by_byte(run: Callable[[Any], None]) -> None:
    async def scenario() -> None:
        async with serving() as (_, seen):
            for raw in (V1_TCP4, v2(family=2, src=("2001:db8::5", 7), dst=("::1", 1))):
                reader, writer = await asyncio.open_connection("127.0.0.1", seen.port)
                for i in range(len(raw)):
                    writer.write(raw[i:i + 1])
                    await writer.drain()
                    await asyncio.sleep(0.002)  # the behaviour under test: each byte arrives on its own
                writer.write(b"after")
                assert await asyncio.wait_for(reader.readexactly(5), 5) == b"after"
                writer.close()
            assert seen.peers == [("192.0.2.1", 56324), ("2001:db8::5", 7)]
    run(scenario())


def test_garbage_is_closed_and_others_are_served(run: Callable[[Any], None]) -> None:
    async def scenario() -> None:
        async with serving() as (_, seen):
            for garbage in (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"\x10\x0c\x00\x04MQTT\x04\x02\x00\x3c",
                            b"PROXY TCP4 1.2.3.4 5.6.7.8 1 99999\r\n"):
                reader, writer = await asyncio.open_connection("127.0.0.1", seen.port)
                writer.write(garbage)
                assert await closed_by_server(reader)
                writer.close()
                assert await echo_once(seen.port, v2(), b"ok") == b"ok"
            assert len(seen.refused) == 3 and all(peer.startswith("127.0.0.1:") for peer, _ in seen.refused)
            assert "not a PROXY" in seen.refused[0][1] and "port" in seen.refused[2][1]
            assert len(seen.peers) == 3
    run(scenario())


def test_silent_client_times_out(run: Callable[[Any], None]) -> None:
    async def scenario() -> None:
        async with serving(header_timeout=0.2) as (listener, seen):
            reader, writer = await asyncio.open_connection("127.0.0.1", seen.port)
            started = time.monotonic()
            assert await closed_by_server(reader)
            assert 0.15 < time.monotonic() - started < 2
            writer.close()
            assert "within 0.2 s" in seen.refused[0][1] and listener.pending == 0
            assert await echo_once(seen.port, V1_TCP4, b"still") == b"still"
    run(scenario())


@pytest.fixture(scope="module")
def tls() -> tuple[ssl.SSLContext, ssl.SSLContext]:
    ca = trustme.CA()
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost").configure_cert(server)
    client = ssl.create_default_context()
    ca.configure_trust(client)
    return server, client


async def tls_echo_with_header_in_first_segment(port: int, prefix: bytes, client: ssl.SSLContext,
                                                payload: bytes) -> bytes:
    """A TLS client whose ClientHello leaves in the same send() as the PROXY header: the server must stop at the
    header's last byte for the handshake to work."""
    loop = asyncio.get_running_loop()
    with socket.socket() as sock:
        sock.setblocking(False)
        await loop.sock_connect(sock, ("127.0.0.1", port))
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        tls = client.wrap_bio(incoming, outgoing, server_hostname="localhost")

        async def pump() -> None:
            data = await asyncio.wait_for(loop.sock_recv(sock, 65536), 5)
            if not data:
                raise ConnectionError("server closed during TLS")
            incoming.write(data)

        while True:
            try:
                tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                await loop.sock_sendall(sock, prefix + outgoing.read())
                prefix = b""
                await pump()
        tls.write(payload)
        await loop.sock_sendall(sock, outgoing.read())
        got = b""
        while len(got) < len(payload):
            try:
                got += tls.read(65536)
            except ssl.SSLWantReadError:
                await pump()
        return got


def test_tls_after_the_header(run: Callable[[Any], None], tls: tuple[ssl.SSLContext, ssl.SSLContext]) -> None:
    server, client = tls

    async def scenario() -> None:
        async with serving(ssl=server, ssl_handshake_timeout=5) as (_, seen):
            got = await tls_echo_with_header_in_first_segment(seen.port, v2(), client, b"secret-free payload")
            assert got == b"secret-free payload"
            # the ordinary way: header written on the plain socket, then the socket is upgraded
            reader, writer = await asyncio.open_connection("127.0.0.1", seen.port)
            writer.write(V1_TCP4)
            await writer.drain()
            await writer.start_tls(client, server_hostname="localhost")
            writer.write(b"over tls")
            assert await asyncio.wait_for(reader.readexactly(8), 5) == b"over tls"
            writer.close()
            assert seen.peers == [("203.0.113.7", 40000), ("192.0.2.1", 56324)] and seen.tls == [True, True]
            # not TLS after the header: the handshake fails, the socket is closed, the listener carries on
            reader, writer = await asyncio.open_connection("127.0.0.1", seen.port)
            writer.write(v2() + b"GET / HTTP/1.1\r\n\r\n")
            assert await closed_by_server(reader)
            writer.close()
            got = await tls_echo_with_header_in_first_segment(seen.port, V1_TCP6, client, b"again")
            assert got == b"again" and len(seen.peers) == 3
    run(scenario())


def test_pending_headers_are_bounded(run: Callable[[Any], None]) -> None:
    async def scenario() -> None:
        async with serving(max_pending=2) as (listener, seen):
            slow = [await asyncio.open_connection("127.0.0.1", seen.port) for _ in range(2)]
            for _, writer in slow:
                writer.write(b"PROXY TCP4 ")
            await until(lambda: listener.pending == 2)
            reader, writer = await asyncio.open_connection("127.0.0.1", seen.port)
            writer.write(v2() + b"waiting")
            with pytest.raises(TimeoutError):  # queued in the backlog: not accepted while 2 are pending
                await asyncio.wait_for(reader.readexactly(7), 0.3)
            slow[0][1].close()  # one slow client goes away: its slot frees and the queued one is served
            assert await asyncio.wait_for(reader.readexactly(7), 5) == b"waiting"
            writer.close()
            slow[1][1].close()
            assert seen.peers == [("203.0.113.7", 40000)]
            assert "closed before" in seen.refused[0][1]
    run(scenario())


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_close_drops_pending_and_leaks_nothing(run: Callable[[Any], None]) -> None:
    async def scenario() -> None:
        async with serving() as (_, seen):  # uvloop opens one fd of its own on its first connection
            assert await echo_once(seen.port, v2(), b"warm-up") == b"warm-up"
            await until(lambda: seen.ended == 1, what="the served side of the warm-up closed")
        gc.collect()  # earlier tests' garbage (sockets, loops) closes its fds now, not in the middle of this count
        baseline = _open_fds()
        seen = Seen()
        listener = AcceptLoop(lambda peer: Echo(peer, seen), "127.0.0.1", 0, header_timeout=5,
                                 on_refused=lambda peer, reason: seen.refused.append((peer, reason)))
        await listener.start()
        port = listener.sockets[0].getsockname()[1]
        assert await echo_once(port, v2(), b"x") == b"x"
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"garbage\r\n")
        assert await closed_by_server(reader)
        await close(writer)
        half = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
        for _, writer in half:
            writer.write(v2()[:20])
        await until(lambda: listener.pending == 3)
        listener.close()
        await listener.wait_closed()
        assert listener.sockets == () and listener.pending == 0
        for reader, writer in half:
            assert await closed_by_server(reader)
            await close(writer)
        await until(lambda: seen.ended == 1, what="the served side of the echo closed")
        with pytest.raises(ConnectionRefusedError):
            await asyncio.open_connection("127.0.0.1", port)
        gc.collect()
        assert _open_fds() <= baseline  # a leak adds fds; fewer is garbage of other tests' closing late
    run(scenario())


def test_accept_survives_emfile(run: Callable[[Any], None], caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        async with serving(accept_retry_delay=0.05) as (_, seen):
            clients = [socket.socket() for _ in range(2)]
            soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            lowest_free = os.dup(0)
            os.close(lowest_free)
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free, hard))  # no new fd can be made
                for sock in clients:
                    sock.setblocking(False)
                    await loop.sock_connect(sock, ("127.0.0.1", seen.port))
                await until(lambda: any(r.getMessage() == "proxy_protocol.accept_failed" for r in caplog.records),
                            what="an accept failing with EMFILE")
                # the behaviour under test: the fds stay exhausted while several more accepts fail (every 50 ms)
                await asyncio.sleep(0.2)
            finally:
                resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
            failures = [r for r in caplog.records if r.getMessage() == "proxy_protocol.accept_failed"]
            assert len(failures) == 1 and "Too many open files" in failures[0].__dict__["error"]
            for i, sock in enumerate(clients):
                await loop.sock_sendall(sock, v2() + bytes([i]))
                assert await asyncio.wait_for(loop.sock_recv(sock, 1), 5) == bytes([i])
                sock.close()
            assert any(r.getMessage() == "proxy_protocol.accept_recovered" for r in caplog.records)
            assert len(seen.peers) == 2
    with caplog.at_level(logging.INFO, logger="tidewire.proxy_protocol"):
        run(scenario())


def test_default_refusal_log_line(run: Callable[[Any], None], caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        listener = AcceptLoop(lambda peer: asyncio.Protocol(), "127.0.0.1", 0, name="mqtts")
        await listener.start()
        port = listener.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"\x16\x03\x01\x02\x00")
        assert await closed_by_server(reader)
        writer.close()
        listener.close()
        await listener.wait_closed()
    with caplog.at_level(logging.INFO, logger="tidewire.proxy_protocol"):
        run(scenario())
    lines = [r for r in caplog.records if r.getMessage() == "proxy_protocol.refused"]
    assert len(lines) == 1 and lines[0].__dict__["listener"] == "mqtts"
    assert lines[0].__dict__["peer"].startswith("127.0.0.1:") and lines[0].levelno == logging.WARNING
