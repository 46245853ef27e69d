"""PROXY protocol (HAProxy spec, v1 text and v2 binary): a sans-IO header parser. `gateway.transport.accept_loop`
reads the header off each accepted socket with it."""

from __future__ import annotations

import ipaddress
import logging
from dataclasses import dataclass, replace
from typing import Literal

log = logging.getLogger("tidewire.proxy_protocol")

V2_SIGNATURE = b"\r\n\r\n\x00\r\nQUIT\n"
V1_PREFIX = b"PROXY "
V1_MIN_LENGTH = 15  # b"PROXY UNKNOWN\r\n"
V1_MAX_LENGTH = 107  # the spec's worst case, CRLF included
V2_FIXED_LENGTH = 16
DEFAULT_MAX_V2_LENGTH = 4096  # whole v2 header; the spec allows 16 + 65535, load balancers send far less

PP2_TYPE_ALPN = 0x01
PP2_TYPE_AUTHORITY = 0x02
PP2_TYPE_CRC32C = 0x03
PP2_TYPE_NOOP = 0x04
PP2_TYPE_UNIQUE_ID = 0x05
PP2_TYPE_SSL = 0x20
PP2_SUBTYPE_SSL_VERSION = 0x21
PP2_SUBTYPE_SSL_CN = 0x22
PP2_SUBTYPE_SSL_CIPHER = 0x23
PP2_SUBTYPE_SSL_SIG_ALG = 0x24
PP2_SUBTYPE_SSL_KEY_ALG = 0x25
PP2_TYPE_NETNS = 0x30
PP2_CLIENT_SSL = 0x01
PP2_CLIENT_CERT_CONN = 0x02
PP2_CLIENT_CERT_SESS = 0x04
MAX_UNIQUE_ID_LENGTH = 128

Family = Literal["INET", "INET6", "UNIX", "UNSPEC"]
Transport = Literal["STREAM", "DGRAM", "UNSPEC"]
Address = tuple[str, int]

_FAMILIES: tuple[Family, ...] = ("UNSPEC", "INET", "INET6", "UNIX")
_TRANSPORTS: tuple[Transport, ...] = ("UNSPEC", "STREAM", "DGRAM")
_ADDRESS_BLOCK = (0, 12, 36, 216)  # bytes of addresses per family, indexed like _FAMILIES
MIN_MAX_V2_LENGTH = V2_FIXED_LENGTH + _ADDRESS_BLOCK[3]  # a limit below this would refuse valid UNIX headers
_V1_PROTOCOLS = (b"TCP4", b"TCP6", b"UNKNOWN")


@dataclass(frozen=True, slots=True)
class SslInfo:
    """PP2_TYPE_SSL: what the proxy learnt from the TLS connection it terminated."""

    client: int  # PP2_CLIENT_* bits
    verify: int  # 0: the client presented a certificate and it verified
    version: str | None = None
    cn: str | None = None
    cipher: str | None = None
    sig_alg: str | None = None
    key_alg: str | None = None


@dataclass(frozen=True, slots=True)
class ProxyHeader:
    """One complete header; exactly `length` bytes of the stream belong to it, the rest to the application."""

    length: int
    version: Literal[1, 2]
    command: Literal["PROXY", "LOCAL"]
    family: Family
    transport: Transport
    source: Address | None = None  # None for LOCAL, UNKNOWN, UNSPEC and UNIX
    destination: Address | None = None
    unix_source: bytes | None = None  # AF_UNIX paths, trailing NULs removed
    unix_destination: bytes | None = None
    tlvs: tuple[tuple[int, bytes], ...] = ()
    ssl: SslInfo | None = None

    @property
    def client_address(self) -> Address | None:
        """The peer to report instead of the socket's; None: use the socket's own peer."""
        return self.source if self.command == "PROXY" else None

    def tlv(self, kind: int) -> bytes | None:
        return next((value for t, value in self.tlvs if t == kind), None)


@dataclass(frozen=True, slots=True)
class NeedMore:
    """The input is a valid, incomplete header prefix. At least `count` more bytes are needed, and the next `count`
    bytes all belong to the header, so reading exactly that many never reads application data."""

    count: int


@dataclass(frozen=True, slots=True)
class ProxyError:
    reason: str


ParseResult = ProxyHeader | NeedMore | ProxyError


