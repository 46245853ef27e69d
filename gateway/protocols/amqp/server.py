"""The AMQP 0.9.1 backend: its listeners (plain on `amqp_port`, TLS on `amqps_port`), its connections, the
node-wide exchange and queue views they share, and the sweep of queues (x-expires, expiry at the heads, length
limits). `gateway.server` starts and stops it."""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
import ssl
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from tidewire.gateway.config import ListenerName
from tidewire.gateway.core.held_keys import HeldKeys
from tidewire.gateway.protocols.amqp.codec import CONNECTION_FORCED, Fault
from tidewire.gateway.protocols.amqp.connection import AmqpConnection
from tidewire.gateway.protocols.amqp.core import ConnectionCore
from tidewire.gateway.protocols.amqp.events import Limits
from tidewire.gateway.protocols.amqp.exchanges import Exchanges
from tidewire.gateway.protocols.amqp.queues import Queues
from tidewire.gateway.protocols.amqp.routing import Routing
from tidewire.gateway.transport.listeners import Listener, make_listener, open_listener

if TYPE_CHECKING:
    from tidewire.gateway.node import Node

log = logging.getLogger("tidewire.amqp")

EXPIRY_CHECK_S = 0.5  # how often x-expires queues, expired heads and length limits are looked at
STOP_GRACE_S = 1.0  # how long stop() waits for the cleanups of closed connections to make progress
CAPABILITIES = {"publisher_confirms": True, "basic.nack": True, "consumer_cancel_notify": True,
                "connection.blocked": True, "exchange_exchange_bindings": True, "per_consumer_qos": True,
                "authentication_failure_close": True}


class AmqpServer:
    """`gateway.server.Backend` for AMQP 0.9.1."""

    def __init__(self, node: Node, tls: ssl.SSLContext | None) -> None:
        self.node = node
        self.tls = tls
        settings = node.settings
        self.limits = Limits(settings.amqp_frame_max, settings.amqp_channel_max, settings.amqp_heartbeat,
                             settings.amqp_max_body)
        self.properties: dict[str, Any] = {"product": "Tidewire", "platform": "Python", "version": "0.9.1",
                                           "cluster_name": settings.node_id, "capabilities": dict(CAPABILITIES)}
        self.exchanges = Exchanges(node)
        self.held_keys = HeldKeys(node.writes, node.clock, settings.amqp_dedupe_seconds)
        self.queues = Queues(node, self.exchanges)
        self.routing = Routing(node.store, node.clock)
        node.groups.on_process_gone(self.queues.process_gone)
        self.connections: dict[str, set[AmqpConnection]] = {"amqp": set(), "amqps": set()}
        self.listeners: dict[str, Listener] = {}  # their limits, PROXY protocol and deadlines are MQTT's
        self.ports: dict[str, int] = {}
        self._servers: list[Any] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self._ids = itertools.count(1)
        # Connection ids carry the node id (exclusive queues left by this node's previous life are found by
        # it) and a per-process nonce (ids of that life never collide with this one's).
        self._prefix = f"amqp-{settings.node_id}-{secrets.token_hex(3)}-"
        self._expiry: asyncio.Task[None] | None = None

    # --- for connections ---------------------------------------------------------------------------------
    def new_connection_id(self) -> str:
        return f"{self._prefix}{next(self._ids)}"

    def new_core(self, wake: Callable[[], None]) -> ConnectionCore:
        return ConnectionCore(self.limits, self.properties, wake, self.node.clock.monotonic())

    def track(self, conn: AmqpConnection) -> None:
        self.connections[conn.listener.name].add(conn)

    def forget(self, conn: AmqpConnection) -> None:
        self.connections[conn.listener.name].discard(conn)
        if conn.counted:
            conn.listener.connections -= 1
            if conn.tenant is not None:
                conn.tenant.connections -= 1
            conn.counted = False

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run in the background; stop() waits for these (requeues, exclusive queue deletions)."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("amqp.task_failed", exc_info=task.exception())

    # --- Backend -----------------------------------------------------------------------------------------
    async def start(self) -> None:
        settings = self.node.settings
        await self.queues.drop_orphans()
        loop = asyncio.get_running_loop()
        wanted: list[tuple[ListenerName, int, ssl.SSLContext | None]] = []
        if settings.amqp_port is not None:
            wanted.append(("amqp", settings.amqp_port, None))
        if settings.amqps_port is not None and self.tls is not None:
            wanted.append(("amqps", settings.amqps_port, self.tls))
        try:
            for name, port, ctx in wanted:
                listener = self.listeners[name] = make_listener(settings, name, self.node.clock)

                def factory(peer: tuple[str, int] | None, listener: Listener = listener) -> AmqpConnection:
                    return AmqpConnection(self, listener, peer)

                self._servers.append(await open_listener(listener, port, factory, settings, ctx))
                self.ports[name] = listener.port
                log.info("listening", extra={"listener": name, "host": settings.host, "port": listener.port,
                                             "max_connections": listener.max_connections,
                                             "proxy_protocol": listener.proxy_protocol})
        except OSError:
            for server in self._servers:
                server.close()
            self._servers.clear()
            raise
        self._expiry = loop.create_task(self._expire_loop())

    async def stop(self) -> None:
        for server in self._servers:
            server.close()
        if self._expiry is not None:
            self._expiry.cancel()
        await self.held_keys.stop()
        conns = [c for live in self.connections.values() for c in live]
        for conn in conns:
            conn.shutdown(Fault(CONNECTION_FORCED, "broker forced connection closure with reason 'shutdown'"))
        if conns:
            await asyncio.wait([c.closed for c in conns], timeout=self.node.settings.close_drain_timeout)
        for conn in conns:
            if conn.transport is not None and not conn.closed.done():
                conn.transport.abort()
        await asyncio.sleep(0)  # connection_lost of the aborted ones runs: their cleanups are spawned
        while self._tasks:  # cleanups of the connections just closed: requeue what they had unacked
            await asyncio.wait(list(self._tasks), timeout=STOP_GRACE_S)
            if all(not t.done() for t in self._tasks):
                break

    async def _expire_loop(self) -> None:
        while True:
            await asyncio.sleep(EXPIRY_CHECK_S)
            try:
                await self.queues.expire_due()
                await self.queues.sweep()
            except Exception:  # the store is down: try again next round
                log.warning("amqp.expiry_failed", exc_info=True)
