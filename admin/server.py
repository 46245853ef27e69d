"""The admin port's server, one job: run the admin app (`admin.app.build_app`) with uvicorn inside the node's
own event loop, on `admin_host:admin_port`, and stop it cleanly.

No signal handlers of its own: the node owns SIGTERM/SIGINT (uvicorn's `serve` would take them over). The socket
is bound here before uvicorn sees it, so a port in use is an `OSError` from `start()` (uvicorn itself would exit
the process) and port 0 picks a free one (`.port`). It looks like a `gateway.server.Backend`: `start`, `stop`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Iterator, Sequence

import uvicorn

from tidewire.admin.app import Endpoints, ListenerSpec, build_app
from tidewire.admin.token import resolve_token
from tidewire.bridges.rules.engine import RuleEngine
from tidewire.bridges.runner import BridgeRunner
from tidewire.gateway.config import Settings
from tidewire.gateway.core.clock import Clock
from tidewire.gateway.node import Node
from tidewire.gateway.transport.listeners import make_listeners

log = logging.getLogger("tidewire.admin")

BACKLOG = 128  # the admin port serves operators and scrapers, not clients
START_TIMEOUT_S = 5.0
GRACEFUL_STOP_S = 2  # requests in progress get this long at stop (a QoS 1 publish waits for its sync)
STOP_TIMEOUT_S = 5.0  # then whatever is left is cancelled
_START_POLL_S = 0.005


class _InLoopServer(uvicorn.Server):
    """uvicorn without its signal handling: it runs in a loop and a process it does not own."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def bind(host: str, port: int) -> socket.socket:
    """A listening-ready TCP socket on `host:port` (IPv4 or IPv6; 0: a free port); OSError if it cannot be."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                         flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(BACKLOG)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def endpoints_of(settings: Settings, servers: Sequence[object], backends: Sequence[object], clock: Clock) -> Endpoints:
    """The listeners `gateway.server.serve` opened: the MQTT ones (`servers`, in `make_listeners` order, one
    each), and the backends' (AMQP, RocketMQ) with their bound ports."""
    found = Endpoints()
    host = settings.host
    for (listener, configured), server in zip(make_listeners(settings, clock), servers, strict=False):
        sockets = getattr(server, "sockets", None) or ()
        port = sockets[0].getsockname()[1] if sockets else configured
        found.listeners.append(ListenerSpec(listener.name, host, int(port), listener.max_connections))
    if settings.amqp_port is not None or settings.amqps_port is not None:
        from tidewire.gateway.protocols.amqp.server import AmqpServer

        for backend in backends:
            if isinstance(backend, AmqpServer):
                found.amqp = backend
                found.listeners += [ListenerSpec(name, host, port, backend.listeners[name].max_connections)
                                    for name, port in sorted(backend.ports.items())]
    if settings.rocketmq_port is not None:
        from tidewire.gateway.protocols.rocketmq.server import RocketMQServer

        found.listeners += [ListenerSpec("rocketmq", host, b.port, b.listener.max_connections if b.listener else None)
                            for b in backends if isinstance(b, RocketMQServer)]
    for backend in backends:
        if isinstance(backend, BridgeRunner):
            found.bridges = backend
        elif isinstance(backend, RuleEngine):
            found.rules = backend
    return found


class AdminServer:
    """The admin port of `node`: `await start()` once the listeners are up, `await stop()` at shutdown."""

    def __init__(self, node: Node, settings: Settings, *, servers: Sequence[object] = (),
                 backends: Sequence[object] = ()) -> None:
        """`servers` and `backends`: what `gateway.server.serve` opened (listed by /api/v1/listeners); read at
        `start()`, so start this after them."""
        self.node = node
        self.settings = settings
        self._servers = servers
        self._backends = backends
        self.host = settings.admin_host or settings.host
        self.port = 0  # bound port, once started
        self._server: _InLoopServer | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Resolve the token, bind the port and serve. OSError: the port cannot be bound or the token file
        cannot be read or written (`admin.token.TokenError` is one)."""
        token, token_file = resolve_token(self.settings)
        app = build_app(self.node, token.value, endpoints_of(self.settings, self._servers, self._backends,
                                                               self.node.clock))
        sock = bind(self.host, self.settings.admin_port or 0)  # None never starts this
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(app, log_config=None, lifespan="off", access_log=False, http="h11", ws="none",
                                server_header=False, proxy_headers=False, backlog=BACKLOG,
                                timeout_graceful_shutdown=GRACEFUL_STOP_S)
        server = self._server = _InLoopServer(config)
        task = self._task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]), name="admin")
        clock = self.node.clock
        deadline = clock.monotonic() + START_TIMEOUT_S
        while not server.started:
            if task.done() or clock.monotonic() > deadline:
                await self._abandon(sock)
                raise OSError(f"admin port {self.host}:{self.port} did not start")
            await asyncio.sleep(_START_POLL_S)
        log.info("admin.started", extra={"host": self.host, "port": self.port, "token": token.source,
                                         "token_file": str(token_file) if token_file is not None else None})

    async def _abandon(self, sock: socket.socket) -> None:
        task, self._task, self._server = self._task, None, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        sock.close()

    async def stop(self) -> None:
        """Stop accepting, let requests in progress finish (up to GRACEFUL_STOP_S), close the port."""
        server, task = self._server, self._task
        self._server = self._task = None
        if server is None or task is None:
            return
        server.should_exit = True
        done, _ = await asyncio.wait([task], timeout=STOP_TIMEOUT_S)
        if not done:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        elif not task.cancelled() and task.exception() is not None:
            log.error("admin.stop_failed", exc_info=task.exception())
        log.info("admin.stopped", extra={"port": self.port})
