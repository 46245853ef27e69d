"""One connection of the bridge's MQTT client over asyncio: moves bytes between a socket and a `ClientCore`, arms
its keepalive timer and hands its events to a `LinkHandler`. It holds no MQTT rule (those are the core's,
bridges/mqtt/client.py) and never reconnects: the bridge opens a new `Link` on the same core after its backoff,
and the core re-sends what was in flight.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Protocol, cast

from tidewire.bridges.mqtt.client import ClientCore, State
from tidewire.bridges.mqtt.events import (
    Acked,
    ClientError,
    ClientProtocolError,
    Connected,
    Event,
    Incoming,
    KeepaliveTimeout,
    Refused,
    ServerDisconnect,
    Subscribed,
    Unsubscribed,
)
from tidewire.gateway.core.clock import SYSTEM_CLOCK, Clock

TLS_VERSIONS = {"tlsv1.3": ssl.TLSVersion.TLSv1_3, "tlsv1.2": ssl.TLSVersion.TLSv1_2,
                "tlsv1.1": ssl.TLSVersion.TLSv1_1}


class LinkError(ClientError, ConnectionError):
    """The link could not be opened, or is no longer open."""


class ConnectRefused(LinkError):
    """The server answered CONNECT with a refusal: `code` is its 3.x return code or MQTT 5 reason code."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(f"CONNECT refused: {reason}")
        self.code = code
        self.reason = reason


class ConnectTimeout(LinkError, TimeoutError):
    """No connection, TLS handshake or CONNACK within the connect timeout."""


class LinkClosed(LinkError):
    """The connection ended (by the server, or under a call waiting for an answer)."""


class ServerDisconnected(LinkClosed):
    """The server sent an MQTT 5 DISCONNECT."""

    def __init__(self, code: int, text: str | None) -> None:
        super().__init__(f"DISCONNECT from the server: reason code 0x{code:02X}" + (f" ({text})" if text else ""))
        self.code = code


def client_tls_context(cafile: str | None = None, capath: str | None = None, certfile: str | None = None,
                       keyfile: str | None = None, insecure: bool = False, tls_version: str | None = None,
                       alpn: str | None = None) -> ssl.SSLContext:
    """A client context with Mosquitto's bridge_* semantics: the server's certificate is verified against
    `cafile`/`capath` (the system's CAs when neither is given), `insecure` turns off the host name check only,
    `certfile`/`keyfile` are our certificate for mutual TLS, `tls_version` ("tlsv1.3", "tlsv1.2", "tlsv1.1") is the
    lowest version allowed (TLS 1.2 by default, as Mosquitto), `alpn` the one protocol offered."""
    if (certfile is None) != (keyfile is None):
        raise ValueError("a client certificate needs both certfile and keyfile")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.check_hostname = not insecure
    if tls_version is not None:
        try:
            ctx.minimum_version = TLS_VERSIONS[tls_version]
        except KeyError:
            raise ValueError(f"tls_version {tls_version!r}: one of {', '.join(TLS_VERSIONS)}") from None
    else:
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if cafile is not None or capath is not None:
        ctx.load_verify_locations(cafile=cafile, capath=capath)
    else:
        ctx.load_default_certs(ssl.Purpose.SERVER_AUTH)
    if certfile is not None:
        ctx.load_cert_chain(certfile, keyfile)
    if alpn is not None:
        ctx.set_alpn_protocols([alpn])
    return ctx


class LinkHandler(Protocol):
    """What a `Link` tells its owner (the bridge). Called from the event loop, inside the link's reads."""

    def on_incoming(self, message: Incoming) -> None:
        """A PUBLISH from the server; QoS 1/2: call `Link.incoming_stored(message.packet_id)` once it is stored."""

    def on_acked(self, acked: Acked) -> None:
        """Our publishes the server took (or refused: `acked.failed`); their slots are free again."""

    def on_writable(self) -> None:
        """The transport drained: `credit()` may be above 0 again."""

    def on_closed(self, exc: BaseException | None) -> None:
        """The connection is over (called once, only for a link that was opened): None after `close()`, else why
        (LinkClosed when the server just closed it, KeepaliveTimeout, ClientProtocolError, an OSError...)."""


