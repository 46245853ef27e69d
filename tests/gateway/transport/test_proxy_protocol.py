"""PROXY protocol: the sans-IO parser (v1, v2, TLVs, limits, fuzz); builders shared with the listener tests."""

from __future__ import annotations

import socket
import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidewire.gateway.transport.proxy_protocol import (
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
