"""A minimal, fast asyncio MQTT 3.1.1 client for load generation: hand-encoded packets, counters, latencies.

Only what the benchmarks need: CONNECT (optionally with user name/password, over TCP or TLS), SUBSCRIBE,
PUBLISH (QoS 0/1/2 both ways), the acks, DISCONNECT.
Every benchmark payload starts with a 20-byte header (send time from time.perf_counter_ns(), publisher id,
sequence number), so a subscriber can measure latency and spot duplicates without any per-message lookup.
"""

from __future__ import annotations

import asyncio
import ssl
import struct
import time
from dataclasses import dataclass, field
from typing import cast

PAYLOAD_HEADER = struct.Struct(">QIQ")  # send perf_counter_ns, publisher id, sequence number
HEADER_SIZE = PAYLOAD_HEADER.size
# Packet ids as bytes, built once: encoding a pid is then an index, not an allocation.
_PID_BYTES: tuple[bytes, ...] = tuple(i.to_bytes(2, "big") for i in range(65536))
DISCONNECT = b"\xe0\x00"
PINGREQ = b"\xc0\x00"
PAUSE_WINDOW = 65000  # a paced publisher never keeps more unacked packets than this (pids must stay unique)


def encode_varint(n: int) -> bytes:
    """MQTT variable byte integer (remaining length)."""
    if not 0 <= n <= 268_435_455:
        raise ValueError(f"remaining length out of range: {n}")
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | 0x80 if n else byte)
        if not n:
            return bytes(out)


def encode_str(s: str) -> bytes:
    raw = s.encode()
    return len(raw).to_bytes(2, "big") + raw


def packet(first_byte: int, body: bytes) -> bytes:
    return bytes((first_byte,)) + encode_varint(len(body)) + body


def connect_packet(client_id: str, keepalive: int = 600, clean: bool = True, username: str | None = None,
                   password: str | None = None) -> bytes:
    """MQTT 3.1.1 CONNECT; a password needs a user name (3.1.1 section 3.1.2.9)."""
    if password is not None and username is None:
        raise ValueError("a password needs a user name in MQTT 3.1.1")
    flags = (0x02 if clean else 0x00) | (0x80 if username is not None else 0) | (0x40 if password is not None else 0)
    body = encode_str("MQTT") + bytes((4, flags)) + keepalive.to_bytes(2, "big") + encode_str(client_id)
    if username is not None:
        body += encode_str(username)
    if password is not None:
        body += encode_str(password)
    return packet(0x10, body)


def subscribe_packet(pid: int, topic: str, qos: int) -> bytes:
    return packet(0x82, _PID_BYTES[pid] + encode_str(topic) + bytes((qos,)))


def publish_packet(topic: str, payload: bytes, qos: int = 0, pid: int = 0, retain: bool = False) -> bytes:
    body = encode_str(topic) + (_PID_BYTES[pid] if qos else b"") + payload
    return packet(0x30 | (qos << 1) | retain, body)


def packet_at(buf: bytes, i: int) -> tuple[int, int, int] | None:
    """(first byte, body start, body end) of the packet at i, or None if it is not complete yet."""
    j, rl, shift = i + 1, 0, 0
    while True:
        if j >= len(buf) or shift > 21:
            return None
        b = buf[j]
        j += 1
        rl |= (b & 0x7F) << shift
        if b < 0x80:
            break
        shift += 7
    return (buf[i], j, j + rl) if j + rl <= len(buf) else None


@dataclass(slots=True)
class Counters:
    """Shared by every connection of one run; plain ints because the loop is single-threaded."""

    received: int = 0
    dup: int = 0
    sent: int = 0
    acked: int = 0
    max_samples: int = 2_000_000
    latencies_ns: list[int] = field(default_factory=list)

    def reset(self) -> None:
        self.received = self.dup = self.sent = self.acked = 0
        self.latencies_ns = []


