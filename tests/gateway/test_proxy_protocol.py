"""PROXY protocol: the sans-IO parser (v1, v2, TLVs, limits, fuzz) and ProxyListener over real sockets on both
asyncio's and uvloop's loops (payload in the header's segment, TLS right after the header, refusals, timeouts,
the pending bound, EMFILE, clean close)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import socket
import ssl
import struct
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import pytest
import trustme
import uvloop
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.proxy_protocol import (
    PP2_CLIENT_CERT_CONN,
    PP2_CLIENT_SSL,
    PP2_SUBTYPE_SSL_CN,
    PP2_SUBTYPE_SSL_VERSION,
    PP2_TYPE_ALPN,
    PP2_TYPE_AUTHORITY,
    PP2_TYPE_CRC32C,
    PP2_TYPE_NOOP,
    PP2_TYPE_SSL,
    PP2_TYPE_UNIQUE_ID,
    V2_SIGNATURE,
    Address,
    NeedMore,
    ProxyError,
    ProxyHeader,
    ProxyListener,
    _crc32c,
    parse_proxy_header,
)


# --- builders -------------------------------------------------------------------------------------------------------
def tlv(kind: int, value: bytes) -> bytes:
    return bytes([kind]) + struct.pack("!H", len(value)) + value


def v2(command: int = 1, family: int = 1, transport: int = 1, body: bytes | None = None,
       src: Address = ("203.0.113.7", 40000), dst: Address = ("10.0.0.1", 1883), tlvs: bytes = b"") -> bytes:
    if body is None:
        if family == 1:
            body = socket.inet_aton(src[0]) + socket.inet_aton(dst[0]) + struct.pack("!HH", src[1], dst[1])
        elif family == 2:
            body = (socket.inet_pton(socket.AF_INET6, src[0]) + socket.inet_pton(socket.AF_INET6, dst[0])
                    + struct.pack("!HH", src[1], dst[1]))
        elif family == 3:
            body = src[0].encode().ljust(108, b"\0") + dst[0].encode().ljust(108, b"\0")
        else:
            body = b""
    body += tlvs
    return V2_SIGNATURE + bytes([0x20 | command, family << 4 | transport]) + struct.pack("!H", len(body)) + body


def with_crc(header: bytes) -> bytes:
    """Append a CRC32C TLV (the header length grows by 7) and fill in its checksum."""
    grown = bytearray(header + tlv(PP2_TYPE_CRC32C, b"\0\0\0\0"))
    grown[14:16] = struct.pack("!H", len(grown) - 16)
    grown[-4:] = struct.pack("!I", _crc32c(bytes(grown)))
    return bytes(grown)


V1_TCP4 = b"PROXY TCP4 192.0.2.1 198.51.100.2 56324 1883\r\n"
V1_TCP6 = b"PROXY TCP6 2001:db8::1 2001:db8::2 1 65535\r\n"
V1_UNKNOWN_LONG = b"PROXY UNKNOWN " + b"f" * 79 + b" 65535 65535\r\n"  # 107 bytes, the longest allowed


def header(data: bytes, **kwargs: Any) -> ProxyHeader:
    result = parse_proxy_header(data, **kwargs)
    assert isinstance(result, ProxyHeader), result
    return result


def error(data: bytes, **kwargs: Any) -> str:
    result = parse_proxy_header(data, **kwargs)
    assert isinstance(result, ProxyError), result
    assert result.reason
    return result.reason


# --- parser: v1 -----------------------------------------------------------------------------------------------------
def test_v1_tcp4_with_application_bytes_after() -> None:
    h = header(V1_TCP4 + b"\x10\x0cMQTT")
    assert (h.version, h.command, h.family, h.transport) == (1, "PROXY", "INET", "STREAM")
    assert h.length == len(V1_TCP4)
    assert h.source == ("192.0.2.1", 56324) and h.destination == ("198.51.100.2", 1883)
    assert h.client_address == ("192.0.2.1", 56324)


def test_v1_tcp6_normalised() -> None:
    h = header(b"PROXY TCP6 2001:DB8:0:0::1 ::1 0 65535\r\n")
    assert h.family == "INET6" and h.source == ("2001:db8::1", 0) and h.destination == ("::1", 65535)
    assert header(V1_TCP6).length == len(V1_TCP6)


def test_v1_unknown_uses_the_socket_peer() -> None:
    short = header(b"PROXY UNKNOWN\r\nrest")
    assert short.length == 15 and short.client_address is None and short.family == "UNSPEC"
    assert header(V1_UNKNOWN_LONG).length == 107 == len(V1_UNKNOWN_LONG)


@pytest.mark.parametrize("line", [
    b"PROXY TCP4 2001:db8::1 10.0.0.1 1 2\r\n",  # family mismatch
    b"PROXY TCP6 10.0.0.1 10.0.0.2 1 2\r\n",
    b"PROXY TCP4 10.0.0.01 10.0.0.2 1 2\r\n",  # leading zero in an octet
    b"PROXY TCP4 10.0.0.1 10.0.0.2 01 2\r\n",  # leading zero in a port
    b"PROXY TCP4 10.0.0.1 10.0.0.2 1 65536\r\n",
    b"PROXY TCP4 10.0.0.1 10.0.0.2 -1 2\r\n",
    b"PROXY TCP4 10.0.0.1 10.0.0.2 1\r\n",  # 5 fields
    b"PROXY TCP4 10.0.0.1 10.0.0.2 1 2 3\r\n",
    b"PROXY TCP4 10.0.0.1  10.0.0.2 1 2\r\n",  # double space
    b"PROXY TCP4 256.0.0.1 10.0.0.2 1 2\r\n",
    b"PROXY TCP6 fe80::1%eth0 ::1 1 2\r\n",  # scope id
    b"PROXY TCP4 10.0.0.1 10.0.0.2 1 2\n",  # bare LF
    b"PROXY TCP4 10.0.0.1\r10.0.0.2 1 2\r\n",  # bare CR
    b"PROXY tcp4 10.0.0.1 10.0.0.2 1 2\r\n",
    b"PROXY TCP5 10.0.0.1 10.0.0.2 1 2\r\n",
    b"PROXY \r\n",
    b"PROXY TCP4 10.0.0.1 10.0.0.2 1 2\xc3\xa9\r\n",
    b"PROXY UNKNOWN " + b"f" * 80 + b" 65535 65535\r\n",  # 108 bytes
    b"PROXY UNKNOWN " + b"f" * 200,  # no CRLF within 107 bytes
])
def test_v1_malformed(line: bytes) -> None:
    error(line)


@pytest.mark.parametrize("data", [b"GET / HTTP/1.1\r\n", b"\x10\x0c\x00\x04MQTT", b"\x16\x03\x01", b"proxy",
                                  b"PROXY XYZ", b"PROXY TCP4X", b"PROXY UNKNOWNX", b"PROXY TC\r"])
def test_garbage_is_refused_before_any_crlf(data: bytes) -> None:
    error(data)


# --- parser: v2 -----------------------------------------------------------------------------------------------------
def test_v2_proxy_tcp4_and_tcp6() -> None:
    raw = v2()
    h = header(raw + b"\x10MQTT")
    assert (h.version, h.command, h.family, h.transport, h.length) == (2, "PROXY", "INET", "STREAM", len(raw))
    assert h.client_address == ("203.0.113.7", 40000) and h.destination == ("10.0.0.1", 1883)
    six = header(v2(family=2, src=("2001:db8::7", 65535), dst=("::1", 0)))
    assert six.family == "INET6" and six.source == ("2001:db8::7", 65535) and six.destination == ("::1", 0)


def test_v2_local_ignores_addresses() -> None:
    h = header(v2(command=0))
    assert h.command == "LOCAL" and h.source is None and h.client_address is None
    bare = header(v2(command=0, family=0, transport=0))
    assert bare.length == 16 and bare.client_address is None


def test_v2_unix_and_unspec() -> None:
    h = header(v2(family=3, src=("/run/client.sock", 0), dst=("/run/gw.sock", 0)))
    assert h.family == "UNIX" and h.unix_source == b"/run/client.sock" and h.unix_destination == b"/run/gw.sock"
    assert h.client_address is None and h.length == 16 + 216
    assert header(v2(family=0, transport=0)).client_address is None
    assert header(v2(transport=2)).transport == "DGRAM"


def test_v2_tlvs_kept_raw_and_ssl_parsed() -> None:
    ssl_tlv = tlv(PP2_TYPE_SSL, bytes([PP2_CLIENT_SSL | PP2_CLIENT_CERT_CONN]) + b"\0\0\0\0"
                  + tlv(PP2_SUBTYPE_SSL_VERSION, b"TLSv1.3") + tlv(PP2_SUBTYPE_SSL_CN, "dévice-1".encode())
                  + tlv(0x2F, b"unknown sub-type"))
    tlvs = (tlv(PP2_TYPE_ALPN, b"mqtt") + tlv(PP2_TYPE_AUTHORITY, b"gw.example") + tlv(PP2_TYPE_NOOP, b"")
            + tlv(PP2_TYPE_UNIQUE_ID, b"u" * 128) + ssl_tlv + tlv(0xEA, b"\x01vpce-123"))
    h = header(v2(tlvs=tlvs))
    assert h.tlv(PP2_TYPE_ALPN) == b"mqtt" and h.tlv(PP2_TYPE_AUTHORITY) == b"gw.example"
    assert h.tlv(0xEA) == b"\x01vpce-123" and h.tlv(0x99) is None
    assert [kind for kind, _ in h.tlvs] == [PP2_TYPE_ALPN, PP2_TYPE_AUTHORITY, PP2_TYPE_NOOP, PP2_TYPE_UNIQUE_ID,
                                            PP2_TYPE_SSL, 0xEA]
    assert h.ssl is not None
    assert (h.ssl.client, h.ssl.verify, h.ssl.version, h.ssl.cn) == (3, 0, "TLSv1.3", "dévice-1")


def test_v2_crc32c() -> None:
    assert _crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value
    good = with_crc(v2(tlvs=tlv(PP2_TYPE_ALPN, b"mqtt")))
    assert header(good).tlv(PP2_TYPE_CRC32C) == good[-4:]
    bad = bytearray(good)
    bad[16] ^= 1  # a source address bit
    assert "CRC32C" in error(bytes(bad))
    assert "CRC32C" in error(v2(tlvs=tlv(PP2_TYPE_CRC32C, b"\0\0\0")))


@pytest.mark.parametrize("raw", [
    V2_SIGNATURE + b"\x11\x11\x00\x0c" + bytes(12),  # version 1 in the v2 format
    V2_SIGNATURE + b"\x22\x11\x00\x0c" + bytes(12),  # command 2
    V2_SIGNATURE + b"\x21\x41\x00\x00",  # family 4
    V2_SIGNATURE + b"\x21\x13\x00\x0c" + bytes(12),  # transport 3
    V2_SIGNATURE + b"\x21\x11\x00\x0b" + bytes(11),  # too short for IPv4 addresses
    V2_SIGNATURE + b"\x21\x21\x00\x0c" + bytes(12),  # too short for IPv6 addresses
    V2_SIGNATURE + b"\x20\x31\x00\x10" + bytes(16),  # LOCAL, still too short for UNIX addresses
    v2(tlvs=b"\x01\x00"),  # TLV header truncated
    v2(tlvs=b"\x01\x00\x05abc"),  # TLV value runs past the header
    v2(tlvs=tlv(PP2_TYPE_UNIQUE_ID, b"u" * 129)),
    v2(tlvs=tlv(PP2_TYPE_SSL, b"\x01\0\0\0")),  # SSL TLV shorter than client + verify
    v2(tlvs=tlv(PP2_TYPE_SSL, b"\x01\0\0\0\0" + b"\x22\x00\x09abc")),  # SSL sub-TLV runs past
    v2(tlvs=tlv(PP2_TYPE_SSL, b"\x01\0\0\0\0" + tlv(PP2_SUBTYPE_SSL_CN, b"\xff\xfe"))),
    V2_SIGNATURE[:11] + b"X",
])
def test_v2_malformed(raw: bytes) -> None:
    error(raw)


def test_v2_oversize_refused_from_its_fixed_part() -> None:
    big = v2(tlvs=tlv(PP2_TYPE_NOOP, bytes(5000)))
    assert "limit" in error(big[:16])  # refused before the body is even read
    assert header(big, max_v2_length=16 + 65535).length == len(big)
    huge = V2_SIGNATURE + b"\x21\x11\xff\xff"
    assert isinstance(parse_proxy_header(huge), ProxyError)


# --- parser: incremental input --------------------------------------------------------------------------------------
VALID = [V1_TCP4, V1_TCP6, b"PROXY UNKNOWN\r\n", V1_UNKNOWN_LONG, v2(), v2(family=2, src=("::1", 1), dst=("::2", 2)),
         v2(command=0, family=0, transport=0), v2(family=3, src=("/a", 0), dst=("/b", 0)),
         with_crc(v2(tlvs=tlv(PP2_TYPE_ALPN, b"mqtt")))]


@pytest.mark.parametrize("raw", VALID)
def test_every_prefix_needs_more_and_never_overreads(raw: bytes) -> None:
    """NeedMore's count never reaches past the header: a reader that trusts it reads no application byte."""
    for cut in range(len(raw)):
        result = parse_proxy_header(raw[:cut])
        assert isinstance(result, NeedMore), (cut, result)
        assert 1 <= result.count <= len(raw) - cut
    assert header(raw).length == len(raw)