class Link(asyncio.Protocol):
    """One MQTT connection for a `ClientCore`: `link = Link(core, handler)`, then `await link.connect(host, port)`.
    Made in the event loop it runs in."""

    def __init__(self, core: ClientCore, handler: LinkHandler, clock: Clock = SYSTEM_CLOCK) -> None:
        self.core = core
        self.handler = handler
        self.clock = clock
        self.connected: Connected | None = None  # the CONNACK's event, once accepted
        self.transport: asyncio.Transport | None = None
        self._loop = asyncio.get_running_loop()
        self._connack: asyncio.Future[Connected] = self._loop.create_future()
        self._closed: asyncio.Future[None] = self._loop.create_future()
        self._requests: dict[int, asyncio.Future[list[int]]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._writable = True
        self._closing = False  # close() was called: the end is ours
        self._used = False  # connect() was called
        self._exc: BaseException | None = None  # why we ended the connection ourselves

    async def connect(self, host: str, port: int, *, tls: ssl.SSLContext | None = None,
                      server_hostname: str | None = None, bind_address: str | None = None,
                      connect_timeout: float = 10.0) -> Connected:
        """Connect (TCP, TLS when `tls` is given, from `bind_address` if set), send CONNECT and wait for the
        CONNACK, all within `connect_timeout` s; once per Link. Raises ConnectRefused, ConnectTimeout or LinkError
        (TLS failures included). Events that come with the CONNACK (the re-sends of a kept session) reach the
        handler before this returns: it may hold this Link already."""
        if self._used:
            raise LinkError("a Link connects once: make a new one (on the same core) to connect again")
        self._used = True
        try:
            async with asyncio.timeout(connect_timeout):
                await self._loop.create_connection(
                    lambda: self, host, port, ssl=tls,
                    server_hostname=(server_hostname or host) if tls is not None else None,
                    local_addr=(bind_address, 0) if bind_address else None)
                return await self._connack
        except TimeoutError:
            self.abort()
            raise ConnectTimeout(f"no CONNACK from {host}:{port} within {connect_timeout:g} s") from None
        except LinkError:
            self.abort()
            raise
        except OSError as exc:  # ssl.SSLError included
            self.abort()
            raise LinkError(f"cannot connect to {host}:{port}: {exc}") from exc

    # --- asyncio.Protocol --------------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self._write(self.core.connect(self.clock.monotonic()))

    def data_received(self, data: bytes) -> None:
        try:
            events = self.core.receive(data, self.clock.monotonic())
        except ClientProtocolError as exc:
            self._fail(exc)
            return
        out = self.core.data_to_send()
        if out:
            self._write(out)
        for event in events:
            try:
                self._dispatch(event)
            except Exception as exc:  # the handler's: it ends this connection, and on_closed says why
                self._fail(exc)
                return

    def eof_received(self) -> bool | None:
        return None  # close our side too: a half-closed MQTT connection is of no use

    def connection_lost(self, exc: Exception | None) -> None:
        self.core.connection_lost()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        why = self._exc or exc
        if why is None and not self._closing:
            why = LinkClosed("the server closed the connection")
        futures: list[asyncio.Future[Connected] | asyncio.Future[list[int]]] = [self._connack]
        futures += self._requests.values()
        self._requests.clear()
        for future in futures:
            if not future.done():
                future.set_exception(LinkClosed(f"the connection ended: {why}" if why else "the link was closed"))
        if not self._closed.done():
            self._closed.set_result(None)
        if self.connected is not None:
            self.handler.on_closed(why)

    def pause_writing(self) -> None:
        self._writable = False

    def resume_writing(self) -> None:
        self._writable = True
        self.handler.on_writable()

    # --- events --------------------------------------------------------------------------------------------
    def _dispatch(self, event: Event) -> None:
        kind = type(event)
        if kind is Incoming:
            self.handler.on_incoming(cast(Incoming, event))
        elif kind is Acked:
            self.handler.on_acked(cast(Acked, event))
        elif kind is Subscribed or kind is Unsubscribed:
            answer = cast(Subscribed | Unsubscribed, event)
            future = self._requests.pop(answer.packet_id, None)
            if future is not None and not future.done():
                future.set_result(answer.granted if isinstance(answer, Subscribed) else answer.reason_codes)
        elif kind is Connected:
            self.connected = cast(Connected, event)
            if not self._connack.done():
                self._connack.set_result(self.connected)
            self._arm()
        elif kind is Refused:
            refused = cast(Refused, event)
            if not self._connack.done():
                self._connack.set_exception(ConnectRefused(refused.code, refused.reason))
            self._close_transport()
        elif kind is ServerDisconnect:
            disconnect = cast(ServerDisconnect, event)
            self._exc = ServerDisconnected(disconnect.reason, disconnect.text)
            self._close_transport()

    def _fail(self, exc: BaseException) -> None:
        """End the connection for `exc` (MQTT 5: a DISCONNECT with the protocol error's reason code first)."""
        if self._exc is None:
            self._exc = exc
        if isinstance(exc, ClientProtocolError) and self.core.options.level == 5:
            self._write(self.core.disconnect(exc.reason_code))
        self._close_transport()

    # --- keepalive -------------------------------------------------------------------------------------------
    def _arm(self) -> None:
        """The timer at the core's next deadline. Sends only move that deadline later: a timer that fires early
        finds nothing due and is armed again, so no send re-arms it."""
        deadline = self.core.next_deadline()
        if deadline is None:
            self._timer = None
            return
        self._timer = self._loop.call_later(max(0.0, deadline - self.clock.monotonic()), self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        if self._is_closing():
            return
        try:
            out = self.core.tick(self.clock.monotonic())
        except KeepaliveTimeout as exc:
            self._exc = exc
            self.abort()  # no DISCONNECT: the server publishes our will, as for any dead connection
            return
        if out:
            self._write(out)
        self._arm()

    # --- calls -----------------------------------------------------------------------------------------------
    def credit(self) -> int:
        """How many QoS 1/2 publishes may go now: the core's credit, 0 while the transport's buffer is full."""
        if not self._writable or self._is_closing():
            return 0
        return self.core.credit()

    def publish(self, topic: str, payload: bytes, qos: int, retain: bool, token: object,
                properties: bytes = b"", expiry: int | None = None) -> None:
        """Send a PUBLISH (see `ClientCore.publish`: QoS 1/2 only within `credit()`); `on_acked` names `token`."""
        if self._is_closing():
            raise LinkClosed("publish on a closed link")
        self._write(self.core.publish(topic, payload, qos, retain, token, properties, expiry))

    async def subscribe(self, requests: list[tuple[str, int, bool, bool]]) -> list[int]:
        """SUBSCRIBE (filter, qos, no_local, retain_as_published) each and wait for the SUBACK: the granted QoS or
        the reason code (>= 0x80: refused) of each filter. Raises LinkClosed if the connection ends first."""
        if self._is_closing():
            raise LinkClosed("subscribe on a closed link")
        pid, data = self.core.subscribe(requests)
        future: asyncio.Future[list[int]] = self._loop.create_future()
        self._requests[pid] = future
        self._write(data)
        return await future

    async def unsubscribe(self, filters: list[str]) -> list[int]:
        """UNSUBSCRIBE and wait for the UNSUBACK: its MQTT 5 reason codes (empty for 3.x)."""
        if self._is_closing():
            raise LinkClosed("unsubscribe on a closed link")
        pid, data = self.core.unsubscribe(filters)
        future: asyncio.Future[list[int]] = self._loop.create_future()
        self._requests[pid] = future
        self._write(data)
        return await future

    def incoming_stored(self, packet_id: int) -> None:
        """An incoming QoS 1/2 publish is stored: acknowledge it (PUBACK / PUBREC). On a closed link the core
        still records it (a kept session's re-send of a stored QoS 2 is then not delivered twice)."""
        data = self.core.incoming_stored(packet_id)
        if data and not self._is_closing():
            self._write(data)

    def close(self, reason: int = 0) -> None:
        """DISCONNECT (MQTT 5: with `reason`; 0 has the server drop our will) and close; `on_closed(None)`."""
        if self._is_closing():
            return
        self._closing = True
        if self.core.state in (State.CONNECTING, State.CONNECTED):
            self._write(self.core.disconnect(reason))
        self._close_transport()

    def abort(self) -> None:
        """Drop the connection without DISCONNECT (the server then publishes our will)."""
        if self.transport is not None:
            self.transport.abort()

    async def wait_closed(self) -> None:
        await asyncio.shield(self._closed)

    @property
    def closed(self) -> bool:
        return self._closed.done()

    # --- transport -------------------------------------------------------------------------------------------
    def _write(self, data: bytes) -> None:
        transport = self.transport
        if transport is not None and data and not transport.is_closing():
            transport.write(data)
            self.core.sent(self.clock.monotonic())

    def _is_closing(self) -> bool:
        return self.transport is None or self.transport.is_closing()

    def _close_transport(self) -> None:
        if self.transport is not None:
            self.transport.close()
