"""Listeners and admission, for every protocol: MQTT over TCP, TLS, WebSocket and secure WebSocket, and AMQP
over TCP and TLS, each with its own limits, PROXY protocol and the deadlines of its connections; the TLS context
and the identity a client certificate proves; whether a new connection may proceed.

A new connection is refused cleanly (MQTT: a CONNACK with a reason; AMQP: Connection.Close; never a reset) when
its listener is full, the listener's connect rate is exceeded, too many connects are already waiting for
authentication, the event loop is overloaded, or the node is stopping; clients already connected are served as
before. `Admission.refusal` says which, in neutral terms; each protocol answers it with its own code.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import ssl
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from cryptography import x509
from cryptography.x509.oid import NameOID

from tidewire.extensions.authn import AuthChain, AuthRequest, Identity, Refused
from tidewire.gateway.config import ListenerName, Settings
from tidewire.gateway.core.clock import SYSTEM_CLOCK, Clock
from tidewire.gateway.transport.accept_loop import AcceptLoop, ProtocolFactory
from tidewire.gateway.transport.ratelimit import TokenBucket

log = logging.getLogger("tidewire.listener")

CertUsername = Literal["cn", "subject"] | None
DEADLINE_TICK_S = 0.1  # deadlines are kept to this grain: one may fire up to this late
_TIMER_SLACK_S = 0.002  # loop timers have 1 ms grain and may wake this much early: counted as on time


class Timed(Protocol):
    def deadline_due(self, now: float) -> None:
        """Its deadline passed (`now`: the deadlines' clock's monotonic time): act, or file itself again."""


Bucket = set[Timed]


class Deadlines:
    """The deadlines of many connections (CONNECT timeout, keepalive, close drain) on one timer instead of one
    each: a uvloop timer costs a connection ~0.5 KB and two loop calls. A connection sits in the bucket of the
    tick its deadline falls in; the timer wakes for the earliest tick and tells each connection of that bucket,
    which checks its own condition (its keepalive deadline may have moved since) and files itself again if it
    must. Times are `clock.monotonic()` (the node's clock)."""

    __slots__ = ("_armed", "_buckets", "_clock", "_handle", "_ticks")

    def __init__(self, clock: Clock = SYSTEM_CLOCK) -> None:
        self._clock = clock
        self._buckets: dict[int, Bucket] = {}
        self._ticks: list[int] = []  # heap: the tick of every bucket
        self._handle: asyncio.TimerHandle | None = None
        self._armed = 0  # the tick the timer is set for

    def __len__(self) -> int:
        return sum(map(len, self._buckets.values()))

    def file(self, item: Timed, when: float) -> Bucket:
        """Tell `item` at `when` (or up to one tick later); returns its bucket, for `Bucket.discard(item)`."""
        tick = -int(-when // DEADLINE_TICK_S)  # rounded up: never early
        bucket = self._buckets.get(tick)
        if bucket is None:
            bucket = self._buckets[tick] = set()
            heapq.heappush(self._ticks, tick)
            if self._handle is None or tick < self._armed:
                self._arm(tick)
        bucket.add(item)
        return bucket

    def _arm(self, tick: int) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._armed = tick
        delay = tick * DEADLINE_TICK_S - self._clock.monotonic()
        self._handle = asyncio.get_running_loop().call_later(delay if delay > 0 else 0, self._fire)

    def _fire(self) -> None:
        self._handle = None
        now = self._clock.monotonic() + _TIMER_SLACK_S
        ticks, buckets = self._ticks, self._buckets
        while ticks and ticks[0] * DEADLINE_TICK_S <= now:
            bucket = buckets.pop(heapq.heappop(ticks), None)
            while bucket:  # popped one by one: a connection closed by another's deadline leaves the bucket
                try:
                    bucket.pop().deadline_due(now)
                except Exception:  # one connection's bug must not stop the deadlines of all others
                    log.exception("deadline.failed")
        if ticks:
            self._arm(ticks[0])


@dataclass(slots=True, eq=False)
class Listener:
    name: ListenerName
    max_connections: int
    rate: TokenBucket | None
    proxy_protocol: bool
    cert_username: CertUsername = None  # the certificate names the client (Mosquitto's use_*_as_username)
    connections: int = 0  # connected MQTT clients accepted here
    port: int = 0  # bound port (useful when configured as 0)
    deadlines: Deadlines = field(default_factory=Deadlines, repr=False)  # of its connections

    @property
    def tls(self) -> bool:
        return self.name in ("mqtts", "wss")

    @property
    def websocket(self) -> bool:
        return self.name in ("ws", "wss")


def make_listener(settings: Settings, name: ListenerName, clock: Clock) -> Listener:
    """One listener with the node's limits and its own overrides (`listeners.<name>`); its connect rate and its
    connections' deadlines read `clock`."""
    opts = settings.listeners.get(name)
    max_connections = settings.max_connections
    rate, burst, proxy = settings.max_connection_rate, settings.connection_rate_burst, settings.proxy_protocol
    if opts is not None:
        max_connections = opts.max_connections or max_connections
        rate = opts.max_connection_rate if opts.max_connection_rate is not None else rate
        burst = opts.connection_rate_burst or burst
        proxy = opts.proxy_protocol if opts.proxy_protocol is not None else proxy
    cert_username: CertUsername = None
    if name in ("mqtts", "wss"):
        cert_username = "cn" if settings.use_identity_as_username else (
            "subject" if settings.use_subject_as_username else None)
    return Listener(name, max_connections, TokenBucket(rate, burst, clock.monotonic()) if rate else None, proxy,
                    cert_username, deadlines=Deadlines(clock))


def make_listeners(settings: Settings, clock: Clock) -> list[tuple[Listener, int]]:
    """The configured MQTT listeners with their ports."""
    ports: list[tuple[ListenerName, int | None]] = [("mqtt", settings.port), ("mqtts", settings.tls_port),
                                                    ("ws", settings.ws_port), ("wss", settings.wss_port)]
    return [(make_listener(settings, name, clock), port) for name, port in ports if port is not None]


class Server(Protocol):
    """An open listener: asyncio's `Server` or an `AcceptLoop`."""

    @property
    def sockets(self) -> Any: ...

    def close(self) -> None: ...


async def open_listener(listener: Listener, port: int, factory: ProtocolFactory, settings: Settings,
                        tls: ssl.SSLContext | None) -> Server:
    """Listen on `port` for `listener` (any protocol); `factory(peer)` makes each connection's protocol, `peer`
    being the client's address from a PROXY header (else None). Sets `listener.port` to the bound port."""
    if listener.proxy_protocol or tls is not None:
        # Our own accept loop: it reads PROXY headers, and it sees (and logs) failed TLS handshakes.
        accepting = AcceptLoop(factory, settings.host, port, ssl=tls, name=listener.name,
                               header_timeout=settings.proxy_protocol_timeout,
                               ssl_handshake_timeout=settings.connect_timeout,
                               trusted=settings.proxy_protocol_trusted, proxy_protocol=listener.proxy_protocol)
        await accepting.start()
        listener.port = accepting.sockets[0].getsockname()[1]
        return accepting
    server = await asyncio.get_running_loop().create_server(lambda: factory(None), settings.host, port,
                                                            backlog=4096, reuse_address=True)
    listener.port = server.sockets[0].getsockname()[1] if server.sockets else port
    return server


AdmissionKind = Literal["stopping", "busy", "rate"]


@dataclass(frozen=True, slots=True)
class AdmissionRefusal:
    """Why a new connection is turned away: the node is `stopping` (go to another node), `busy` (full,
    overloaded, too many in authentication) or over its connect `rate`; `detail` for the log and the client."""

    kind: AdmissionKind
    detail: str


class Admission:
    """Node-wide admission state shared by the listeners."""

    __slots__ = ("_sourceless", "draining", "lag_ms", "max_lag_ms", "max_pending", "pending")

    def __init__(self, settings: Settings) -> None:
        self.draining = False  # the node is stopping: /readyz answers 503 and new CONNECTs are refused
        self.pending = 0  # CONNECTs being authenticated right now
        self.max_pending = settings.max_pending_connects
        self.max_lag_ms = settings.overload_loop_lag_ms
        self.lag_ms = 0.0
        self._sourceless: dict[tuple[AuthChain, bool], Identity | Refused] = {}

    def sourceless(self, chain: AuthChain, credentials: bool) -> Identity | Refused | None:
        """The answer of an authentication chain with no source, which by its rules depends only on whether the
        client presented credentials (and on `allow_anonymous`): asked once per kind, without a task. None if
        the chain would wait after all (then ask it in a task)."""
        key = (chain, credentials)
        answer = self._sourceless.get(key)
        if answer is None:
            decided = chain.authenticate(AuthRequest("", "" if credentials else None, None))
            try:
                decided.send(None)
            except StopIteration as done:
                answer = self._sourceless[key] = done.value
            else:
                decided.close()
        return answer

    @property
    def overloaded(self) -> bool:
        return bool(self.max_lag_ms) and self.lag_ms > self.max_lag_ms

    def refusal(self, listener: Listener, now: float, reconnecting: bool) -> AdmissionRefusal | None:
        """Why a new connection on `listener` must be refused, or None (then it takes a rate token)."""
        if self.draining:  # a client that got in before the listener closed: let it go to another node now
            return AdmissionRefusal("stopping", "the node is stopping")
        if self.overloaded:
            return AdmissionRefusal("busy", f"overloaded (event loop lag {self.lag_ms:.0f} ms)")
        if self.pending >= self.max_pending:
            return AdmissionRefusal("busy", "too many connects in authentication")
        if listener.connections >= listener.max_connections and not reconnecting:
            return AdmissionRefusal("busy", f"max connections on listener {listener.name}")
        if listener.rate is not None and not listener.rate.take(now):
            return AdmissionRefusal("rate", f"connect rate on listener {listener.name}")
        return None

    async def watch_loop_lag(self, interval: float = 0.1) -> None:
        """Sample how late the event loop wakes us: the clearest sign that new work would hurt current work."""
        loop = asyncio.get_running_loop()
        while True:
            start = loop.time()  # the loop's own clock, not the node's: what is measured is how late its timer fired
            await asyncio.sleep(interval)
            sample = (loop.time() - start - interval) * 1000
            # Smoothed: one slow tick (a GC pause, a big batch) is not overload; lag that lasts is.
            self.lag_ms = self.lag_ms * 0.5 + sample * 0.5


# --- TLS --------------------------------------------------------------------------------------------------

def tls_context(settings: Settings) -> ssl.SSLContext:
    """Server context: TLS 1.2+ only, certificate and key from files, client certificates per Mosquitto's
    `cafile`/`require_certificate`."""
    if settings.certfile is None or settings.keyfile is None:
        raise ValueError("a TLS listener needs certfile and keyfile")
    wants_cert = settings.require_certificate or settings.use_identity_as_username or settings.use_subject_as_username
    if wants_cert and settings.cafile is None:
        raise ValueError("require_certificate and use_*_as_username need cafile")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3 if settings.tls_min_version == "1.3" else ssl.TLSVersion.TLSv1_2
    ctx.options |= ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE
    if settings.tls_ciphers:
        ctx.set_ciphers(settings.tls_ciphers)
    ctx.load_cert_chain(settings.certfile, settings.keyfile)
    if settings.cafile is not None:
        ctx.load_verify_locations(settings.cafile)
        ctx.verify_mode = ssl.CERT_REQUIRED if settings.require_certificate else ssl.CERT_OPTIONAL
    return ctx


def reload_certificate(ctx: ssl.SSLContext, settings: Settings) -> None:
    """Load the certificate and key again into the live context: new handshakes use them, established
    connections keep theirs."""
    if settings.certfile is not None and settings.keyfile is not None:
        ctx.load_cert_chain(settings.certfile, settings.keyfile)


_RFC4514_NAMES = {NameOID.EMAIL_ADDRESS: "emailAddress"}  # as OpenSSL prints it (Mosquitto's subject)


def certificate_name(transport: asyncio.BaseTransport, kind: CertUsername) -> str | None:
    """The verified client certificate's CN or RFC 4514 subject, or None when there is no certificate."""
    ssl_object: Any = transport.get_extra_info("ssl_object")
    if ssl_object is None or kind is None:
        return None
    der = ssl_object.getpeercert(binary_form=True)
    if not der:
        return None
    with contextlib.suppress(ValueError):
        subject = x509.load_der_x509_certificate(der).subject
        if kind == "subject":
            return subject.rfc4514_string(_RFC4514_NAMES)
        names = subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        if names:
            value = names[0].value
            return value if isinstance(value, str) else value.decode("utf-8", "replace")
    return None
