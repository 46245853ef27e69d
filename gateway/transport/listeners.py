"""Listeners, for every protocol: MQTT over TCP, TLS, WebSocket and secure WebSocket, AMQP over TCP and TLS, and
the RocketMQ port's limits; each with its own connection limit, connect rate, PROXY protocol and the deadlines of
its connections (`deadlines.py`). Admission is `admission.py`; the TLS context, `tls.py`.
"""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass, field
from typing import Any, Protocol

from tidewire.gateway.config import ListenerName, Settings
from tidewire.gateway.core.clock import Clock
from tidewire.gateway.transport.accept_loop import AcceptLoop, ProtocolFactory
from tidewire.gateway.transport.deadlines import Deadlines
from tidewire.gateway.transport.ratelimit import TokenBucket
from tidewire.gateway.transport.tls import CertUsername


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