def test_reading_exactly_what_needmore_asks_assembles_the_header() -> None:
    for raw in VALID:
        stream, buf = raw + b"APPLICATION", b""
        while True:
            result = parse_proxy_header(buf)
            if isinstance(result, ProxyHeader):
                break
            assert isinstance(result, NeedMore)
            buf += stream[len(buf):len(buf) + result.count]
        assert buf == raw and result.length == len(raw)


# --- parser: fuzz ---------------------------------------------------------------------------------------------------
def _check_any(result: object) -> None:
    assert isinstance(result, ProxyHeader | NeedMore | ProxyError)
    if isinstance(result, NeedMore):
        assert result.count >= 1
    if isinstance(result, ProxyError):
        assert result.reason


@settings(max_examples=400, deadline=None)
@given(st.sampled_from([b"", V2_SIGNATURE, V2_SIGNATURE + b"\x21", V2_SIGNATURE + b"\x21\x11", b"PROXY ",
                        b"PROXY TCP4 ", b"PROXY TCP6 ", b"PROXY UNKNOWN"]), st.binary(max_size=300))
def test_random_bytes_never_raise(prefix: bytes, tail: bytes) -> None:
    _check_any(parse_proxy_header(prefix + tail))


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(VALID), st.lists(st.tuples(st.integers(0), st.integers(0, 255)), max_size=4),
       st.binary(max_size=50))
