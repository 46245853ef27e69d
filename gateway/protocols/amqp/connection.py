"""The asyncio Protocol of one AMQP connection: socket ↔ `ConnectionCore`, and a worker that runs its commands.

Events from the core are handled one at a time, in arrival order, by one task per connection (a publish must
be appended before the next one, an ack after the delivery it settles). Writes are coalesced: the core asks
for a flush once per batch of output. Reading pauses while the node holds the connection's publishes back
(Connection.Blocked is sent to clients that understand it) and while too many commands wait for the worker.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import TYPE_CHECKING, Any, cast

from tidewire.extensions.authentication import AuthRequest, Refused
from tidewire.extensions.hooks import ClientInfo
from tidewire.gateway.core.tenants import Tenant, TenantConflict, vhost_mount, vhosts_allowed
from tidewire.gateway.protocols.amqp.channel import Channel
from tidewire.gateway.protocols.amqp.codec import CONNECTION_FORCED, INTERNAL_ERROR, NOT_ALLOWED, Fault
from tidewire.gateway.protocols.amqp.core import ConnectionCore
from tidewire.gateway.protocols.amqp.events import (
    Authenticate,
    ChannelClosed,
    ChannelCloseRequested,
    ChannelOpened,
    CloseRequested,
    Command,
    Event,
    Opened,
)
from tidewire.gateway.transport.listeners import Listener
from tidewire.gateway.transport.tls import certificate_name

if TYPE_CHECKING:
    from tidewire.gateway.protocols.amqp.server import AmqpServer

log = logging.getLogger("tidewire.amqp")

MAX_BACKLOG = 1024  # events waiting for the worker before reading pauses
TICK_S = 1.0  # heartbeat / handshake checks (a quarter of the heartbeat when that is shorter)
REFUSED_TEXT = "Login was refused using authentication mechanism PLAIN. For details see the broker logfile."
# How AMQP answers an admission refusal (gateway.transport.admission.AdmissionRefusal), decided at Start-Ok and
# sent at Connection.Open: RabbitMQ's codes for a node that is shutting down and for a connection limit.
ADMISSION_CODES = {"stopping": CONNECTION_FORCED, "unavailable": CONNECTION_FORCED, "busy": NOT_ALLOWED,
                   "rate": NOT_ALLOWED}


class AmqpConnection(asyncio.Protocol):
    def __init__(self, server: AmqpServer, listener: Listener, peer: tuple[str, int] | None = None) -> None:
        self.server = server
        self.node = server.node
        self.clock = server.node.clock  # deadlines, heartbeats, credentials' expiry
        self.listener = listener  # "amqp" or "amqps"
        self.id = server.new_connection_id()
        self.info = ClientInfo(self.id, None)
        self.channels: dict[int, Channel] = {}
        self.exclusive: set[str] = set()  # group names of the exclusive queues it declared
        self.writable = True
        self.peer = f"{peer[0]}:{peer[1]}" if peer is not None else ""  # the real client behind a PROXY header
        self.counted = False  # logged in: counted in its listener's connections
        self.mount = ""  # the mount point of the vhost it opened (a tenant's: `gateway.core.tenants`)
        self.tenant: Tenant | None = None  # its user's tenant: counted in its connections while `counted`
        self.core: ConnectionCore = server.new_core(self._want_flush)
        self.transport: asyncio.Transport | None = None
        self.expires_at: float | None = None  # a token's expiry: the connection is closed then
        self._cert: tuple[str | None, str | None] = (None, None)
        self._events: deque[Event] = deque()
        self._wakeup = asyncio.Event()
        self._worker: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._flush_due = False
        self._blockers: set[Channel] = set()
        self._paused: set[str] = set()  # why reading is paused: "blocked", "backlog"
        self._deadline = 0.0  # handshake, then closing handshake: the transport is aborted after it
        self.closed = asyncio.get_running_loop().create_future()

    # --- transport -----------------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's
        self.transport = transport
        if not self.peer:
            peer = transport.get_extra_info("peername")
            self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else str(peer or "")
        self.info = ClientInfo(self.id, None, self.peer)
        # a verified client certificate (amqps with cafile), for the authentication sources that use it
        self._cert = (certificate_name(transport, "subject"), certificate_name(transport, "cn"))
        self.server.track(self)
        self._deadline = self.clock.monotonic() + self.node.settings.connect_timeout
        self._worker = asyncio.get_running_loop().create_task(self._work())
        self._schedule_tick()

    def data_received(self, data: bytes) -> None:
        was_open = self.core.open
        now = self.clock.monotonic()
        events = self.core.receive(data, now)
        if was_open and not self.core.open:
            self._deadline = now + self.node.settings.close_drain_timeout  # a closing handshake has begun
        if events:
            self._events.extend(events)
            self._wakeup.set()
            if len(self._events) > MAX_BACKLOG:
                self._pause("backlog")
        if self.core.closed:
            self._flush()

    def eof_received(self) -> bool | None:
        return None  # close our side too

    def pause_writing(self) -> None:
        self.writable = False

    def resume_writing(self) -> None:
        self.writable = True
        for channel in self.channels.values():
            channel.deliveries.wake_all()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._worker is not None:
            self._worker.cancel()
        self.server.forget(self)
        self.server.spawn(self._cleanup())
        reason = self.core.close_reason
        log.info("amqp.closed", extra={"conn": self.id, "peer": self.peer, "user": self.info.username,
                                       "reason": f"{reason.code} {reason.text}" if reason else "connection lost"})

    async def _cleanup(self) -> None:
        try:
            channels = list(self.channels.values())
            self.channels.clear()
            for channel in channels:
                await channel.close()
            await self.server.queues.forget_owner(self.id, self.exclusive)
        finally:
            if not self.closed.done():
                self.closed.set_result(None)

    def _want_flush(self) -> None:
        if not self._flush_due:
            self._flush_due = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_due = False
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        data = self.core.data_to_send()
        if data:
            transport.write(data)
            self.core.sent(self.clock.monotonic())
        if self.core.closed:
            transport.close()

    # --- timers --------------------------------------------------------------------------------------------
    def _schedule_tick(self) -> None:
        beat = self.core.heartbeat
        interval = min(TICK_S, beat / 4) if beat else TICK_S
        self._timer = asyncio.get_running_loop().call_later(interval, self._tick)

    def _tick(self) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        now = self.clock.monotonic()
        core = self.core
        if not core.open and now > self._deadline:
            log.info("amqp.timeout", extra={"conn": self.id, "peer": self.peer, "state": core.state.name})
            transport.abort()  # a handshake, or a closing handshake, that never finished
            return
        if self._paused:
            core.touch(now)  # while we do not read, the client's silence is ours
        if not core.tick(now):
            log.info("amqp.heartbeat_timeout", extra={"conn": self.id, "peer": self.peer})
            transport.abort()
            return
        if self.expires_at is not None and self.clock.time() >= self.expires_at:
            self.shutdown(Fault(CONNECTION_FORCED, "credentials expired"))
        self._consumer_timeouts(now)
        self._schedule_tick()

    def _consumer_timeouts(self, now: float) -> None:
        """A channel with a delivery unacked past its consumer timeout is closed with 406 (the worker requeues
        what it held, as for any closed channel)."""
        for number, channel in list(self.channels.items()):
            overdue = channel.deliveries.overdue(now)
            if overdue is not None and self.core.channel_open(number):
                log.info("amqp.consumer_timeout", extra={"conn": self.id, "channel": number, "detail": overdue.text})
                self.core.close_channel(number, overdue)
                self._events.append(ChannelClosed(number))
                self._wakeup.set()
                self._flush()

    # --- flow control --------------------------------------------------------------------------------------
    def _pause(self, why: str) -> None:
        if not self._paused and self.transport is not None:
            self.transport.pause_reading()
        self._paused.add(why)

    def _resume(self, why: str) -> None:
        if why not in self._paused:
            return
        self._paused.discard(why)
        if not self._paused and self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()
            self.core.touch(self.clock.monotonic())

    def block(self, channel: Channel) -> None:
        """The node's append queue is full: stop reading publishes (Connection.Blocked)."""
        if not self._blockers:
            self.core.block("low on resources")
            self._pause("blocked")
        self._blockers.add(channel)

    def unblock(self, channel: Channel) -> None:
        if channel in self._blockers:
            self._blockers.discard(channel)
            if not self._blockers:
                self.core.unblock()
                self._resume("blocked")

    def spawn(self, coro: Any) -> None:
        self.server.spawn(coro)

    def shutdown(self, reason: Fault) -> None:
        """Connection.Close from the server (node stopping, credentials expired)."""
        self.core.close_connection(reason)
        self._deadline = self.clock.monotonic() + self.node.settings.close_drain_timeout
        self._flush()

    # --- the worker ----------------------------------------------------------------------------------------
    async def _work(self) -> None:
        events = self._events
        while True:
            while not events:
                self._wakeup.clear()
                await self._wakeup.wait()
            event = events.popleft()
            try:
                await self._handle(event)
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug must cost this connection, never the node
                log.exception("amqp.internal_error", extra={"conn": self.id})
                await self._fail(None, Fault(INTERNAL_ERROR, "internal error"))
            if len(events) < MAX_BACKLOG // 2:
                self._resume("backlog")

    async def _handle(self, event: Event) -> None:
        core = self.core
        if isinstance(event, Command):
            channel = self.channels.get(event.channel)
            if channel is None or not core.channel_open(event.channel):
                return  # the channel was closed after this command arrived: ignored, as the spec says
            problem = await channel.handle(event.method, event.properties, event.body)
            if problem is not None:
                await self._fail(channel, problem)
        elif isinstance(event, ChannelOpened):
            self.channels[event.channel] = Channel(self, event.channel)
        elif isinstance(event, ChannelCloseRequested):
            closing = self.channels.pop(event.channel, None)
            if closing is not None:
                await closing.close()
            core.channel_close_ok(event.channel)
        elif isinstance(event, ChannelClosed):
            closing = self.channels.pop(event.channel, None)
            if closing is not None:
                await closing.close()
        elif isinstance(event, Authenticate):
            await self._authenticate(event)
        elif isinstance(event, Opened):
            self.mount = vhost_mount(event.vhost)
            log.info("amqp.connected", extra={"conn": self.id, "peer": self.peer, "user": self.info.username,
                                              "listener": self.listener.name, "heartbeat": core.heartbeat,
                                              "frame_max": core.frame_max})
            self._schedule_tick_soon()
        elif isinstance(event, CloseRequested):
            await self._close_channels()
            core.close_ok()

    def _schedule_tick_soon(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._schedule_tick()  # the negotiated heartbeat may want shorter ticks

    async def _authenticate(self, event: Authenticate) -> None:
        admission = self.node.admission
        refused = admission.refusal(self.listener, self.clock.monotonic(), False)  # before any authentication work
        if refused is not None:
            log.info("amqp.refused", extra={"conn": self.id, "peer": self.peer, "detail": refused.detail})
            self.core.refuse_open(ADMISSION_CODES[refused.kind], f"connection refused: {refused.detail}")
            return
        request = AuthRequest(client_id=self.id, username=event.username, password=event.password, peer=self.peer,
                              protocol="amqp", listener=self.listener.name, cert_subject=self._cert[0],
                              cert_common_name=self._cert[1])
        admission.pending += 1
        try:
            result = await self.node.auth.authenticate(request)
        finally:
            admission.pending -= 1
        if isinstance(result, Refused):
            log.info("amqp.auth_refused", extra={"conn": self.id, "peer": self.peer, "username": event.username,
                                                 "source": result.source, "reason": result.reason})
            self.core.auth_refused(REFUSED_TEXT)
            self._deadline = self.clock.monotonic() + self.node.settings.close_drain_timeout
            return
        if self.node.bans.check(None, result.username, self.peer) is not None:  # its user name or address
            self.node.bans.banned_refused += 1
            log.info("amqp.banned", extra={"conn": self.id, "peer": self.peer})
            self.core.auth_refused(REFUSED_TEXT)
            self._deadline = self.clock.monotonic() + self.node.settings.close_drain_timeout
            return
        tenants = self.node.tenants
        superuser = result.superuser or (result.username is not None and result.username in tenants.superusers)
        try:
            tenant = tenants.tenant_for(self.listener.name, result.tenant, result.username)
        except TenantConflict as exc:
            log.info("amqp.auth_refused", extra={"conn": self.id, "peer": self.peer, "username": event.username,
                                                 "source": result.source, "reason": str(exc)})
            self.core.auth_refused(REFUSED_TEXT)
            self._deadline = self.clock.monotonic() + self.node.settings.close_drain_timeout
            return
        if tenant is not None:
            over = tenant.admit_connection(self.clock.monotonic())
            if over is not None:  # as RabbitMQ's vhost connection limit: Connection.Open is refused
                log.info("amqp.refused", extra={"conn": self.id, "peer": self.peer,
                                                "detail": f"tenant {tenant.name}: connection {over}"})
                self.core.refuse_open(NOT_ALLOWED, f"connection refused: tenant {tenant.name} connection {over}")
                return
            tenant.connections += 1
            self.tenant = tenant
        self.core.vhost_allowed = vhosts_allowed(tenant.name if tenant is not None else None, superuser,
                                                 self.core.limits.vhosts)
        self.info = ClientInfo(self.id, result.username, self.peer, superuser=superuser and tenant is None,
                               acl=result.acl, tenant=tenant.name if tenant is not None else None)
        self.expires_at = result.expires_at
        self.listener.connections += 1
        self.counted = True
        self.core.auth_accepted()

    async def _fail(self, channel: Channel | None, problem: Fault) -> None:
        log.info("amqp.error", extra={"conn": self.id, "channel": channel.number if channel else 0,
                                      "code": problem.code, "detail": problem.text})
        if channel is not None and not problem.hard:
            self.core.close_channel(channel.number, problem)
            self.channels.pop(channel.number, None)
            await channel.close()
            return
        self.core.close_connection(problem)
        self._deadline = self.clock.monotonic() + self.node.settings.close_drain_timeout
        await self._close_channels()

    async def _close_channels(self) -> None:
        channels = list(self.channels.values())
        self.channels.clear()
        for channel in channels:
            await channel.close()