def parse_proxy_header(data: bytes | bytearray | memoryview, *,
                       max_v2_length: int = DEFAULT_MAX_V2_LENGTH) -> ParseResult:
    """Parse the header at the start of `data` (which may hold application bytes after it). Never raises."""
    buf = bytes(data)
    if not buf:
        return NeedMore(V1_MIN_LENGTH)
    if V2_SIGNATURE.startswith(buf[:12]):
        return _parse_v2(buf, max_v2_length)
    if V1_PREFIX.startswith(buf[:6]):
        return _parse_v1(buf)
    return ProxyError("not a PROXY protocol header")


# --- v1 -----------------------------------------------------------------------------------------------------------
def _printable(data: bytes) -> bool:
    return all(0x20 <= b <= 0x7E for b in data)


def _parse_v1(buf: bytes) -> ParseResult:
    end = buf.find(b"\r\n", 0, V1_MAX_LENGTH)
    if end < 0:
        head = buf[:V1_MAX_LENGTH]
        if len(head) >= V1_MAX_LENGTH:
            return ProxyError("v1 header longer than 107 bytes")
        pending_cr = head.endswith(b"\r")
        if not _printable(head[:-1] if pending_cr else head):
            return ProxyError("v1 header has a control or non-ASCII byte")
        if len(head) > 6:
            token = head[6:].rstrip(b"\r").split(b" ", 1)
            complete = len(token) > 1 or pending_cr
            if not (token[0] in _V1_PROTOCOLS if complete else any(p.startswith(token[0]) for p in _V1_PROTOCOLS)):
                return ProxyError("v1 protocol is not TCP4, TCP6 or UNKNOWN")
        return NeedMore(max(V1_MIN_LENGTH - len(head), 1 if pending_cr else 2))
    line = buf[:end]
    if not _printable(line):
        return ProxyError("v1 header has a control or non-ASCII byte")
    parts = line.split(b" ")
    proto = parts[1]
    if proto == b"UNKNOWN":  # the spec: ignore whatever follows up to the CRLF
        return ProxyHeader(end + 2, 1, "PROXY", "UNSPEC", "UNSPEC")
    if proto not in (b"TCP4", b"TCP6"):
        return ProxyError("v1 protocol is not TCP4, TCP6 or UNKNOWN")
    if len(parts) != 6:
        return ProxyError("v1 header does not have 6 fields")
    six = proto == b"TCP6"
    src, dst = _v1_address(parts[2], six), _v1_address(parts[3], six)
    sport, dport = _v1_port(parts[4]), _v1_port(parts[5])
    if src is None or dst is None:
        return ProxyError(f"v1 {proto.decode()} address is invalid")
    if sport is None or dport is None:
        return ProxyError("v1 port is invalid")
    return ProxyHeader(end + 2, 1, "PROXY", "INET6" if six else "INET", "STREAM", (src, sport), (dst, dport))


def _v1_address(token: bytes, six: bool) -> str | None:
    allowed = b"0123456789abcdefABCDEF:." if six else b"0123456789."
    if not token or token.strip(allowed):
        return None  # also keeps IPv6 scope ids and the int/other forms ipaddress accepts out
    try:
        text = token.decode("ascii")
        return str(ipaddress.IPv6Address(text) if six else ipaddress.IPv4Address(text))
    except ValueError:
        return None


def _v1_port(token: bytes) -> int | None:
    if not token.isdigit() or len(token) > 5 or (len(token) > 1 and token.startswith(b"0")):
        return None
    port = int(token)
    return port if port <= 0xFFFF else None


