"""SUBSCRIBE and UNSUBSCRIBE of one MQTT connection, sans-IO (a base of `MqttChannel`, under it `Handshake`):
the filters as the client wrote them rewritten (`topic_rewrite`), their `$exclusive/` locks taken from the store
before anything the client sends next, mounted under the client's tenant, registered, and SUBACKs sent in the
order of their SUBSCRIBEs once the store holds what each one acknowledges."""

from __future__ import annotations

import logging
from collections import deque
from typing import TYPE_CHECKING, Any

from tidewire.gateway.core.subscriptions import Refusal
from tidewire.gateway.core.tenants import mount_filter
from tidewire.gateway.protocols.mqtt.codec import (
    PropertyId,
    ReasonCode,
    Suback,
    Subscribe,
    SubscriptionRequest,
    Unsuback,
    Unsubscribe,
)
from tidewire.gateway.protocols.mqtt.conveniences import Filters, subscribe_filters, unsubscribe_filters
from tidewire.gateway.protocols.mqtt.handshake import Handshake, mount_requests
from tidewire.gateway.protocols.mqtt.lifecycle import CONNECTED, HOLD_SUBSCRIBE, ChannelIo
from tidewire.gateway.sessions.session import Session

if TYPE_CHECKING:
    from tidewire.gateway.core.clock import Clock
    from tidewire.gateway.node import Node
    from tidewire.gateway.transport.listeners import Listener

log = logging.getLogger("tidewire.conn")

# How MQTT 5 answers a refused subscription (3.1.1 has one code for them all, 0x80).
SUBACK_REFUSALS: dict[Refusal, int] = {
    Refusal.FILTER_INVALID: ReasonCode.TOPIC_FILTER_INVALID,
    Refusal.QUOTA_EXCEEDED: ReasonCode.QUOTA_EXCEEDED,
    Refusal.NOT_AUTHORIZED: ReasonCode.NOT_AUTHORIZED,
}


def suback_codes(granted: list[int | Refusal], level: int) -> list[int]:
    """The SUBACK codes of `SubscriptionRegistry.subscribe`'s answers: each granted QoS, or its refusal's code."""
    if level >= 5:
        return [SUBACK_REFUSALS[g] if isinstance(g, Refusal) else g for g in granted]
    return [0x80 if isinstance(g, Refusal) else g for g in granted]


def bridge_requests(requests: list[SubscriptionRequest]) -> list[SubscriptionRequest]:
    """A 3.1/3.1.1 bridge's subscriptions as Mosquitto takes them: no-local (what the bridge publishes never comes
    back to it: no loop) and retain-as-published (retained messages stay retained on the other broker). No-local
    stays off a shared subscription, where MQTT 5 forbids it."""
    return [SubscriptionRequest(r.topic_filter, r.qos, not r.topic_filter.startswith("$share/"), True)
            for r in requests]


def unsuback_codes(removed: list[bool]) -> list[int]:
    """The UNSUBACK codes of `SubscriptionRegistry.unsubscribe`'s answers."""
    return [ReasonCode.SUCCESS if was else ReasonCode.NO_SUBSCRIPTION_EXISTED for was in removed]


class _PendingSuback:
    """A SUBACK owed in order: sent once it is `ready` and every earlier one was sent."""

    __slots__ = ("ready", "retained", "session", "suback")

    def __init__(self, suback: Suback, session: Session, retained: list[tuple[str, int, int]]) -> None:
        self.suback = suback
        self.session = session
        self.retained = retained
        self.ready = False


