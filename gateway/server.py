"""Run one node: open the store, start the node runtime, listen for MQTT, shut down cleanly on a signal."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Coroutine
from typing import Any

from extensions.acl import AclFile
from extensions.hooks import AllowAll, Authorizer
from extensions.passwords import Credentials
from extensions.scram import ScramSha256
from gateway.config import Settings
from gateway.connection import MqttConnection
from gateway.node import Node
from lookup.base import InProcessLookup
from notify.base import LocalNotifier
from store.embedded import EmbeddedStore

log = logging.getLogger("tidewire.server")


def build_store(settings: Settings) -> EmbeddedStore:
    return EmbeddedStore(settings.data_dir, fsync=settings.fsync, fsync_interval_ms=settings.fsync_interval_ms,
                         segment_bytes=settings.segment_bytes, retention_bytes=settings.retention_bytes,
                         retention_seconds=settings.retention_seconds, recent_messages=settings.store_recent_messages)


async def serve(settings: Settings, stop: asyncio.Event | None = None) -> None:
    store = build_store(settings)
    await store.open()
    lookup = InProcessLookup()
    authorizer: Authorizer = AclFile.load(settings.acl_file) if settings.acl_file else AllowAll()
    enhanced_auth = ScramSha256(Credentials.load(settings.auth_file)) if settings.auth_file else None
    node = Node(settings, store, lookup, LocalNotifier(lookup), authorizer, enhanced_auth)
    await node.start()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: MqttConnection(node), settings.host, settings.port,
                                      backlog=4096, reuse_address=True)
    port = server.sockets[0].getsockname()[1] if server.sockets else settings.port
    log.info("listening", extra={"host": settings.host, "port": port, "node": settings.node_id,
                                 "data_dir": str(settings.data_dir), "fsync": settings.fsync})
    if stop is None:
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("stopping")
    server.close()
    await node.stop()
    await store.close()
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
