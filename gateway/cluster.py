"""A node's part in a cluster of nodes sharing one store: takeover across nodes, dead nodes, lost notifies.

The store is the authority: a session claimed by a node carries that node as owner and a new epoch, which
fences off every earlier owner's writes. The fabric (membership, lookup, notify; `lookup.fabric`) only makes
things fast: it tells the previous owner to close its connection, and it names the one survivor that cleans up
after a node declared dead (marks its clients' sessions offline, publishes their wills). A notify lost with a
node is made up for by re-reading every locally read queue every `resync_interval` seconds. What a dead node
had claimed of a consumer group (AMQP, RocketMQ, `$share`) goes to the other nodes' consumers.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from tidewire.gateway.core.retry import Backoff, stop_if_cancelled

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

    def on_dead(self, callback: Callable[[list[str]], None]) -> None: ...

    def stats(self) -> dict[str, int]: ...


class ClusterRole:
    """The `gateway.core.topology.Topology` of a node in a cluster."""

    shared = True

    def __init__(self, node: Node, fabric: Fabric, resync_interval: float) -> None:
        self.node = node
        self.fabric = fabric
        self.resync_interval = resync_interval
        self._retry = Backoff("dead-node cleanup", node.clock)
        fabric.on_kick(self._on_kick)
        fabric.on_dead(self._on_dead)

    @property
    def members(self) -> Mapping[str, str]:
        return self.fabric.members

    def stats(self) -> dict[str, int]:
        return self.fabric.stats()

    def loops(self) -> list[Coroutine[Any, Any, None]]:
        return [self.resync_loop()]

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

    def _on_dead(self, dead: list[str]) -> None:
        self.node.spawn(self._clean_up_after(dead))

    async def _clean_up_after(self, dead: list[str]) -> None:
        """This node is the one survivor that saw `dead` leave: their clients are offline from now on."""
        gone = set(dead)
        log.warning("cluster.nodes_dead", extra={"nodes": ",".join(sorted(gone))})
        while True:
            try:
                await self._take_over_dead(gone)
                break
            except OSError as exc:
                stop_if_cancelled()
                await asyncio.sleep(self._retry.failed(exc))
        self._retry.succeeded()

    async def _take_over_dead(self, gone: set[str]) -> None:
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
        for owner in gone:  # what their consumers (AMQP, RocketMQ, $share) held unacked goes to the others
            await node.groups.owner_gone(owner)

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