def test_mutated_headers_never_raise_and_complete_ones_ignore_the_tail(raw: bytes, flips: list[tuple[int, int]],
                                                                     tail: bytes) -> None:
    assert parse_proxy_header(raw + tail) == parse_proxy_header(raw)
    buf = bytearray(raw)
    for where, value in flips:
        buf[where % len(buf)] = value
    result = parse_proxy_header(bytes(buf) + tail)
    _check_any(result)
    if isinstance(result, ProxyHeader):
        assert result.length <= len(buf)


@settings(max_examples=200, deadline=None)
@given(st.ip_addresses(v=4) | st.ip_addresses(v=6), st.integers(0, 65535), st.integers(0, 65535),
       st.lists(st.tuples(st.sampled_from([PP2_TYPE_ALPN, PP2_TYPE_AUTHORITY, PP2_TYPE_NOOP, 0xE0, 0xF1]),
                          st.binary(max_size=40)), max_size=5))
def test_v2_and_v1_round_trip(ip: Any, sport: int, dport: int, tlvs: list[tuple[int, bytes]]) -> None:
    family = 1 if ip.version == 4 else 2
    dst = "10.1.2.3" if family == 1 else "2001:db8::9"
    h = header(v2(family=family, src=(str(ip), sport), dst=(dst, dport), tlvs=b"".join(tlv(k, v) for k, v in tlvs)))
    assert h.source == (str(ip), sport) and h.destination == (dst, dport) and list(h.tlvs) == tlvs
    line = f"PROXY TCP{ip.version} {ip} {dst} {sport} {dport}\r\n".encode()
    assert header(line).source == (str(ip), sport)