class Publisher:
    """Builds batches of PUBLISH packets for one topic and tracks its unacked window."""

    __slots__ = ("_head", "_pad", "_pid", "counters", "inflight", "pub_id", "qos", "seq", "topic", "window")

    def __init__(self, counters: Counters, topic: str, qos: int, pub_id: int, payload_size: int,
                 window: int = PAUSE_WINDOW) -> None:
        self.counters = counters
        self.topic = topic
        self.qos = qos
        self.pub_id = pub_id
        self.window = min(window, PAUSE_WINDOW)
        self.seq = 0
        self.inflight = 0
        self._pid = 0
        self._pad = b"x" * max(0, payload_size - HEADER_SIZE)
        # Everything before the payload is the same for every message, so encode it once.
        payload_len = HEADER_SIZE + len(self._pad)
        body_len = 2 + len(topic.encode()) + (2 if qos else 0) + payload_len
        self._head = bytes((0x30 | (qos << 1),)) + encode_varint(body_len) + encode_str(topic)

    def room(self) -> int:
        return self.window - self.inflight if self.qos else 1 << 30

    def batch(self, n: int) -> bytes:
        """n PUBLISH packets in one bytes object, stamped with the current time."""
        ts = time.perf_counter_ns()
        pack, head, pad, pub_id, seq = PAYLOAD_HEADER.pack, self._head, self._pad, self.pub_id, self.seq
        parts: list[bytes] = []
        if self.qos == 0:
            for _ in range(n):
                seq += 1
                parts += (head, pack(ts, pub_id, seq), pad)
        else:
            pid, pids = self._pid, _PID_BYTES
            for _ in range(n):
                seq += 1
                pid = pid % 65535 + 1
                parts += (head, pids[pid], pack(ts, pub_id, seq), pad)
            self._pid = pid
            self.inflight += n
        self.seq = seq
        self.counters.sent += n
        return b"".join(parts)


class MqttConn(asyncio.Protocol):
    """One client connection. Parses everything received in a chunk in one pass and answers in one write."""

    __slots__ = ("_buf", "_next_pid", "_seqs", "_subacks", "closed", "connack", "counters", "publisher",
                 "refill", "transport")

    def __init__(self, counters: Counters) -> None:
        loop = asyncio.get_running_loop()
        self.counters = counters
        self.transport: asyncio.Transport | None = None
        self.connack: asyncio.Future[int] = loop.create_future()
        self.closed: asyncio.Future[None] = loop.create_future()
        self.publisher: Publisher | None = None
        self.refill = False  # True: every ack immediately buys a new publish (window mode)
        self._buf = b""
        self._next_pid = 0
        self._subacks: dict[int, asyncio.Future[int]] = {}
        self._seqs: dict[int, int] = {}

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        err = exc or ConnectionError("connection closed")
        if not self.connack.done():
            self.connack.set_exception(err)
        for fut in self._subacks.values():
            if not fut.done():
                fut.set_exception(err)
        if not self.closed.done():
            self.closed.set_result(None)
        # Nobody may await these; mark retrieved so asyncio does not log "exception never retrieved".
        if self.connack.done() and not self.connack.cancelled():
            self.connack.exception()
        for fut in self._subacks.values():
            if fut.done() and not fut.cancelled():
                fut.exception()

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def subscribe(self, topic: str, qos: int) -> asyncio.Future[int]:
        """Send SUBSCRIBE; the future resolves to the granted QoS (0x80 = refused)."""
        self._next_pid = self._next_pid % 65535 + 1
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._subacks[self._next_pid] = fut
        self.write(subscribe_packet(self._next_pid, topic, qos))
        return fut

    def send(self, n: int) -> int:
        """Publish up to n messages (bounded by the window); returns how many were sent."""
        pub = self.publisher
        if pub is None:
            return 0
        n = min(n, pub.room())
        if n > 0:
            self.write(pub.batch(n))
        return max(n, 0)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        # One flat loop on purpose: this is the hot path, a call per packet would cost more than the parse.
        if self._buf:
            data = self._buf + data
            self._buf = b""
        now = time.perf_counter_ns()
        counters = self.counters
        lat = counters.latencies_ns
        room = counters.max_samples - len(lat)
        seqs = self._seqs
        unpack = PAYLOAD_HEADER.unpack_from
        out: list[bytes] = []
        acked = 0
        n = len(data)
        i = 0
        while i < n:
            # Fixed header: first byte + variable-length remaining length.
            j = i + 1
            rl = 0
            shift = 0
            while True:
                if j >= n:
                    self._buf = data[i:]
                    i = n
                    break
                b = data[j]
                j += 1
                rl |= (b & 0x7F) << shift
                if b < 0x80:
                    break
                shift += 7
            if i == n:
                break
            end = j + rl
            if end > n:
                self._buf = data[i:]
                break
            first = data[i]
            kind = first >> 4
            if kind == 3:  # PUBLISH
                p = j + 2 + ((data[j] << 8) | data[j + 1])
                qos = (first >> 1) & 3
                if qos:
                    pid = data[p:p + 2]
                    out.append((b"\x40\x02" if qos == 1 else b"\x50\x02") + pid)
                    p += 2
                counters.received += 1
                if end - p >= HEADER_SIZE:
                    ts, pub, seq = unpack(data, p)
                    if room > 0:
                        lat.append(now - ts)
                        room -= 1
                    if seq <= seqs.get(pub, 0):
                        counters.dup += 1
                    else:
                        seqs[pub] = seq
            elif kind == 4 or kind == 7:  # PUBACK, PUBCOMP
                acked += 1
            elif kind == 5:  # PUBREC -> PUBREL
                out.append(b"\x62\x02" + data[j:j + 2])
            elif kind == 6:  # PUBREL -> PUBCOMP
                out.append(b"\x70\x02" + data[j:j + 2])
            elif kind == 2:  # CONNACK
                if not self.connack.done():
                    self.connack.set_result(data[j + 1])
            elif kind == 9:  # SUBACK
                fut = self._subacks.pop((data[j] << 8) | data[j + 1], None)
                if fut is not None and not fut.done():
                    fut.set_result(data[j + 2])
            i = end
        if acked:
            counters.acked += acked
            pub_ = self.publisher
            if pub_ is not None:
                pub_.inflight -= acked
                if self.refill:
                    # Refill once an eighth of the window is free: fewer, larger writes keep the load
                    # generator cheaper than the server while the window stays nearly full.
                    k = pub_.room()
                    if k > 0 and k * 8 >= pub_.window:
                        out.append(pub_.batch(k))
        if out and self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"".join(out))


