"""Run one node: open the store, start the node runtime, open the listeners, reload on SIGHUP, shut down
cleanly on SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import signal
import socket
import ssl
import sys
import urllib.parse
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from tidewire.bridges.mqtt.settings import BridgeSettings
from tidewire.bridges.rules.engine import RuleEngine, check_rule
from tidewire.bridges.runner import BridgeRunner, configured_bridges
from tidewire.errors import ConfigError, MissingExtra, StartupError
from tidewire.extensions.plugins import PluginCatalog
from tidewire.gateway import extras
from tidewire.gateway.cluster import ClusterRole
from tidewire.gateway.config import Settings
from tidewire.gateway.core.clock import SYSTEM_CLOCK, Clock
from tidewire.gateway.node import Node
from tidewire.gateway.ops.drain import drain
from tidewire.gateway.ops.dynsec import DynamicSecurity
from tidewire.gateway.protocols.mqtt.connection import MqttProtocol
from tidewire.gateway.security import Security
from tidewire.gateway.transport.listeners import Listener, make_listeners, open_listener
from tidewire.gateway.transport.tls import CertificateFiles, reload_certificate, tls_context
from tidewire.gateway.transport.websocket import WebSocketProtocol
from tidewire.gateway.transport.websocket_core import WebSocketOptions
from tidewire.lookup.base import InProcessLookup, Lookup
from tidewire.notify.base import LocalNotifier, Notifier
from tidewire.store.base import Store
from tidewire.store.embedded.engine import EmbeddedStore
from tidewire.store.embedded.meta.options import MetaLimits

if TYPE_CHECKING:
    from tidewire.lookup.fabric import ClusterFabric

log = logging.getLogger("tidewire.server")

BRIDGE_STOP_TIMEOUT = 15.0  # s a stopping node waits for its lake bridge to commit
BRIDGE_RESTART_S = 0.5
BRIDGE_NICE = 10  # on a shared core the bridge gets ~1/10 of the gateway's share: it lags rather than slows it
WS_FRAME_SLACK = 1024  # a WebSocket frame may carry a whole MQTT packet plus a little


class _Closable(Protocol):
    def close(self) -> None: ...


class Backend(Protocol):
    """A protocol adapter with its own listener over the same node (AMQP, RocketMQ: `gateway/protocols/`)."""

    async def start(self) -> None:
        """Listen; raise OSError if the port cannot be bound."""

    async def stop(self) -> None:
        """Stop listening and close every connection (before the node stops)."""


@runtime_checkable
class Reloads(Protocol):
    """A backend with files of its own to read again on SIGHUP (RocketMQ's access keys and certificate)."""

    def reload(self) -> list[str]:
        """Read them again; what failed (each keeps its previous state), empty when all went through."""


@dataclass(frozen=True, slots=True)
class OptionalParts:
    """The optional parts this node runs: the listeners on in the settings with their extra installed, and the
    bridges the settings and the Mosquitto bridge file configure."""

    amqp: bool
    rocketmq: bool
    admin: bool
    bridges: tuple[BridgeSettings, ...] = ()


def _listener_on(settings: Settings, extra: str, fields: tuple[str, ...], what: str) -> bool:
    """A listener the settings turn on (a port field not `off`), if its extra is installed: off with one log
    line when it is on only by default; MissingExtra when a flag, the environment or the file asked for it."""
    if all(getattr(settings, name) is None for name in fields):
        return False
    if extras.installed(extra):
        return True
    asked = [name for name in fields if name in settings.model_fields_set and getattr(settings, name) is not None]
    if asked:
        extras.require(extra, f"the {what} listener ({', '.join(asked)})")
    log.info("listener.off", extra={"listener": what, "reason": f"tidewire[{extra}] is not installed"})
    return False


def optional_parts(settings: Settings) -> OptionalParts:
    """Check, before anything starts, that every optional part the settings ask for is installed."""
    if settings.store.startswith(REDIS_SCHEMES):
        extras.require("redis", f"the store {settings.store.split('://', 1)[0]}://")
    if settings.jwt_configured:
        extras.require("jwt", "JWT authentication (jwt_secret, jwt_public_key or jwt_jwks_file)")
    if settings.http_auth_url:
        extras.require("http-auth", "HTTP authentication (http_auth_url)")
    if settings.lake_dir is not None:
        extras.require("lake", "the lake (lake_dir)")
    try:
        bridges = configured_bridges(settings.bridges, settings.mosquitto_bridge_file, socket.gethostname())
    except (ConfigError, OSError) as exc:
        raise StartupError(f"bridges: {exc}") from exc
    rules = [rule.name for rule in settings.rules]
    if len(set(rules)) != len(rules):
        raise StartupError(f"rules: a name is given twice: {sorted(n for n in set(rules) if rules.count(n) > 1)}")
    catalog = PluginCatalog()
    for rule in settings.rules:
        try:
            check_rule(rule, {bridge.name for bridge in bridges}, catalog)
        except ValueError as exc:
            raise StartupError(str(exc)) from exc
    return OptionalParts(amqp=_listener_on(settings, "amqp", ("amqp_port", "amqps_port"), "AMQP"),
                         rocketmq=_listener_on(settings, "rocketmq", ("rocketmq_port",), "RocketMQ"),
                         admin=_listener_on(settings, "admin", ("admin_port",), "admin HTTP"),
                         bridges=tuple(bridges))


def build_backends(node: Node, tls: ssl.SSLContext | None, parts: OptionalParts,
                   certificates: CertificateFiles | None = None) -> list[Backend]:
    """The backend protocol handlers the settings enable (imported only then)."""
    settings = node.settings
    backends: list[Backend] = []
    if parts.amqp:
        from tidewire.gateway.protocols.amqp.server import AmqpServer

        backends.append(AmqpServer(node, tls if settings.amqps_port is not None else None))
    if parts.rocketmq:
        from tidewire.gateway.protocols.rocketmq.server import RocketMQServer

        backends.append(RocketMQServer(node, certificates))
    if settings.lake_dir is not None:
        from tidewire.pipeline.lake.command import Lake

        # This node's events are exported in-process (they exist only here); the log's bridge runs as a child
        # process: building Arrow tables holds the GIL, which would stall this loop's deliveries for as long.
        events = Lake(None, settings.lake_dir, settings.node_id, events=node.events, node=settings.node_id,
                      bridge=False, flush_rows=settings.lake_flush_rows, flush_seconds=settings.lake_flush_seconds)
        backends.append(LakeRunner(events, bridge_command(settings) if settings.lake_bridge else None, node.clock))
    if parts.bridges:
        backends.append(BridgeRunner(node, list(parts.bridges)))
    # Always: rules made through the admin API (stored with the cluster) run even if the config file has none.
    backends.append(RuleEngine(node, list(settings.rules), parts.bridges))
    return backends


def bridge_command(settings: Settings) -> tuple[list[str], dict[str, str]]:
    """argv and environment of this node's log bridge (`python -m tidewire.pipeline.lake`): the embedded store's
    directory read-only, or the shared store's URL through the environment (it may hold a password)."""
    assert settings.lake_dir is not None
    argv = [sys.executable, "-m", "tidewire.pipeline.lake", "--lake", str(settings.lake_dir),
            "--owner", settings.node_id, "--parent-pid", str(os.getpid()), "--nice", str(BRIDGE_NICE),
            "--flush-rows", str(settings.lake_flush_rows),
            "--flush-bytes", str(settings.lake_flush_bytes), "--flush-seconds", str(settings.lake_flush_seconds),
            "--retention-days", str(settings.lake_retention_days),
            "--sparkplug-births", str(settings.sparkplug_lake_births),
            "--log-level", settings.log_level.upper()]
    argv += (["--compact-target-bytes", str(settings.lake_compact_target_bytes),
              "--compact-after", str(settings.lake_compact_after), "--compact-grace", str(settings.lake_compact_grace)]
             if settings.lake_compact else ["--no-compact"])
    env = dict(os.environ)
    if settings.store.startswith(REDIS_SCHEMES):
        env["TIDEWIRE_LAKE_STORE"] = settings.store
        if "-cluster://" in settings.store:
            argv += ["--partitions", str(settings.store_partitions)]
    else:
        argv += ["--data-dir", str(settings.data_dir)]
    return argv, env


class LakeRunner:
    """`--lake` as a backend of the node: the events exporter in-process, and the log's bridge as a supervised
    child process (restarted after a crash; it resumes from its checkpoint). The bridge is stopped, flushed and
    committed before the node stops (`stop`); the exporter after it (`finish`), so the events of the node's own
    stopping (its clients' disconnects, the drain's acks) reach the lake too."""

    def __init__(self, events: Any, bridge: tuple[list[str], dict[str, str]] | None, clock: Clock) -> None:
        self.events = events
        self.bridge = bridge
        self.clock = clock  # how long the bridge ran decides how soon it is restarted
        self._tasks: list[asyncio.Task[None]] = []
        self._proc: asyncio.subprocess.Process | None = None
        self._stopping = False

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self.events.run(), name="lake-events"))
        if self.bridge is not None:
            self._tasks.append(loop.create_task(self._supervise(*self.bridge), name="lake-bridge"))
        for task in self._tasks:
            task.add_done_callback(self._ended)

    async def _supervise(self, argv: list[str], env: dict[str, str]) -> None:
        delay = BRIDGE_RESTART_S
        while not self._stopping:
            started = self.clock.monotonic()
            self._proc = await asyncio.create_subprocess_exec(*argv, env=env, stdin=asyncio.subprocess.DEVNULL,
                                                              stdout=asyncio.subprocess.DEVNULL)
            code = await self._proc.wait()
            if self._stopping:
                return
            # a bridge that ran a while gets restarted at once; one that keeps failing, ever more slowly
            delay = BRIDGE_RESTART_S if self.clock.monotonic() - started > 60 else min(delay * 2, 60.0)
            log.error("lake.bridge_exited", extra={"code": code, "restart_in_s": delay})
            await asyncio.sleep(delay)

    @staticmethod
    def _ended(task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("lake.failed", exc_info=task.exception())  # the gateway goes on; the lake lags

    async def stop(self) -> None:
        self._stopping = True
        proc = self._proc
        if proc is not None and proc.returncode is None:
            proc.terminate()  # the bridge drains the log for a moment, flushes and commits
            try:
                await asyncio.wait_for(proc.wait(), BRIDGE_STOP_TIMEOUT)
            except TimeoutError:
                proc.kill()  # its checkpoint keeps what it committed; the next run resumes there
                await proc.wait()
        await asyncio.gather(*self._tasks[1:], return_exceptions=True)

    async def finish(self) -> None:
        """After the node stopped: the exporter's last flush."""
        self._stopping = True
        await self.events.stop()
        await asyncio.gather(*self._tasks, return_exceptions=True)


REDIS_SCHEMES = ("redis://", "rediss://", "unix://", "redis-cluster://", "rediss-cluster://", "redis-sentinel://")


def build_fabric(settings: Settings) -> ClusterFabric | None:
    """The cluster fabric when `cluster_port` is set (a Redis store only: the nodes must share it)."""
    if settings.cluster_port is None:
        return None
    if not settings.store.startswith(REDIS_SCHEMES):
        raise StartupError("cluster_port needs a shared store: --store redis://... or redis-cluster://...")
    if not settings.cluster_secret:
        raise StartupError("cluster_port needs cluster_secret: every node must prove it to the others")
    from tidewire.lookup.fabric import ClusterFabric

    return ClusterFabric(settings.node_id, redis_client(settings.store, settings.store_timeout), host=settings.host,
                         cluster_port=settings.cluster_port, secret=settings.cluster_secret,
                         heartbeat_interval=settings.cluster_heartbeat, member_ttl=settings.cluster_member_ttl,
                         advertise_host=settings.cluster_host,
                         advertise_port=settings.cluster_advertise_port, notify_lease=settings.cluster_notify_lease)


def redis_client(url: str, timeout: float = 5.0) -> Any:
    """A plain redis-py client for the membership (the store keeps its own connections); `timeout`: s a call may
    wait for an answer."""
    from tidewire.store.redis.conn import plain_client

    return plain_client(url, connect_timeout=min(2.0, timeout), socket_timeout=timeout)


def build_store(settings: Settings) -> Store:
    """The engine `settings.store` names (not yet opened)."""
    url = settings.store
    if url.startswith(REDIS_SCHEMES):
        from tidewire.store.redis.engine import RedisStore  # redis-py is an extra: imported only when asked for

        try:
            return RedisStore(url, retention_bytes=settings.retention_bytes,
                              retention_seconds=settings.retention_seconds,
                              retention_ignores_holds=settings.retention_ignores_holds,
                              epoch_ttl=settings.store_epoch_ttl,
                              partitions=settings.store_partitions if "-cluster://" in url else 1,
                              replicas=settings.store_replicas, replica_timeout=settings.store_replica_timeout,
                              replica_backlog=settings.store_replica_backlog,
                              connect_timeout=min(2.0, settings.store_timeout), socket_timeout=settings.store_timeout)
        except ValueError as exc:
            raise StartupError(f"store {url!r}: {exc}") from exc
    if url == "embedded":
        return EmbeddedStore(
            settings.data_dir, fsync=settings.fsync, fsync_interval_ms=settings.fsync_interval_ms,
            segment_bytes=settings.segment_bytes, retention_bytes=settings.retention_bytes,
            retention_seconds=settings.retention_seconds, recent_messages=settings.store_recent_messages,
            retention_ignores_holds=settings.retention_ignores_holds, segment_max_queues=settings.segment_max_queues,
            index_checkpoint_bytes=settings.index_checkpoint_bytes, meta_limits=MetaLimits(
                write_buffer_bytes=settings.meta_write_buffer_mb * 2**20,
                block_cache_bytes=settings.meta_block_cache_mb * 2**20,
                max_background_jobs=settings.meta_background_jobs))
    if "://" not in url and ":" in url:
        return _engine_from_import_string(settings, url)
    raise StartupError(f"unknown store {url!r} (embedded, redis://HOST:PORT/DB, "
                       "redis-cluster://HOST:PORT[,HOST:PORT...], redis-sentinel://HOST:PORT[,HOST:PORT...]/MASTER_NAME"
                       "[/DB] or package.module:factory)")


def _engine_from_import_string(settings: Settings, spec: str) -> Store:
    """`package.module:factory[?key=value&...]`: `factory(settings, key=value, ...)` builds an engine that does
    not ship with Tidewire (the test suite's late-answering and failing engines are two)."""
    target, _, query = spec.partition("?")
    module_name, _, attribute = target.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise StartupError(f"store {spec!r}: {exc}") from exc
    params = dict(urllib.parse.parse_qsl(query, keep_blank_values=True))
    store = factory(settings, **params)
    if not isinstance(store, Store):
        raise StartupError(f"store {spec!r}: {attribute}() returned {type(store).__name__}, not a store")
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
            return WebSocketProtocol(lambda: MqttProtocol(node, listener, peer), ws)
        return MqttProtocol(node, listener, peer)

    return make


async def open_listeners(node: Node, tls: ssl.SSLContext | None) -> list[_Closable]:
    """The MQTT listeners (AMQP opens its own through the same `open_listener`)."""
    settings = node.settings
    servers: list[_Closable] = []
    for listener, port in make_listeners(settings, node.clock):
        servers.append(await open_listener(listener, port, protocol_factory(node, listener), settings,
                                           tls if listener.tls else None))
        log.info("listening", extra={"listener": listener.name, "host": settings.host, "port": listener.port,
                                     "max_connections": listener.max_connections,
                                     "proxy_protocol": listener.proxy_protocol})
    return servers


async def serve(settings: Settings, stop: asyncio.Event | None = None, clock: Clock = SYSTEM_CLOCK) -> None:
    """Run a node until `stop` is set (or SIGTERM/SIGINT); `clock` is the one clock every part of it reads."""
    loop = asyncio.get_running_loop()
    try:
        parts = optional_parts(settings)
    except MissingExtra as exc:
        raise StartupError(str(exc)) from exc
    try:
        security = Security.build(settings, clock=clock)
        tls = tls_context(settings) if any(port is not None for port in (
            settings.tls_port, settings.wss_port, settings.amqps_port)) else None
        certificates = CertificateFiles(settings) if settings.rocketmq_tls and parts.rocketmq else None
    except (OSError, ValueError, ssl.SSLError) as exc:
        raise StartupError(str(exc)) from exc
    store = build_store(settings)
    try:
        await store.open()
    except OSError as exc:
        raise StartupError(f"store {settings.store}: {exc}") from exc
    try:
        fabric = build_fabric(settings)
    except StartupError:
        await store.close()
        raise
    lookup: Lookup
    notifier: Notifier
    if fabric is not None:
        try:
            await fabric.start()
        except (OSError, RuntimeError) as exc:
            await store.close()
            raise StartupError(f"cluster: {exc}") from exc
        lookup, notifier = fabric.lookup, fabric.notifier
    else:
        lookup = InProcessLookup()
        notifier = LocalNotifier(lookup)
    role: Callable[[Node], ClusterRole] | None = None
    if fabric is not None:
        joined = fabric

        def role(node: Node) -> ClusterRole:
            return ClusterRole(node, joined, settings.cluster_resync_interval, settings.cluster_member_ttl)

    node = Node(settings, store, lookup, notifier, security.authorizer, security.enhanced,
                security.chain, max_pending=settings.max_pending_publishes, clock=clock, topology=role,
                authorizers=[*security.authorizers, *security.guards], publish_hooks=security.hooks,
                plugin_errors=security.plugin_errors)
    if security.dynsec is not None:
        node.dynsec = DynamicSecurity(node, security.dynsec)
    await node.start()
    lag_watch = loop.create_task(node.admission.watch_loop_lag())
    servers = await open_listeners(node, tls)
    backends = build_backends(node, tls, parts, certificates)
    admin: Backend | None = None
    if parts.admin:  # FastAPI and uvicorn are imported only then
        from tidewire.admin.server import AdminServer

        admin = AdminServer(node, settings, servers=servers, backends=backends)
    starting = [*backends, *([admin] if admin is not None else [])]  # the admin port last: it shows the others
    for backend in starting:
        try:
            await backend.start()
        except OSError as exc:
            for server in servers:
                server.close()
            for started in starting[:starting.index(backend)]:
                await started.stop()
            await node.stop()
            if fabric is not None:
                await fabric.stop()
            await store.close()
            raise StartupError(f"{type(backend).__name__}: {exc}") from exc
    log.info("started", extra={"node": settings.node_id, "data_dir": str(settings.data_dir), "fsync": settings.fsync,
                               "auth": ",".join(s.name for s in security.chain.sources) or "none",
                               "authorizers": ",".join(settings.authorizers),
                               "publish_hooks": ",".join(settings.publish_hooks) or "none",
                               "allow_anonymous": security.chain.allow_anonymous})

    def reload() -> None:
        errors = security.reload(settings, node)
        if tls is not None:
            try:
                reload_certificate(tls, settings)
            except (OSError, ssl.SSLError) as exc:
                errors.append(f"tls: {exc}")
        for backend in backends:
            if isinstance(backend, Reloads):
                errors += backend.reload()
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
    lag_watch.cancel()
    # Listeners, backends, clients (DISCONNECT 0x8B/0x9C), flush, cluster leave, store: within drain_timeout.
    # The admin port stays up meanwhile: /readyz answers 503 while the node drains.
    await drain(node, servers, backends, fabric, store)
    if admin is not None:
        await admin.stop()
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