# --- listener -------------------------------------------------------------------------------------------------------
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


@dataclass
class Seen:
    port: int = 0
    peers: list[Address | None] = field(default_factory=list)
    tls: list[bool] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)


@contextlib.asynccontextmanager
async def serving(**kwargs: Any) -> AsyncIterator[tuple[ProxyListener, Seen]]:
    seen = Seen()
    kwargs.setdefault("header_timeout", 5.0)
    listener = ProxyListener(lambda peer: Echo(peer, seen), "127.0.0.1", 0,
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
        writer.close()


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
                    await asyncio.sleep(0.002)
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
            await asyncio.sleep(0.1)
            assert listener.pending == 2
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
        await asyncio.sleep(0.05)
        baseline = _open_fds()
        seen = Seen()
        listener = ProxyListener(lambda peer: Echo(peer, seen), "127.0.0.1", 0, header_timeout=5,
                                 on_refused=lambda peer, reason: seen.refused.append((peer, reason)))
        await listener.start()
        port = listener.sockets[0].getsockname()[1]
        assert await echo_once(port, v2(), b"x") == b"x"
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"garbage\r\n")
        assert await closed_by_server(reader)
        writer.close()
        half = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
        for _, writer in half:
            writer.write(v2()[:20])
        await asyncio.sleep(0.1)
        assert listener.pending == 3
        listener.close()
        await listener.wait_closed()
        assert listener.sockets == () and listener.pending == 0
        for reader, writer in half:
            assert await closed_by_server(reader)
            writer.close()
        await asyncio.sleep(0.05)
        with pytest.raises(ConnectionRefusedError):
            await asyncio.open_connection("127.0.0.1", port)
        assert _open_fds() == baseline
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
                await asyncio.sleep(0.3)  # several accept attempts fail with EMFILE meanwhile
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
        listener = ProxyListener(lambda peer: asyncio.Protocol(), "127.0.0.1", 0, name="mqtts")
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