# --- v2 -----------------------------------------------------------------------------------------------------------
def _parse_v2(buf: bytes, max_length: int) -> ParseResult:
    n = len(buf)
    if n >= 13:
        if buf[12] >> 4 != 2:
            return ProxyError("v2 version is not 2")
        if buf[12] & 0x0F > 1:
            return ProxyError("v2 command is neither LOCAL nor PROXY")
    if n >= 14 and (buf[13] >> 4 > 3 or buf[13] & 0x0F > 2):
        return ProxyError("v2 address family or transport is unknown")
    if n < V2_FIXED_LENGTH:
        return NeedMore(V2_FIXED_LENGTH - n)
    command: Literal["PROXY", "LOCAL"] = "PROXY" if buf[12] & 0x0F else "LOCAL"
    af, tp = buf[13] >> 4, buf[13] & 0x0F
    body_length = int.from_bytes(buf[14:16], "big")
    total = V2_FIXED_LENGTH + body_length
    if total > max_length:
        return ProxyError(f"v2 header of {total} bytes is over the {max_length} byte limit")
    address_length = _ADDRESS_BLOCK[af]
    if body_length < address_length:
        return ProxyError(f"v2 {_FAMILIES[af]} header too short for its addresses")
    if n < total:
        return NeedMore(total - n)
    body = buf[V2_FIXED_LENGTH:total]
    entries = _parse_tlvs(body[address_length:])
    if isinstance(entries, ProxyError):
        return entries
    ssl_info: SslInfo | None = None
    crc_seen = False
    for offset, kind, value in entries:
        if kind == PP2_TYPE_CRC32C:
            if crc_seen or len(value) != 4:
                return ProxyError("v2 CRC32C TLV repeated or not 4 bytes")
            crc_seen = True
            at = V2_FIXED_LENGTH + address_length + offset + 3
            if _crc32c(buf[:at] + b"\0\0\0\0" + buf[at + 4:total]) != int.from_bytes(value, "big"):
                return ProxyError("v2 CRC32C checksum does not match")
        elif kind == PP2_TYPE_UNIQUE_ID and len(value) > MAX_UNIQUE_ID_LENGTH:
            return ProxyError("v2 UNIQUE_ID TLV longer than 128 bytes")
        elif kind == PP2_TYPE_SSL:
            parsed = _parse_ssl(value)
            if isinstance(parsed, ProxyError):
                return parsed
            ssl_info = parsed
    tlvs = tuple((kind, value) for _, kind, value in entries)
    header = ProxyHeader(total, 2, command, _FAMILIES[af], _TRANSPORTS[tp], tlvs=tlvs, ssl=ssl_info)
    if command == "LOCAL":  # the spec: a LOCAL header's addresses are skipped, the real endpoints are used
        return header
    if af in (1, 2):
        size = 4 if af == 1 else 16
        src, dst = str(ipaddress.ip_address(body[:size])), str(ipaddress.ip_address(body[size:2 * size]))
        sport = int.from_bytes(body[2 * size:2 * size + 2], "big")
        dport = int.from_bytes(body[2 * size + 2:2 * size + 4], "big")
        return replace(header, source=(src, sport), destination=(dst, dport))
    if af == 3:
        return replace(header, unix_source=body[:108].rstrip(b"\0"), unix_destination=body[108:216].rstrip(b"\0"))
    return header


def _parse_tlvs(data: bytes) -> list[tuple[int, int, bytes]] | ProxyError:
    """(offset, type, value) of each TLV in `data`, which they must fill exactly."""
    out: list[tuple[int, int, bytes]] = []
    at = 0
    while at < len(data):
        if len(data) - at < 3:
            return ProxyError("v2 TLV truncated")
        kind, size = data[at], int.from_bytes(data[at + 1:at + 3], "big")
        if at + 3 + size > len(data):
            return ProxyError(f"v2 TLV 0x{kind:02x} runs past the header")
        out.append((at, kind, data[at + 3:at + 3 + size]))
        at += 3 + size
    return out


def _parse_ssl(value: bytes) -> SslInfo | ProxyError:
    if len(value) < 5:
        return ProxyError("v2 SSL TLV shorter than 5 bytes")
    subs = _parse_tlvs(value[5:])
    if isinstance(subs, ProxyError):
        return ProxyError("v2 SSL sub-TLV truncated")
    names = {PP2_SUBTYPE_SSL_VERSION: "version", PP2_SUBTYPE_SSL_CN: "cn", PP2_SUBTYPE_SSL_CIPHER: "cipher",
             PP2_SUBTYPE_SSL_SIG_ALG: "sig_alg", PP2_SUBTYPE_SSL_KEY_ALG: "key_alg"}
    fields: dict[str, str] = {}
    for _, kind, sub in subs:
        if kind in names:
            try:
                fields[names[kind]] = sub.decode("utf-8" if kind == PP2_SUBTYPE_SSL_CN else "ascii")
            except UnicodeDecodeError:
                return ProxyError(f"v2 SSL sub-TLV 0x{kind:02x} is not text")
    return SslInfo(value[0], int.from_bytes(value[1:5], "big"), **fields)


def _crc32c_table() -> tuple[int, ...]:
    table = []
    for i in range(256):
        crc = i
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return tuple(table)


_CRC32C_TABLE = _crc32c_table()


def _crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for b in data:
        crc = _CRC32C_TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF
