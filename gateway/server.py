"""Run one node: open the store, start the node runtime, open the listeners, reload on SIGHUP, shut down
cleanly on SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import functools
import logging
import signal
import ssl
import time
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from gateway.accept_loop import AcceptLoop
from gateway.config import Settings
from gateway.connection import MqttConnection
from gateway.listeners import Listener, make_listeners, reload_certificate, tls_context
from gateway.node import Node
from gateway.security import Security
from gateway.websocket import WebSocketProtocol
from gateway.websocket_core import WebSocketOptions
from lookup.base import InProcessLookup
from notify.base import LocalNotifier
from store.base import Store
from store.delaying import DelayingStore
from store.embedded import EmbeddedStore

log = logging.getLogger("tidewire.server")

WS_FRAME_SLACK = 1024  # a WebSocket frame may carry a whole MQTT packet plus a little


class _Closable(Protocol):
    def close(self) -> None: ...


class StartupError(Exception):
    """A configured file (password file, keys, certificate, ACL) cannot be used: refuse to start rather than
    serve with less protection than the operator asked for."""


def build_store(settings: Settings) -> Store:
    store: Store
    if settings.store.startswith(("redis://", "rediss://", "unix://")):
        from store.redis_store import RedisStore  # redis-py is an extra: imported only when asked for

        store = RedisStore(settings.store, retention_bytes=settings.retention_bytes,
                           retention_seconds=settings.retention_seconds)
    elif settings.store == "embedded":
        store = EmbeddedStore(
            settings.data_dir, fsync=settings.fsync, fsync_interval_ms=settings.fsync_interval_ms,
            segment_bytes=settings.segment_bytes, retention_bytes=settings.retention_bytes,
            retention_seconds=settings.retention_seconds, recent_messages=settings.store_recent_messages)
    else:
        raise StartupError(f"unknown store {settings.store!r} (embedded, or redis://HOST:PORT/DB)")
    if settings.store_test_delay_ms:
        store = DelayingStore(store, settings.store_test_delay_ms)
    return store


def protocol_factory(node: Node, listener: Listener) -> Callable[[tuple[str, int] | None], asyncio.Protocol]:
    """What a listener runs per accepted socket: MQTT, behind a WebSocket layer on ws/wss listeners."""
    settings = node.settings
    ws = WebSocketOptions(path=settings.ws_path, max_frame=settings.max_packet_size + WS_FRAME_SLACK,
                          handshake_timeout=settings.connect_timeout, close_timeout=settings.close_drain_timeout,
                          require_subprotocol=settings.ws_require_subprotocol,
                          origins=frozenset(settings.ws_origins) if settings.ws_origins is not None else None)

    def make(peer: tuple[str, int] | None = None) -> asyncio.Protocol:
        if listener.websocket:
            return WebSocketProtocol(lambda: MqttConnection(node, listener, peer), ws)
        return MqttConnection(node, listener, peer)

    return make


async def open_listeners(node: Node, tls: ssl.SSLContext | None) -> list[_Closable]:
    settings = node.settings
    loop = asyncio.get_running_loop()
    servers: list[_Closable] = []
    for listener, port in make_listeners(settings, time.monotonic()):
        factory = protocol_factory(node, listener)
        ctx = tls if listener.tls else None
        if listener.proxy_protocol or ctx is not None:
            # Our own accept loop: it reads PROXY headers, and it sees (and logs) failed TLS handshakes.
            accepting = AcceptLoop(factory, settings.host, port, ssl=ctx, name=listener.name,
                                   header_timeout=settings.proxy_protocol_timeout,
                                   ssl_handshake_timeout=settings.connect_timeout,
                                   trusted=settings.proxy_protocol_trusted, proxy_protocol=listener.proxy_protocol)
            await accepting.start()
            listener.port = accepting.sockets[0].getsockname()[1]
            servers.append(accepting)
        else:
            server = await loop.create_server(functools.partial(factory, None), settings.host, port,
                                              backlog=4096, reuse_address=True)
            listener.port = server.sockets[0].getsockname()[1] if server.sockets else port
            servers.append(server)
        log.info("listening", extra={"listener": listener.name, "host": settings.host, "port": listener.port,
                                     "max_connections": listener.max_connections,
                                     "proxy_protocol": listener.proxy_protocol})
    return servers


async def serve(settings: Settings, stop: asyncio.Event | None = None) -> None:
    loop = asyncio.get_running_loop()
    try:
        security = Security.build(settings)
        tls = tls_context(settings) if settings.tls_port is not None or settings.wss_port is not None else None
    except (OSError, ValueError, ssl.SSLError) as exc:
        raise StartupError(str(exc)) from exc
    store = build_store(settings)
    try:
        await store.open()
    except OSError as exc:
        raise StartupError(f"store {settings.store}: {exc}") from exc
    lookup = InProcessLookup()
    node = Node(settings, store, lookup, LocalNotifier(lookup), security.authorizer, security.enhanced,
                security.chain, max_pending=settings.max_pending_publishes)
    await node.start()
    lag_watch = loop.create_task(node.admission.watch_loop_lag())
    servers = await open_listeners(node, tls)
    log.info("started", extra={"node": settings.node_id, "data_dir": str(settings.data_dir), "fsync": settings.fsync,
                               "auth": ",".join(s.name for s in security.chain.sources) or "none",
                               "allow_anonymous": security.chain.allow_anonymous})

    def reload() -> None:
        errors = security.reload(settings, node)
        if tls is not None:
            try:
                reload_certificate(tls, settings)
            except (OSError, ssl.SSLError) as exc:
                errors.append(f"tls: {exc}")
        if errors:
            log.error("reload.failed", extra={"errors": "; ".join(errors)})
        else:
            log.info("reloaded")

    if stop is None:
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, reload)
    await stop.wait()
    log.info("stopping")
    loop.remove_signal_handler(signal.SIGHUP)
    for server in servers:
        server.close()
    lag_watch.cancel()
    # Only our accept loops: a plain server's wait_closed also waits for its connections, closed below.
    await asyncio.gather(*(server.wait_closed() for server in servers if isinstance(server, AcceptLoop)))
    await node.stop()
    await store.close()
    await security.close()
    log.info("stopped")


def run(coro: Coroutine[Any, Any, None]) -> None:
    """Run on uvloop where it is installed."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(coro)
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(coro)