class Subscribing(Handshake):
    __slots__ = ("_subacks",)

    def __init__(self, node: Node, listener: Listener, io: ChannelIo, peer: str, clock: Clock) -> None:
        self._subacks: deque[_PendingSuback] | None = None  # SUBACKs waiting for the store, sent in order
        super().__init__(node, listener, io, peer, clock)

    def _dispatch(self, packets: list[Any]) -> None:
        """Handle packets read (MqttChannel): what waited behind a SUBSCRIBE resumes through it."""
        raise NotImplementedError

    def resume_writing(self) -> None:
        """The connection can take more (MqttChannel): deliveries resume once no SUBACK is owed."""
        raise NotImplementedError

    def _on_subscribe(self, packet: Subscribe) -> None:
        session = self.session
        assert session is not None
        node = self.node
        if any(s.no_local and s.topic_filter.startswith("$share/") for s in packet.subscriptions):
            return self.abort(ReasonCode.PROTOCOL_ERROR, "no local on a shared subscription")
        requests = packet.subscriptions
        if self.bridge and self.level < 5:  # an MQTT 5 bridge sets these options itself
            requests = bridge_requests(requests)
        refused: dict[int, Refusal] = {}
        if node.rewriter.active or any(r.topic_filter[:1] == "$" for r in requests):
            filters = subscribe_filters(node, self.info, requests)
            requests, refused = filters.requests, filters.refused
            if filters.exclusive:  # their locks first, from the store: what the client sends next waits
                self._hold(HOLD_SUBSCRIBE)
                node.spawn(self._subscribe_exclusive(packet, filters))
                return None
        self._subscribe(packet, requests, refused)
        return None

    def _mounted(self, topic_filter: str) -> str:
        return mount_filter(self.mount, topic_filter) if self.mount else topic_filter

    async def _subscribe_exclusive(self, packet: Subscribe, filters: Filters) -> None:
        """`$exclusive/` filters: each one whose lock another client holds is refused (0x97, as EMQX)."""
        node = self.node
        names = [self._mounted(filters.requests[i].topic_filter) for i in filters.exclusive]
        try:
            got = await node.exclusive.claim(self.client_id, names)
        except Exception as exc:
            log.warning("exclusive.claim_failed", extra={"client_id": self.client_id, "error": str(exc)})
            got = [False] * len(names)
        if self._state != CONNECTED or self.session is None:
            node.exclusive.release(self.client_id, [n for n, ok in zip(names, got, strict=True) if ok])
            return
        lost = {i for i, ok in zip(filters.exclusive, got, strict=True) if not ok}
        refused = dict(filters.refused)
        requests: list[SubscriptionRequest] = []
        for i, request in enumerate(filters.requests):
            if i in lost:
                refused[filters.positions[i]] = Refusal.QUOTA_EXCEEDED
            else:
                requests.append(request)
        granted = self._subscribe(packet, requests, refused)
        denied = [self._mounted(r.topic_filter) for r, g in zip(requests, granted, strict=True)
                  if isinstance(g, Refusal)]
        node.exclusive.release(self.client_id, denied)  # held for a subscription the ACL refused
        self._release(HOLD_SUBSCRIBE)
        backlog, self._backlog = self._backlog, None
        if backlog:
            self._dispatch(backlog)

    def _subscribe(self, packet: Subscribe, requests: list[SubscriptionRequest],
                   refused: dict[int, Refusal]) -> list[int | Refusal]:
        """Subscribe `requests` (the packet's filters but the `refused` ones, by index) and answer; returns what
        the registry granted each of `requests`."""
        session = self.session
        assert session is not None
        node = self.node
        ids = packet.properties.get(PropertyId.SUBSCRIPTION_IDENTIFIER) if packet.properties else None
        if self.mount:  # the lock names above and the registry below see the tenant's mounted filters
            requests = mount_requests(self.mount, requests)
        granted, retained, registering = node.subscribe(session, self, requests, ids[0] if ids else 0)
        answered = granted
        if refused:
            answered = list(granted)
            for index in sorted(refused):
                answered.insert(index, refused[index])
        log.info("client.subscribed", extra={"client_id": self.client_id,
                                             "filters": ",".join(s.topic_filter for s in packet.subscriptions)})
        if session.persistent:
            node.writes.save_session(session.snapshot())
        # SUBACK waits for what it acknowledges to be in the store: a new wildcard in the store's set (what is
        # published after it, on any node, is then indexed into the subscription's queue), a new `$share` group
        # (what is published after it is the group's) and, in a cluster, a persistent session's record (a
        # takeover by another node reads it from there). SUBACKs keep their order.
        saved = session.persistent and node.topology.shared
        suback = Suback(packet.packet_id, suback_codes(answered, session.level))
        if registering or saved or self._subacks is not None:
            # Deliveries wait too: a client sees the SUBACK before anything of the new subscription.
            self.paused = True
            pending = _PendingSuback(suback, session, retained)
            if self._subacks is None:
                self._subacks = deque()
            self._subacks.append(pending)
            node.spawn(self._settle_suback(pending, registering, saved))
            return granted
        self._send(suback)
        if retained:
            node.spawn(node.send_retained(session, retained))
        return granted

    async def _settle_suback(self, pending: _PendingSuback, registering: list[str], saved: bool) -> None:
        await self.node.subscriptions.wildcards_registered(registering)
        if saved:
            await self.node.writes.session_settled(pending.session.client_id)
        pending.ready = True
        self._send_ready_subacks()

    def _send_ready_subacks(self) -> None:
        subacks = self._subacks
        while subacks and subacks[0].ready:
            pending = subacks.popleft()
            if self.session is not pending.session:
                continue
            self._send(pending.suback)
            if pending.retained:
                self.node.spawn(self.node.send_retained(pending.session, pending.retained))
        if not subacks:
            self._subacks = None
            if not self._socket_full:
                self.resume_writing()

    def _on_unsubscribe(self, packet: Unsubscribe) -> None:
        session = self.session
        assert session is not None
        filters = packet.topic_filters
        if self.node.rewriter.active or any(f[:1] == "$" for f in filters):
            filters, exclusive = unsubscribe_filters(self.node, self.info, filters)
            self.node.exclusive.release(self.client_id, [self._mounted(f) for f in exclusive])
        removed = self.node.unsubscribe(session, [mount_filter(self.mount, f) for f in filters] if self.mount
                                        else filters)
        self._send(Unsuback(packet.packet_id, unsuback_codes(removed)))
        if session.persistent:
            self.node.writes.save_session(session.snapshot())
