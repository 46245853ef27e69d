"""A node's part in a cluster of nodes sharing one store: takeover across nodes, dead nodes, lost notifies.

The store is the authority: a session claimed by a node carries that node as owner and a new epoch, which
fences off every earlier owner's writes. The fabric (membership, lookup, notify; `lookup.fabric`) only makes
things fast: it tells the previous owner to close its connection, and it names the one survivor that cleans up
after a node declared dead (marks its clients' sessions offline, publishes their wills). A notify lost with a
node is made up for by re-reading every locally read queue every `resync_interval` seconds. What a dead node
had claimed of a consumer group (AMQP, RocketMQ, `$share`) goes to the other nodes' consumers.

A node whose heartbeats have not reached the store for a member TTL closes its clients (the others may declare it
dead and hand their sessions on); declared dead after all, it joins again as a new member once the store answers.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from tidewire.errors import ClusterError
from tidewire.gateway.core.retry import Backoff, stop_if_cancelled
from tidewire.gateway.core.topology import ClientAction

if TYPE_CHECKING:
    from tidewire.gateway.node import Node

log = logging.getLogger("tidewire.cluster")

KICK_TIMEOUT = 2.0  # s a connecting client waits for its previous node to hear of the takeover


class Fabric(Protocol):
    """What a node needs from `lookup.fabric.ClusterFabric`."""

    @property
    def members(self) -> Mapping[str, str]: ...

    async def kick(self, client_id: str, epoch: int) -> None: ...

    def on_kick(self, callback: Callable[[str, int], None]) -> None: ...

    async def call(self, node_id: str, method: str, payload: Any) -> Any: ...

    def serve(self, method: str, handler: Callable[[str, Any], Any]) -> None: ...

    @property
    def token(self) -> str: ...

    def on_dead(self, callback: Callable[[dict[str, str]], None]) -> None: ...

    def advertise(self, service: str, address: str) -> None: ...

    def advertised(self, service: str) -> dict[str, str]: ...

    def on_beat(self, callback: Callable[[Exception | None], None]) -> None: ...

    def on_expelled(self, callback: Callable[[], None]) -> None: ...

    async def rejoin(self) -> None: ...

    def stats(self) -> dict[str, int]: ...


class ClusterRole:
    """The `gateway.core.topology.Topology` of a node in a cluster."""

    shared = True

    def __init__(self, node: Node, fabric: Fabric, resync_interval: float, member_ttl: float) -> None:
        """`member_ttl`: s without a heartbeat before the others may declare this node dead."""
        self.node = node
        self.fabric = fabric
        self.resync_interval = resync_interval
        self.member_ttl = member_ttl
        self._retry = Backoff("dead-node cleanup", node.clock, node.store_health)
        fabric.on_kick(self._on_kick)
        fabric.on_dead(self._on_dead)
        self._beat_ok_at = node.clock.monotonic()  # the last heartbeat that reached the store
        self._fenced = False  # this outage's clients are closed already
        fabric.on_beat(self._on_beat)
        fabric.on_expelled(self._on_expelled)

    @property
    def members(self) -> Mapping[str, str]:
        return self.fabric.members

    def stats(self) -> dict[str, int]:
        return self.fabric.stats()

    def advertise(self, service: str, address: str) -> None:
        self.fabric.advertise(service, address)

    def advertised(self, service: str) -> Mapping[str, str]:
        return self.fabric.advertised(service)

    def loops(self) -> list[Coroutine[Any, Any, None]]:
        return [self.resync_loop()]

    @property
    def holder(self) -> str:
        return self.fabric.token

    def stale_owner(self, owner: str) -> bool:
        """The node that held a session or will is gone: an earlier process with our id, or not a member."""
        return not owner or owner == self.node.node_id or owner not in self.fabric.members

    async def kick_elsewhere(self, client_id: str, epoch: int) -> None:
        try:
            await asyncio.wait_for(self.fabric.kick(client_id, epoch), KICK_TIMEOUT)
        except (OSError, TimeoutError) as exc:
            # Safe anyway: the epoch fences the old node's writes; its connection ends at its next failed write
            # or when its node hears of the claim.
            log.warning("cluster.kick_failed", extra={"client_id": client_id, "error": str(exc)})

    def answer(self, action: str, handler: ClientAction) -> None:
        async def serve(sender: str, payload: Any) -> int:
            return await handler(str(payload[0]))

        self.fabric.serve("op." + action, serve)

    async def ask_others(self, action: str, client_id: str, first: str | None) -> int | None:
        others = [m for m in self.fabric.members if m != self.node.node_id]
        if not others:
            return None
        if first in others:
            answer = await self._ask(first, action, client_id)
            if answer != 404:
                return answer
            others.remove(first)
        # Not where the lookup said (or it did not know, as for AMQP connections): every other node at once.
        answers = await asyncio.gather(*(self._ask(member, action, client_id) for member in others))
        return next((a for a in answers if a != 404), 404)

    async def _ask(self, member: str, action: str, client_id: str) -> int:
        """`member`'s answer; 404 if it cannot answer (dead, or its admin API is off so it serves no action)."""
        try:
            return int(await self.fabric.call(member, "op." + action, [client_id]))
        except (ClusterError, OSError, TimeoutError, TypeError, ValueError) as exc:
            log.warning("cluster.action_unanswered", extra={"node": member, "action": action, "error": str(exc)})
            return 404

    def _on_kick(self, client_id: str, epoch: int) -> None:
        node = self.node
        conn = node.connections.get(client_id)
        if conn is None or conn.session is None or conn.session.record.epoch >= epoch:
            return
        log.info("client.takeover_remote", extra={"client_id": client_id})
        session = conn.take_over()  # 5.0: DISCONNECT 0x8E
        node.wills.cancel(client_id)
        if session is not None:
            node.subscriptions.forget(session.record)  # its new node holds it now

    def _on_beat(self, error: Exception | None) -> None:
        node = self.node
        node.store_health.report("cluster heartbeat", error)
        now = node.clock.monotonic()
        if error is None:
            self._beat_ok_at = now
            self._fenced = False
        elif not self._fenced and now - self._beat_ok_at >= self.member_ttl:
            self._fenced = True
            self.fence(f"no heartbeat reached the store for {now - self._beat_ok_at:.1f} s")

    def fence(self, detail: str) -> None:
        """The others may declare this node dead now (a member TTL without a heartbeat) and hand its clients'
        sessions to other nodes: close every client here (MQTT 5: DISCONNECT 0x9C), so that none is served by two
        nodes at once and each reconnects where the store is reachable. Their wills are the survivors' to publish."""
        node = self.node
        conns = list(node.connections.values())
        log.error("cluster.fenced", extra={"reason": detail, "clients": len(conns)})
        for conn in conns:
            session = conn.fence("this node lost its store")
            if session is not None:
                node.subscriptions.forget(session.record)  # its next node holds it

    def _on_expelled(self) -> None:
        """The others declared this node dead (the store was out of reach, or the node stalled, for a member TTL):
        its clients may be served elsewhere and its session writes are fenced off by their epochs. Close what is
        left here and join again as a new member, as soon as the store answers."""
        log.error("cluster.expelled")
        if not self._fenced:
            self._fenced = True
            self.fence("the other nodes declared this one dead")
        self.node.spawn(self._rejoin())

    async def _rejoin(self) -> None:
        retry = Backoff("cluster rejoin", self.node.clock, self.node.store_health)
        while True:
            try:
                await self.fabric.rejoin()
                # A new membership token: the survivor that declared this process dead released what it held
                # under the old one, so whatever is still held here is held again under the new.
                await self.node.subscriptions.wildcards.hold_again()
                break
            except OSError as exc:
                stop_if_cancelled()
                await asyncio.sleep(retry.failed(exc))
        retry.succeeded()
        self._beat_ok_at = self.node.clock.monotonic()
        self._fenced = False
        log.warning("cluster.rejoined", extra={"node": self.node.node_id})

    def _on_dead(self, dead: dict[str, str]) -> None:
        self.node.spawn(self._clean_up_after(dead))

    async def _clean_up_after(self, dead: dict[str, str]) -> None:
        """This node is the one survivor that saw `dead` (node id -> its process's token) leave: their clients
        are offline from now on, and what they held is released."""
        log.warning("cluster.nodes_dead", extra={"nodes": ",".join(sorted(dead))})
        while True:
            try:
                await self._take_over_dead(dead)
                break
            except OSError as exc:
                stop_if_cancelled()
                await asyncio.sleep(self._retry.failed(exc))
        self._retry.succeeded()

    async def _take_over_dead(self, dead: dict[str, str]) -> None:
        gone = set(dead)
        node = self.node
        store = node.store
        now = int(node.clock.time() * 1000)
        for client_id in await store.online_sessions():
            record = await store.get_session(client_id)
            if record is not None and record.owner in gone and record.disconnected_at_ms == 0:
                record.disconnected_at_ms = now
                await store.put_session(record)  # fenced: not if the client was claimed meanwhile
        for will in await store.list_wills():
            if will.owner in gone:
                await store.delete_will(will.client_id)
                node.publish(will.message)
        for owner, token in dead.items():  # what their consumers (AMQP, RocketMQ, $share) held goes to the others
            await node.groups.owner_gone(owner, token)
        # Their wildcard holds would keep their filters indexed forever. Sessions they parked (before this node
        # started, so not counted here) may still need them: this node holds every stored session's filters
        # first, then the dead processes' holds go.
        await node.subscriptions.wildcards.hold_stored(await store.subscription_filters())
        for token in dead.values():
            if token:
                await store.release_wildcards(token)

    def gauges(self) -> dict[str, int]:
        """The fabric's counters for `$SYS/brokers/<node>/stats/...`."""
        stats = self.fabric.stats()
        names = {"frames_sent": "notify/frames_sent", "notify_broadcasts": "notify/broadcasts",
                 "notify_broadcast_msgs": "notify/broadcast_msgs", "frames_received": "cluster/frames_received",
                 "notify_route_msgs": "notify/route_msgs", "notify_event_msgs": "notify/event_msgs",
                 "notify_direct_msgs": "notify/direct_msgs", "notify_catchup_msgs": "notify/catchup_msgs",
                 "notify_lease_msgs": "notify/lease_msgs", "notify_update_msgs": "notify/update_msgs",
                 "notify_leases_held": "notify/leases_held", "notify_leases_granted": "notify/leases_granted",
                 "notify_merged": "notify/merged", "casts_dropped": "cluster/casts_dropped"}
        out = {name: stats[key] for key, name in names.items() if key in stats}
        out["cluster/members"] = len(self.fabric.members)
        return out

    async def resync_loop(self) -> None:
        """Lost notifies delay but never lose: every locally read queue is refreshed now and then."""
        while True:
            await asyncio.sleep(self.resync_interval)
            queues = set(self.node.subscriptions.readers)
            if queues:
                self.node.notified(queues)