class ConnackRefused(ConnectionError):
    """The server answered CONNECT with a non-zero return code (e.g. 4 bad user name or password, 5 not
    authorized, 3 server unavailable). Carries the code, never the credentials."""

    def __init__(self, client_id: str, code: int) -> None:
        super().__init__(f"CONNACK refused for {client_id}: return code {code}")
        self.code = code


async def connect(host: str, port: int, client_id: str, counters: Counters, *, keepalive: int = 600,
                  timeout: float = 10.0, ssl_context: ssl.SSLContext | None = None,
                  server_hostname: str | None = None, username: str | None = None,
                  password: str | None = None) -> MqttConn:
    """Open a TCP (or, given ssl_context, TLS) connection, send CONNECT and wait for a successful CONNACK.

    `timeout` bounds the TCP + TLS handshake and, separately, the wait for CONNACK.
    """
    loop = asyncio.get_running_loop()
    if ssl_context is None:
        opening = loop.create_connection(lambda: MqttConn(counters), host, port)
    else:
        opening = loop.create_connection(lambda: MqttConn(counters), host, port, ssl=ssl_context,
                                         server_hostname=server_hostname or host, ssl_handshake_timeout=timeout)
    _, conn = await asyncio.wait_for(opening, timeout)
    conn.write(connect_packet(client_id, keepalive, username=username, password=password))
    try:
        rc = await asyncio.wait_for(asyncio.shield(conn.connack), timeout)
    except BaseException:
        conn.close()
        raise
    if rc != 0:
        conn.close()
        raise ConnackRefused(client_id, rc)
    return conn


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where and how the clients of one run connect: address, TLS context, and the user names they cycle
    through (all with one password). Built once per run so every connection shares one SSLContext."""

    host: str
    port: int
    ssl_context: ssl.SSLContext | None = None
    server_hostname: str | None = None
    users: tuple[str, ...] = ()
    password: str | None = field(default=None, repr=False)

    async def connect(self, client_id: str, counters: Counters, *, index: int = 0, keepalive: int = 600,
                      timeout: float = 10.0) -> MqttConn:
        """Connection number `index` logs in as users[index % len(users)] (anonymous when there are none)."""
        user = self.users[index % len(self.users)] if self.users else None
        return await connect(self.host, self.port, client_id, counters, keepalive=keepalive, timeout=timeout,
                             ssl_context=self.ssl_context, server_hostname=self.server_hostname, username=user,
                             password=self.password if user is not None else None)


async def disconnect(conn: MqttConn, timeout: float = 1.0) -> bool:
    """Send DISCONNECT and let the server close first, so TIME_WAIT lands on the server side.
    Returns False when the server had not closed within `timeout` (then we close)."""
    conn.write(DISCONNECT)
    try:
        await asyncio.wait_for(asyncio.shield(conn.closed), timeout)
    except TimeoutError:
        return False
    finally:
        conn.close()
    return True
