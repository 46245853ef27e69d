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
from enum import StrEnum
from typing import Any

from tidewire.bridges.host import NodeHost
from tidewire.bridges.mqtt.client import ClientCore, ClientOptions
from tidewire.bridges.mqtt.counters import BridgeCounters
from tidewire.bridges.mqtt.events import Acked, Incoming
from tidewire.bridges.mqtt.inbound import Inbound
from tidewire.bridges.mqtt.link import ConnectRefused, Link, client_tls_context
from tidewire.bridges.mqtt.outbound import Outbound
from tidewire.bridges.mqtt.settings import BridgeSettings
from tidewire.gateway.protocols.mqtt.codec import Will
from tidewire.store.base import PROTOCOL_BRIDGE, Message

log = logging.getLogger("tidewire.bridge")

CONNECT_TIMEOUT_S = 10.0


class BridgeState(StrEnum):
    STANDBY = "standby"  # another node holds the bridge
    CONNECTING = "connecting"
    CONNECTED = "connected"
    WAITING = "waiting"  # the link failed: connecting again after the restart delay
    STOPPED = "stopped"  # stopped, or start_type once and the link ended


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


class MqttBridge:
    """One configured bridge. `run()` until `stop()`; `status()` for $SYS, metrics, the API and `tidewire ctl`."""

    def __init__(self, settings: BridgeSettings, host: NodeHost, *, hostname: str,
                 rng: random.Random | None = None) -> None:
        settings = settings.resolved(hostname)  # the client ids and state topic as this host names them
        self.settings = settings
        self.host = host
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
        self.outbound = Outbound(settings, host, self.counters)
        self.inbound = Inbound(settings, host, self.counters)
        self._core: ClientCore | None = None
        self._link: Link | None = None
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
        await self.outbound.declare()
        refused = await self.inbound.authenticate()
        if refused is not None:
            self.last_error = refused
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
        self.inbound.start(link)
        self.counters.connects += 1
        self.connected_since = self.host.clock.time()
        self.state = BridgeState.CONNECTED
        self._restart.reset()
        log.info("bridge.connected", extra={"bridge": self.settings.name, "address": self.address,
                                             "client_id": self.client_id})
        try:
            self._notify_state(True)
            await self._subscribe(link)
            self.outbound.start(link)
            await link.wait_closed()
        except Exception as exc:
            self.last_error = f"{type(exc).__name__}: {exc}"
        finally:
            self.outbound.stop()
            self.inbound.stop()
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
        incoming = self.inbound.rules
        if incoming:
            granted = await link.subscribe([(r.remote_filter, r.qos, True, True) for r in incoming])
            for rule, code in zip(incoming, granted, strict=True):
                if code >= 0x80:
                    log.warning("bridge.subscribe_refused", extra={"bridge": settings.name,
                                                                   "filter": rule.remote_filter, "code": code})
        if settings.bridge_attempt_unsubscribe:
            # A persistent remote session may still hold an `in` subscription of an earlier configuration.
            out_only = [r.remote_filter for r in self.outbound.rules if not r.incoming]
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

    async def _give_back(self) -> None:
        core, self._core = self._core, None
        if core is not None:
            await self.outbound.give_back(core)

    # --- link events (the Link's handler) -------------------------------------------------------------------
    def on_acked(self, event: Acked) -> None:
        self.outbound.acked(event)

    def on_writable(self) -> None:
        self.outbound.wake()

    def on_incoming(self, event: Incoming) -> None:
        self.inbound.received(event)

    def on_closed(self, exc: BaseException | None) -> None:
        if exc is not None:
            self.last_error = f"{type(exc).__name__}: {exc}"

    # --- status -----------------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        settings = self.settings
        return {"name": settings.name, "state": str(self.state), "address": self.address,
                "remote_client_id": self.client_id, "connected_since": self.connected_since,
                "last_error": self.last_error or self.outbound.last_error,
                "topics": [r.model_dump() for r in settings.topics],
                "lag_messages": self.lag_messages, "lag_seconds": self.lag_seconds, **self.counters.__dict__}

    async def measure_lag(self, cap: int = 100_000) -> None:
        """Count the messages waiting to go out (from the group's cursor, up to `cap`) and the age in seconds of
        the oldest of them; None when the store cannot say."""
        try:
            self.lag_messages, self.lag_seconds = await self.outbound.lag(cap)
        except Exception as exc:
            self.lag_messages = self.lag_seconds = None
            self.last_error = f"lag: {exc}"
