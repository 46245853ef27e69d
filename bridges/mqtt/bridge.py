"""One MQTT bridge on a node: what local clients publish on its `out` topics goes to the remote broker, what the
remote sends on its `in` topics is published here, and neither side loses what it acknowledged.

- **One active instance per cluster.** The bridge runs where it holds the store lease `bridge/<name>`; every other
  node waits in standby and takes over when the lease lapses (the holder died or lost the store).
- **Out reads the log from its own position.** The bridge is the consumer of the group `bridge/<name>` (its
  filters: the out topics' local filters), so what is published while the remote is down, the bridge is
  restarting or its node is dead waits in the log. A message is claimed when the link has credit and settled only
  after the remote's PUBACK (PUBCOMP for QoS 2; at once for QoS 0). Unsettled claims go back to the group when
  the bridge stops or loses its lease, and a dead node's are released by the cluster: the next holder sends them
  again, as DUP when the remote kept the session. That is the bound on duplicates: one in-flight window per
  takeover or restart.
- **In publishes through the node's ingress**, checked by the ACL as the bridge's local identity, and acknowledges
  the remote only once the message is durable here.
- **No loops.** The remote subscriptions are No Local (MQTT 5) or the connection says it is a bridge
  (`try_private`, so a Mosquitto or Tidewire remote treats them so); a message that came in over this bridge is
  never sent back out over it.
- **Restart** follows Mosquitto's `restart_timeout`: a constant, or decorrelated jitter from base to cap.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Coroutine
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol

from tidewire.bridges.mqtt.client import Acked, ClientCore, ClientOptions, Incoming
from tidewire.bridges.mqtt.link import ConnectRefused, Link, client_tls_context
from tidewire.bridges.mqtt.settings import BridgeSettings, TopicRule
from tidewire.extensions.authentication import AuthRequest, Identity
from tidewire.extensions.hooks import ClientInfo
from tidewire.gateway.core.consumers import Delivery
from tidewire.gateway.core.ingress import refuse_publish
from tidewire.gateway.protocols.mqtt.codec import Will
from tidewire.store.base import PROTOCOL_BRIDGE, GroupRecord, Message

if TYPE_CHECKING:
    from tidewire.extensions.authentication import AuthChain
    from tidewire.extensions.hooks import Authorizer
    from tidewire.gateway.config import Settings
    from tidewire.gateway.core.clock import Clock
    from tidewire.gateway.core.consumers import ConsumerGroups
    from tidewire.gateway.core.ingress import DurableSink
    from tidewire.store.base import Store

log = logging.getLogger("tidewire.bridge")

VISIBILITY_MS = 600_000  # a claim in flight stays ours this long; a restart or a takeover releases it sooner
CONNECT_TIMEOUT_S = 10.0
GROUP_PREFIX = "bridge/"


class BridgeHost(Protocol):
    """What a bridge uses of its node."""

    @property
    def node_id(self) -> str: ...

    @property
    def settings(self) -> Settings: ...

    @property
    def store(self) -> Store: ...

    @property
    def groups(self) -> ConsumerGroups: ...

    @property
    def authorizer(self) -> Authorizer: ...

    @property
    def auth(self) -> AuthChain: ...

    @property
    def clock(self) -> Clock: ...

    def publish(self, message: Message, sink: DurableSink | None = None, token: Any = None) -> None: ...

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None: ...


class BridgeState(StrEnum):
    STANDBY = "standby"  # another node holds the bridge
    CONNECTING = "connecting"
    CONNECTED = "connected"
    WAITING = "waiting"  # the link failed: connecting again after the restart delay
    STOPPED = "stopped"  # stopped, or start_type once and the link ended


@dataclass
class BridgeCounters:
    sent: int = 0  # publishes written to the remote (resends included)
    acked: int = 0  # settled after the remote's acknowledgement
    refused_by_remote: int = 0  # acknowledged with an MQTT 5 error code: settled, not retried
    redelivered: int = 0  # claims sent again after a restart, a takeover or a lapse: possible duplicates
    received: int = 0  # publishes from the remote
    stored: int = 0  # of those, durable here
    denied: int = 0  # refused by the ACL (or an invalid topic) for the bridge's local identity
    connects: int = 0
    failures: int = 0  # connection attempts or links that failed


class RestartDelay:
    """Mosquitto's `restart_timeout`: `(c, c)` waits c seconds; `(base, cap)` decorrelated jitter
    (next = min(cap, uniform(base, 3 * previous))), back to base once a link held."""

    def __init__(self, base: float, cap: float, rng: random.Random) -> None:
        self.base = base
        self.cap = cap
        self.rng = rng
        self.previous = base

    def next(self) -> float:
        if self.cap <= self.base:
            return self.base
        self.previous = min(self.cap, self.rng.uniform(self.base, self.previous * 3))
        return self.previous

    def reset(self) -> None:
        self.previous = self.base


@dataclass
class _Outgoing:
    rule: TopicRule
    remote_topic: str


class MqttBridge:
    """One configured bridge. `run()` until `stop()`; `status()` for $SYS, metrics, the API and `tidewire ctl`."""

    def __init__(self, settings: BridgeSettings, host: BridgeHost, *, hostname: str,
                 rng: random.Random | None = None) -> None:
        settings = settings.resolved(hostname)  # the client ids and state topic as this host names them
        self.settings = settings
        self.host = host
        self.group = GROUP_PREFIX + settings.name
        self.lease_key = "bridge/" + settings.name
        self.client_id = settings.client_id
        self.local_id = settings.local_client_id
        self.state_topic = settings.state_topic
        self.state = BridgeState.STANDBY
        self.counters = BridgeCounters()
        self.address = ""  # host:port of the current or last link
        self.connected_since: float | None = None  # clock.time() of the current link
        self.last_error = ""
        self.lag_messages: int | None = None  # as last measured (`measure_lag`)
        self.lag_seconds: float | None = None
        self._restart = RestartDelay(*settings.restart_timeout, rng or random.Random())
        self._out_rules = [r for r in settings.topics if r.outgoing]
        self._in_rules = [r for r in settings.topics if r.incoming]
        self._identity = ClientInfo(self.local_id, settings.local_username, "bridge:" + settings.name,
                                    settings.protocol_level)
        self._core: ClientCore | None = None
        self._link: Link | None = None
        self._generation = 0  # which link an incoming publish's acknowledgement belongs to
        self._consumer = _Outbound(self)
        self._sink = _DurableAcks(self)
        self._stopping = asyncio.Event()
        self._lost_lease = asyncio.Event()

    # --- the supervisor ---------------------------------------------------------------------------------
    async def run(self) -> None:
        """Hold the lease and keep the link up while held; standby while another node holds it."""
        ttl = int(self.host.settings.bridge_lease_ttl * 1000)
        while not self._stopping.is_set():
            try:
                epoch = await self.host.store.lease(self.lease_key, self.host.node_id, ttl)
            except Exception as exc:
                self.last_error = f"store: {exc}"
                epoch = 0
            if not epoch:
                self.state = BridgeState.STANDBY
                await self._pause(ttl / 3000)
                continue
            self._lost_lease.clear()
            renew = asyncio.get_running_loop().create_task(self._renew(ttl), name=f"bridge-{self.settings.name}-lease")
            try:
                await self._serve()
            finally:
                renew.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await renew
                await self._give_back()
                with contextlib.suppress(Exception):
                    await self.host.store.release(self.lease_key, self.host.node_id)
            if self.settings.start_type == "once" and not self._lost_lease.is_set():
                break
        self.state = BridgeState.STOPPED

    async def stop(self) -> None:
        self._stopping.set()
        link = self._link
        if link is not None:
            settings = self.settings
            if settings.notifications and not settings.notifications_local_only:
                # A clean DISCONNECT drops the will: say "down" on the remote ourselves.
                link.publish(self.state_topic, b"0", 0, True, None)
            link.close()

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)

    async def _renew(self, ttl: int) -> None:
        """Renew every ttl/3; a refusal or a store down past the ttl ends the link (another node may take over)."""
        clock = self.host.clock
        held_until = clock.monotonic() + ttl / 1000
        while True:
            await asyncio.sleep(ttl / 3000)
            try:
                if await self.host.store.lease(self.lease_key, self.host.node_id, ttl):
                    held_until = clock.monotonic() + ttl / 1000
                    continue
            except Exception as exc:
                self.last_error = f"store: {exc}"
                if clock.monotonic() < held_until - ttl / 3000:
                    continue
            log.warning("bridge.lease_lost", extra={"bridge": self.settings.name})
            self._lost_lease.set()
            link = self._link
            if link is not None:
                link.close()
            return

    async def _serve(self) -> None:
        """Links to the remote, one after another, while the lease holds."""
        if self._out_rules:
            groups = self.host.groups
            filters = sorted({r.local_filter for r in self._out_rules})
            wanted = GroupRecord(self.group, filters, attrs={"bridge": self.settings.name})
            record, created = await groups.declare(wanted)
            if not created and record.filters != filters:  # the configuration changed: the position stays
                await groups.set_filters(record, filters)
            groups.matcher(self.group, self._wanted)
        identity = await self._local_identity()
        if identity is None:
            self.state = BridgeState.STOPPED
            await self._pause(1e9)
            return
        self._core = ClientCore(self._options())
        attempt = 0
        while not self._stopping.is_set() and not self._lost_lease.is_set():
            addresses = self.settings.addresses
            address = addresses[attempt % len(addresses)]
            attempt += 1
            self.state = BridgeState.CONNECTING
            self.address = f"{address.host}:{address.port}"
            try:
                link = await self._connect(address.host, address.port)
            except Exception as exc:
                self.counters.failures += 1
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.warning("bridge.connect_failed", extra={"bridge": self.settings.name, "address": self.address,
                                                            "error": self.last_error})
            else:
                if not self.settings.round_robin:
                    attempt = 0  # the next failure starts again from the main address
                await self._linked(link)
                if self.settings.start_type == "once":
                    return
            if self._stopping.is_set() or self._lost_lease.is_set():
                return
            self.state = BridgeState.WAITING
            await self._pause(self._restart.next())

    async def _connect(self, host: str, port: int) -> Link:
        settings = self.settings
        core = self._core
        assert core is not None
        def path(value: object) -> str | None:
            return str(value) if value is not None else None

        tls = client_tls_context(path(settings.bridge_cafile), path(settings.bridge_capath),
                                 path(settings.bridge_certfile), path(settings.bridge_keyfile),
                                 insecure=settings.bridge_insecure, tls_version=settings.bridge_tls_version,
                                 alpn=settings.bridge_alpn) if settings.tls else None
        for _ in range(2):
            link = Link(core, self, self.host.clock)
            try:
                await link.connect(host, port, tls=tls, bind_address=settings.bridge_bind_address,
                                   connect_timeout=CONNECT_TIMEOUT_S)
                return link
            except ConnectRefused as refused:
                # As Mosquitto: a 3.x broker that does not take the bridge bit answers "unacceptable protocol
                # version"; the bridge then connects as an ordinary client.
                if not (refused.code == 1 and core.options.try_private and settings.protocol_level < 5):
                    raise
                core.options.try_private = False
        raise AssertionError("unreachable: the second attempt returns or raises")

    def _options(self) -> ClientOptions:
        settings = self.settings
        will = None
        if settings.notifications and not settings.notifications_local_only:
            will = Will(self.state_topic, b"0", 1, True)
        return ClientOptions(
            client_id=self.client_id, level=settings.protocol_level, clean_start=settings.cleansession,
            keepalive=settings.keepalive_interval, username=settings.remote_username,
            password=settings.remote_password.encode() if settings.remote_password is not None else None,
            try_private=settings.try_private, session_expiry=settings.bridge_session_expiry_interval or 0,
            will=will, max_inflight=settings.max_inflight, max_packet_size=settings.bridge_max_packet_size)

    async def _linked(self, link: Link) -> None:
        """One link, from CONNACK until it closes."""
        self._link = link
        self._generation += 1
        self.counters.connects += 1
        self.connected_since = self.host.clock.time()
        self.state = BridgeState.CONNECTED
        self._restart.reset()
        log.info("bridge.connected", extra={"bridge": self.settings.name, "address": self.address,
                                             "client_id": self.client_id})
        try:
            self._notify_state(True)
            await self._subscribe(link)
            if self._out_rules:
                self.host.groups.consume(self.group, self._consumer)
            await link.wait_closed()
        except Exception as exc:
            self.last_error = f"{type(exc).__name__}: {exc}"
        finally:
            if self._out_rules:
                self.host.groups.cancel(self.group, self._consumer)
            link.close()
            self._link = None
            self.connected_since = None
            if not self._stopping.is_set():
                self.counters.failures += 1
            self._notify_state(False)
            log.warning("bridge.disconnected", extra={"bridge": self.settings.name, "address": self.address,
                                                      "error": self.last_error})

    async def _subscribe(self, link: Link) -> None:
        settings = self.settings
        if self._in_rules:
            granted = await link.subscribe([(r.remote_filter, r.qos, True, True) for r in self._in_rules])
            for rule, code in zip(self._in_rules, granted, strict=True):
                if code >= 0x80:
                    log.warning("bridge.subscribe_refused", extra={"bridge": settings.name,
                                                                   "filter": rule.remote_filter, "code": code})
        if settings.bridge_attempt_unsubscribe:
            # A persistent remote session may still hold an `in` subscription of an earlier configuration.
            out_only = [r.remote_filter for r in self._out_rules if not r.incoming]
            if out_only:
                await link.unsubscribe(out_only)

    def _notify_state(self, up: bool) -> None:
        settings = self.settings
        if not settings.notifications:
            return
        payload = b"1" if up else b"0"
        now_ms = int(self.host.clock.time() * 1000)
        self.host.publish(Message(self.state_topic, payload, 1, True, b"", now_ms, 0, self.local_id,
                                  protocol=PROTOCOL_BRIDGE))
        link = self._link
        if up and link is not None and not settings.notifications_local_only:
            link.publish(self.state_topic, payload, 1, True, None)

    async def _local_identity(self) -> ClientInfo | None:
        """Who the bridge is here, for the ACL: `local_username`, proved by `local_password` when the node
        authenticates its clients; None when the node refuses it (the bridge then stays down, logged)."""
        settings = self.settings
        if settings.local_username is None:
            return self._identity
        password = settings.local_password.encode() if settings.local_password is not None else None
        result = await self.host.auth.authenticate(AuthRequest(self.local_id, settings.local_username, password,
                                                               "bridge:" + settings.name, "mqtt", "bridge"))
        if not isinstance(result, Identity):
            self.last_error = f"local credentials refused ({result.failure.value})"
            log.error("bridge.local_auth_failed", extra={"bridge": settings.name, "user": settings.local_username})
            return None
        self._identity = ClientInfo(self.local_id, result.username, "bridge:" + settings.name,
                                    settings.protocol_level, result.superuser, result.acl)
        return self._identity

    async def _give_back(self) -> None:
        """The bridge stops here: what it claimed and the remote has not acknowledged is visible again now."""
        core = self._core
        self._core = None
        if core is None or not self._out_rules:
            return
        handles = [token for token in core.unacked() if isinstance(token, tuple)]
        if handles:
            with contextlib.suppress(Exception):  # else the claims lapse, or a restart releases them
                await self.host.groups.requeue(self.group, handles)

    # --- out ----------------------------------------------------------------------------------------------
    def _wanted(self, message: Message) -> bool:
        """What the out group passes over: what came in over this very bridge."""
        return message.publisher != self.local_id

    def _outgoing(self, topic: str) -> _Outgoing | None:
        for rule in self._out_rules:
            remote = rule.to_remote(topic)
            if remote is not None:
                return _Outgoing(rule, remote)
        return None

    def credit(self) -> int:
        link = self._link
        return link.credit() if link is not None else 0

    def deliver(self, deliveries: list[Delivery]) -> None:
        link = self._link
        settled: list[tuple[int, int]] = []
        now_ms = int(self.host.clock.time() * 1000)
        for message, claim in deliveries:
            handle = (claim.seq, claim.token)
            out = self._outgoing(message.topic)
            if link is None or out is None:  # gone meanwhile, or a filter the rules no longer have
                if link is None:
                    self.host.spawn(self._requeue([handle]))
                else:
                    settled.append(handle)
                continue
            if claim.deliveries > 1:
                self.counters.redelivered += 1
            qos = link.core.qos_for(min(message.qos, out.rule.qos))  # the server's Maximum QoS may cap it
            retain = message.retain and self.settings.bridge_outgoing_retain
            # What is left of its life goes with it (the group passes over the expired).
            left = max(1, (message.expires_at_ms - now_ms + 999) // 1000) if message.expires_at_ms else None
            link.publish(out.remote_topic, message.payload, qos, retain, handle if qos else None,
                         message.properties, left)
            self.counters.sent += 1
            if not qos:
                settled.append(handle)
        if settled:
            self.counters.acked += len(settled)
            self.host.spawn(self._settle(settled))

    async def _settle(self, handles: list[tuple[int, int]]) -> None:
        await self.host.groups.ack(self.group, handles)

    async def _requeue(self, handles: list[tuple[int, int]]) -> None:
        await self.host.groups.requeue(self.group, handles)

    # --- link events (the Link's handler) -------------------------------------------------------------------
    def on_acked(self, event: Acked) -> None:
        handles = [t for t in event.tokens if isinstance(t, tuple)]
        refused = [t for t in event.failed if isinstance(t, tuple)]
        if refused:
            self.counters.refused_by_remote += len(refused)
            log.warning("bridge.refused_by_remote", extra={"bridge": self.settings.name, "messages": len(refused)})
        if handles:
            self.counters.acked += len(handles)
            self.host.spawn(self._settle(handles))
        self.host.groups.wake(self.group)  # credit came back

    def on_writable(self) -> None:
        self.host.groups.wake(self.group)

    def on_incoming(self, event: Incoming) -> None:
        self.counters.received += 1
        link = self._link
        topic = None
        for rule in self._in_rules:
            topic = rule.to_local(event.topic)
            if topic is not None:
                break
        host = self.host
        if topic is None or refuse_publish(host.settings, host.authorizer, self._identity, topic) is not None:
            self.counters.denied += 1
            if event.qos and link is not None:
                link.incoming_stored(event.packet_id)  # acknowledged and dropped, as a broker does for its ACL
            return
        now_ms = int(host.clock.time() * 1000)
        expires = now_ms + event.expiry * 1000 if event.expiry is not None else 0
        message = Message(topic, event.payload, event.qos, event.retain, event.properties, now_ms, expires,
                          self.local_id, protocol=PROTOCOL_BRIDGE)
        if event.qos:
            host.publish(message, self._sink, (self._generation, event.packet_id))
        else:
            host.publish(message)
            self.counters.stored += 1

    def on_closed(self, exc: BaseException | None) -> None:
        if exc is not None:
            self.last_error = f"{type(exc).__name__}: {exc}"

    # --- status -----------------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        settings = self.settings
        return {"name": settings.name, "state": str(self.state), "address": self.address,
                "remote_client_id": self.client_id, "connected_since": self.connected_since,
                "last_error": self.last_error, "topics": [r.model_dump() for r in settings.topics],
                "lag_messages": self.lag_messages, "lag_seconds": self.lag_seconds, **self.counters.__dict__}

    async def measure_lag(self, cap: int = 100_000) -> None:
        """Count the messages waiting to go out (from the group's cursor, up to `cap`) and the age in seconds of
        the oldest of them; None when the store cannot say."""
        try:
            self.lag_messages, self.lag_seconds = await self._lag(cap)
        except Exception as exc:
            self.lag_messages = self.lag_seconds = None
            self.last_error = f"lag: {exc}"

    async def _lag(self, cap: int) -> tuple[int, float]:
        if not self._out_rules:
            return 0, 0.0
        store = self.host.store
        cursor, pending = await store.group_position(self.group)
        if cursor < 0:
            return 0, 0.0
        seqs: set[int] = set()
        oldest_ms = 0
        for rule in self._out_rules:
            after = cursor
            while len(seqs) < cap:
                got = await store.read(rule.local_filter, after, 1000)
                fresh = [m for m in got.messages if m.publisher != self.local_id]
                for m in fresh:
                    seqs.add(m.seq)
                    if not oldest_ms or m.timestamp_ms < oldest_ms:
                        oldest_ms = m.timestamp_ms
                if len(got.messages) < 1000:
                    break
                after = got.messages[-1].seq
        count = len(seqs) + pending
        age = max(0.0, self.host.clock.time() - oldest_ms / 1000) if oldest_ms else 0.0
        return count, age


class _DurableAcks:
    """The in side's sink: a remote publish is acknowledged once durable here (if its link is still up)."""

    __slots__ = ("bridge",)

    def __init__(self, bridge: MqttBridge) -> None:
        self.bridge = bridge

    def durable(self, tokens: list[Any]) -> None:
        bridge = self.bridge
        bridge.counters.stored += len(tokens)
        link = bridge._link
        if link is None:
            return  # the remote sends them again on the next link (persistent session): a counted duplicate
        for generation, packet_id in tokens:
            if generation == bridge._generation:
                link.incoming_stored(packet_id)

    def failed(self, tokens: list[Any], reason: str) -> None:
        log.warning("bridge.store_failed", extra={"bridge": self.bridge.settings.name, "messages": len(tokens),
                                                  "reason": reason})

    def pause_publishes(self) -> None:
        link = self.bridge._link
        if link is not None and link.transport is not None:
            link.transport.pause_reading()

    def resume_publishes(self) -> None:
        link = self.bridge._link
        if link is not None and link.transport is not None:
            link.transport.resume_reading()


class _Outbound:
    """The bridge as its group's consumer (gateway.core.consumers.Consumer)."""

    __slots__ = ("bridge",)
    visibility_ms = VISIBILITY_MS

    def __init__(self, bridge: MqttBridge) -> None:
        self.bridge = bridge

    def credit(self) -> int:
        return self.bridge.credit()

    def deliver(self, deliveries: list[Delivery]) -> None:
        self.bridge.deliver(deliveries)

