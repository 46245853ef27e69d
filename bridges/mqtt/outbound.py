"""A bridge's out side: the consumer of its group `bridge/<name>`, whose filters are the `out` topics' local
filters. What a link has credit for is claimed, mapped to the remote topic and published; a claim is settled
after the remote's acknowledgement (PUBACK, PUBCOMP; at once for QoS 0). What the client core still holds
unacknowledged when the bridge stops here goes back to the group, so the next holder sends it again."""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING

from tidewire.bridges.mqtt.client import ClientCore
from tidewire.bridges.mqtt.events import Acked, PacketTooLarge
from tidewire.bridges.mqtt.link import Link, LinkClosed
from tidewire.bridges.mqtt.settings import BridgeSettings, TopicRule
from tidewire.gateway.core.group_reader import Delivery
from tidewire.gateway.core.topics import matches
from tidewire.store.base import GroupRecord, Message

if TYPE_CHECKING:
    from tidewire.bridges.host import NodeHost
from tidewire.bridges.mqtt.counters import BridgeCounters

log = logging.getLogger("tidewire.bridge")

GROUP_PREFIX = "bridge/"
VISIBILITY_MS = 600_000  # a claim in flight stays ours this long; a restart or a takeover releases it sooner
LAG_READ = 1000  # messages per read when the lag is counted


class Outbound:
    """The out side of one bridge (a `gateway.core.group_reader.Consumer` of its group)."""

    visibility_ms = VISIBILITY_MS

    def __init__(self, settings: BridgeSettings, host: NodeHost, counters: BridgeCounters) -> None:
        self.settings = settings
        self.host = host
        self.counters = counters
        self.group = GROUP_PREFIX + settings.name
        self.local_id = settings.local_client_id
        self.rules: list[TopicRule] = [r for r in settings.topics if r.outgoing]
        self.link: Link | None = None  # the link messages go out on now
        self.last_error = ""

    async def declare(self) -> None:
        """The group, with the rules' filters (a changed configuration keeps the group's position)."""
        if not self.rules:
            return
        groups = self.host.groups
        filters = sorted({r.local_filter for r in self.rules})
        record, created = await groups.declare(GroupRecord(self.group, filters,
                                                           attrs={"bridge": self.settings.name}))
        if not created and record.filters != filters:
            await groups.set_filters(record, filters)
        groups.matcher(self.group, self.wanted)

    def start(self, link: Link) -> None:
        self.link = link
        if self.rules:
            self.host.groups.consume(self.group, self)

    def stop(self) -> None:
        self.link = None
        if self.rules:
            self.host.groups.cancel(self.group, self)

    def wanted(self, message: Message) -> bool:
        """What the group passes over: what came in over this very bridge."""
        return message.publisher != self.local_id

    def _remote_topic(self, topic: str) -> tuple[int, str] | None:
        """(QoS, remote topic) of a local message: mapped in Mosquitto's order, at the highest QoS of the out rules
        taking it (each is a subscription of the bridge's, and overlapping subscriptions deliver at the highest)."""
        remote = self.settings.remote_topic(topic)
        if remote is None:
            return None
        return max(r.qos for r in self.rules if matches(r.local_filter, topic)), remote

    # --- Consumer ---------------------------------------------------------------------------------------------
    def credit(self) -> int:
        link = self.link
        return link.credit() if link is not None else 0

    def deliver(self, deliveries: list[Delivery]) -> None:
        link = self.link
        settled: list[tuple[int, int]] = []
        back: list[tuple[int, int]] = []
        now_ms = int(self.host.clock.time() * 1000)
        for message, claim in deliveries:
            handle = (claim.seq, claim.token)
            out = self._remote_topic(message.topic)
            if out is None:  # a filter the rules no longer have
                settled.append(handle)
                continue
            if link is None or link.closed or back:  # the link went while the claim was made: send it next time
                back.append(handle)
                continue
            rule_qos, remote_topic = out
            qos = link.core.qos_for(min(message.qos, rule_qos))  # the server's Maximum QoS may cap it
            retain = message.retain and self.settings.bridge_outgoing_retain
            # What is left of its life goes with it (the group passes over the expired).
            left = max(1, (message.expires_at_ms - now_ms + 999) // 1000) if message.expires_at_ms else None
            try:
                link.publish(remote_topic, message.payload, qos, retain, handle if qos else None, message.properties,
                             left)
            except PacketTooLarge as exc:  # over the remote's Maximum Packet Size: dropped, as Mosquitto does
                self.counters.refused_by_remote += 1
                self.last_error = str(exc)
                settled.append(handle)
                continue
            except LinkClosed:
                back.append(handle)
                continue
            self.counters.sent += 1
            if claim.deliveries > 1:
                self.counters.redelivered += 1
            if not qos:
                settled.append(handle)
        if settled:
            self.counters.acked += len(settled)
            self.host.spawn(self._settle(settled))
        if back:
            self.host.spawn(self._requeue(back))

    def acked(self, event: Acked) -> None:
        handles = [t for t in event.tokens if isinstance(t, tuple)]
        refused = [t for t in event.failed if isinstance(t, tuple)]
        if refused:
            self.counters.refused_by_remote += len(refused)
            log.warning("bridge.refused_by_remote", extra={"bridge": self.settings.name, "messages": len(refused)})
        if handles:
            self.counters.acked += len(handles)
            self.host.spawn(self._settle(handles))
        self.wake()  # credit came back

    def wake(self) -> None:
        if self.rules:
            self.host.groups.wake(self.group)

    async def _settle(self, handles: list[tuple[int, int]]) -> None:
        await self.host.groups.ack(self.group, handles)

    async def _requeue(self, handles: list[tuple[int, int]]) -> None:
        await self.host.groups.requeue(self.group, handles)

    async def give_back(self, core: ClientCore) -> None:
        """The bridge stops here: what it claimed and the remote has not acknowledged is visible again now."""
        handles = [token for token in core.unacked() if isinstance(token, tuple)]
        if handles and self.rules:
            with contextlib.suppress(Exception):  # else the claims lapse, or a restart releases them
                await self.host.groups.requeue(self.group, handles)

    async def lag(self, cap: int) -> tuple[int, float]:
        """(messages waiting to go out, counted from the group's cursor up to `cap`; the age in seconds of the
        oldest of them)."""
        if not self.rules:
            return 0, 0.0
        store = self.host.store
        cursor, pending = await store.group_position(self.group)
        if cursor < 0:
            return 0, 0.0
        seqs: set[int] = set()
        oldest_ms = 0
        for rule in self.rules:
            after = cursor
            while len(seqs) < cap:
                got = await store.read(rule.local_filter, after, LAG_READ)
                for m in got.messages:
                    if self.wanted(m):
                        seqs.add(m.seq)
                        if not oldest_ms or m.timestamp_ms < oldest_ms:
                            oldest_ms = m.timestamp_ms
                if len(got.messages) < LAG_READ:
                    break
                after = got.messages[-1].seq
        age = max(0.0, self.host.clock.time() - oldest_ms / 1000) if oldest_ms else 0.0
        return len(seqs) + pending, age
