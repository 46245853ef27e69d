"""A bridge's in side: what the remote sends on the `in` topics is published here through the node's ingress,
checked by the ACL (and the publish hooks, when the node has any) as the bridge's local identity, and acknowledged
to the remote only once it is durable."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from tidewire.bridges.mqtt.events import Incoming
from tidewire.bridges.mqtt.link import Link
from tidewire.bridges.mqtt.settings import BridgeSettings
from tidewire.extensions.authentication import AuthRequest, Identity
from tidewire.extensions.hooks import ClientInfo
from tidewire.gateway.core.ingress import refuse_publish
from tidewire.store.base import PROTOCOL_BRIDGE, Message

if TYPE_CHECKING:
    from tidewire.bridges.host import NodeHost
from tidewire.bridges.mqtt.counters import BridgeCounters

log = logging.getLogger("tidewire.bridge")


class Inbound:
    """The in side of one bridge; the node's `DurableSink` for what it publishes."""

    def __init__(self, settings: BridgeSettings, host: NodeHost, counters: BridgeCounters) -> None:
        self.settings = settings
        self.host = host
        self.counters = counters
        self.local_id = settings.local_client_id
        self.rules = [r for r in settings.topics if r.incoming]
        self.identity = ClientInfo(self.local_id, settings.local_username, "bridge:" + settings.name,
                                   settings.protocol_level)
        self.link: Link | None = None
        self._generation = 0  # which link an acknowledgement belongs to

    def start(self, link: Link) -> None:
        self.link = link
        self._generation += 1

    def stop(self) -> None:
        self.link = None

    async def authenticate(self) -> str | None:
        """Who the bridge is here, for the ACL: `local_username`, proved by `local_password` when the node
        authenticates its clients. None when it may run, else why the node refuses it."""
        settings = self.settings
        if settings.local_username is None:
            return None
        password = settings.local_password.encode() if settings.local_password is not None else None
        result = await self.host.auth.authenticate(AuthRequest(self.local_id, settings.local_username, password,
                                                               "bridge:" + settings.name, "mqtt", "bridge"))
        if not isinstance(result, Identity):
            log.error("bridge.local_auth_failed", extra={"bridge": settings.name, "user": settings.local_username})
            return f"local credentials refused ({result.failure.value})"
        self.identity = ClientInfo(self.local_id, result.username, "bridge:" + settings.name,
                                   settings.protocol_level, result.superuser, result.acl)
        return None

    def received(self, event: Incoming) -> None:
        self.counters.received += 1
        link = self.link
        topic = None
        for rule in self.rules:
            topic = rule.to_local(event.topic)
            if topic is not None:
                break
        host = self.host
        if topic is None or refuse_publish(host.settings, host.authorizer, self.identity, topic) is not None:
            self.counters.denied += 1
            if event.qos and link is not None:
                link.incoming_stored(event.packet_id)  # acknowledged and dropped, as a broker does for its ACL
            return
        now_ms = int(host.clock.time() * 1000)
        expires = now_ms + event.expiry * 1000 if event.expiry is not None else 0
        message = Message(topic, event.payload, event.qos, event.retain, event.properties, now_ms, expires,
                          self.local_id, protocol=PROTOCOL_BRIDGE)
        hooks = host.hooks
        if event.qos:
            if hooks is None:
                host.publish(message, self, (self._generation, event.packet_id))
            else:  # in order behind the earlier ones; `publish_refused` if a hook refuses it
                hooks.submit(self, self.identity, message, self, (self._generation, event.packet_id))
        else:
            if hooks is None:
                host.publish(message)
            else:
                hooks.submit(self, self.identity, message, None, None)
            self.counters.stored += 1

    # --- publish hooks (gateway.core.publish_hooks.Publisher) --------------------------------------------------
    def publish_refused(self, message: Message, token: Any, reason: str) -> None:
        """A publish hook refused it: acknowledged to the remote and dropped, as the ACL's denial is."""
        self.counters.denied += 1
        if token is None:
            self.counters.stored -= 1  # a QoS 0 message is counted as stored when handed over
            return
        generation, packet_id = token
        link = self.link
        if link is not None and generation == self._generation:
            link.incoming_stored(packet_id)

    def hold_publishes(self, held: bool) -> None:
        if held:
            self.pause_publishes()
        else:
            self.resume_publishes()

    # --- DurableSink ------------------------------------------------------------------------------------------
    def durable(self, tokens: list[Any]) -> None:
        self.counters.stored += len(tokens)
        link = self.link
        if link is None:
            return  # the remote sends them again on the next link (persistent session): a counted duplicate
        for generation, packet_id in tokens:
            if generation == self._generation:
                link.incoming_stored(packet_id)

    def failed(self, tokens: list[Any], reason: str) -> None:
        log.warning("bridge.store_failed", extra={"bridge": self.settings.name, "messages": len(tokens),
                                                  "reason": reason})

    def pause_publishes(self) -> None:
        link = self.link
        if link is not None and link.transport is not None:
            link.transport.pause_reading()

    def resume_publishes(self) -> None:
        link = self.link
        if link is not None and link.transport is not None:
            link.transport.resume_reading()
