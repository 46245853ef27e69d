"""Notify across nodes: merged queue names go to the interested nodes, through their slot owners or directly.

A publishing node merges the names notified within `merge_delay` (≤ 1 ms, or one tick). A name whose slot
owner's answer it holds on lease (`notify.leases`) goes straight to the nodes with readers, one hop; the rest
are grouped by the owner of each name's slot, one message per owner, and the owner casts one merged message per
interested node (a `p2p#<client>` queue: where the client is connected) and leases its answers back to the
publisher. A node's own appends come back to it at once from `notify_from` (it dispatches them in the tick of
the append) and only the other interested nodes are told; names from `notify` reach the local handler
directly, never over TCP. Whenever an answer is missing (no
table yet, the slot unknown or resyncing, an epoch mismatch, the owner unreachable or a cast lost) that batch is
broadcast to every member instead. Names routed to an owner within the last `RESEND_WINDOW` are broadcast
again when the connection to it breaks (a killed owner drops what it had not read yet). Any other lost event
only delays a message: sessions re-read their queue heads.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections import deque
from collections.abc import Iterable
from typing import Any

from tidewire.lookup.rpc import RpcNode
from tidewire.lookup.sharded import ShardedLookup
from tidewire.lookup.slots import route_key
from tidewire.notify.base import NotifyCounts, NotifyHandler
from tidewire.notify.leases import DEFAULT_LEASE, Clock, GrantedLeases, HeldLeases

DEFAULT_MERGE_DELAY = 0.001  # seconds names are merged before routing; 0 = until the end of this tick
RESEND_WINDOW = 1.0  # seconds: names routed to an owner this recently are broadcast if its connection breaks
RESEND_MAX = 1000  # batches remembered per owner for that


class ClusterNotifier:
    """The `Notifier` of a cluster node."""

    def __init__(self, node_id: str, rpc: RpcNode, lookup: ShardedLookup, *,
                 merge_delay: float = DEFAULT_MERGE_DELAY, lease: float = DEFAULT_LEASE,
                 clock: Clock = time.monotonic) -> None:
        self.node_id = node_id
        self.rpc = rpc
        self.lookup = lookup
        self.merge_delay = merge_delay
        self.lease = lease  # seconds; 0: every name goes through its owner (two hops)
        self.clock = clock
        self._held = HeldLeases(clock)
        self._granted = GrantedLeases(clock, lease)
        self._sweep_handle: asyncio.TimerHandle | None = None
        self.always_broadcast = False  # benchmarks: what targeting saves
        self._handler: NotifyHandler | None = None
        self._pending: set[str] = set()
        self._own: set[str] = set()  # of those, names only this node's appends brought: it is not told of them
        self._flush_handle: asyncio.Handle | None = None
        self._incoming: set[str] = set()
        self._deliver_scheduled = False
        self.counters = {"notify_names": 0, "notify_merged": 0, "notify_route_msgs": 0, "notify_event_msgs": 0,
                         "notify_broadcasts": 0, "notify_broadcast_msgs": 0, "notify_local_events": 0,
                         "notify_unknown": 0, "notify_direct_msgs": 0, "notify_lease_msgs": 0,
                         "notify_update_msgs": 0, "notify_void_msgs": 0, "notify_catchup_msgs": 0}
        self._recent: dict[str, deque[tuple[float, list[str]]]] = {}
        rpc.handle("nt.route", self._on_route)
        rpc.handle("nt.ev", self._on_event)
        rpc.handle("nt.lease", self._on_lease)
        rpc.handle("nt.upd", self._on_update)
        rpc.handle("nt.void", self._on_void)
        rpc.on_peer_down(self._on_peer_down)
        lookup.on_answers_changed = self._answers_changed
        lookup.on_answers_void = self._answers_void

    def register(self, node_id: str, handler: NotifyHandler) -> None:
        """Only this node's handler can be registered here; other nodes register in their own process."""
        if node_id == self.node_id:
            self._handler = handler

    def notify(self, queues: Iterable[str]) -> None:
        own = self._own
        for queue in queues:
            own.discard(queue)  # news from elsewhere too: this node is told as well
            self._add(queue)
        self._schedule()

    def notify_from(self, node_id: str, queues: set[str]) -> set[str]:
        """This node's own appends: it gets every name back to dispatch at once (filtering by its readers), and the
        other interested nodes are told as by `notify`."""
        if node_id != self.node_id:
            self.notify(queues)
            return set()
        pending, own = self._pending, self._own
        for queue in queues:
            if queue not in pending:
                own.add(queue)
            self._add(queue)
        self._schedule()
        self.counters["notify_local_events"] += 1
        return queues

    def _add(self, queue: str) -> None:
        self.counters["notify_names"] += 1
        if queue in self._pending:
            self.counters["notify_merged"] += 1
        else:
            self._pending.add(queue)

    def _schedule(self) -> None:
        if self._pending and self._flush_handle is None:
            loop = asyncio.get_running_loop()
            self._flush_handle = (loop.call_later(self.merge_delay, self._flush) if self.merge_delay > 0
                                  else loop.call_soon(self._flush))

    def close(self) -> None:
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        if self._sweep_handle is not None:
            self._sweep_handle.cancel()
            self._sweep_handle = None

    def stats(self) -> dict[str, int]:
        return {**self.counters, "notify_leases_held": len(self._held), "notify_leases_granted": len(self._granted)}

    @property
    def counts(self) -> NotifyCounts:
        """The metrics' view: events sent (frames to peers and local handler calls), merged names, broadcasts and
        names the lookup could not place."""
        c = self.counters
        return NotifyCounts(c["notify_route_msgs"] + c["notify_event_msgs"] + c["notify_broadcast_msgs"]
                            + c["notify_direct_msgs"] + c["notify_catchup_msgs"] + c["notify_local_events"],
                            c["notify_merged"], c["notify_broadcasts"], c["notify_unknown"])

    # --- publisher side ------------------------------------------------------------------------------------
    def _flush(self) -> None:
        self._flush_handle = None
        pending, self._pending = self._pending, set()
        own, self._own = self._own, set()
        if own:
            pending -= own
            self._send(own, tell_self=False)
        if pending:
            self._send(pending, tell_self=True)

    def _send(self, pending: set[str], *, tell_self: bool) -> None:
        table = self.lookup.table
        if table is None or self.always_broadcast:
            if table is None:
                self.counters["notify_unknown"] += len(pending)
            self._broadcast(pending, tell_self)
            return
        leased = self.lease > 0
        per_owner: dict[str, set[str]] = {}
        direct: dict[str, set[str]] = {}
        for queue in pending:
            nodes = self._held.nodes(queue, table.epoch) if leased else None
            if nodes is not None:
                for node in nodes:
                    if tell_self or node != self.node_id:
                        direct.setdefault(node, set()).add(queue)
                continue
            owner = table.owner_of(route_key(queue))
            if owner is None:
                self.counters["notify_unknown"] += 1
                self._broadcast({queue}, tell_self)
            else:
                per_owner.setdefault(owner, set()).add(queue)
        if direct:
            self._tell(direct, "notify_direct_msgs")
        for owner, queues in per_owner.items():
            if owner == self.node_id:
                self._route(queues, table.epoch, None, None if tell_self else self.node_id)
                continue
            self.counters["notify_route_msgs"] += 1
            names = sorted(queues)
            if not self.rpc.cast(owner, "nt.route", [table.epoch, names, int(leased), int(not tell_self)],
                                 on_lost=functools.partial(self._broadcast, queues, tell_self)):
                self._broadcast(queues, tell_self)
                continue
            now = self.clock()
            recent = self._recent.get(owner)
            if recent is None:
                recent = self._recent[owner] = deque(maxlen=RESEND_MAX)
            while recent and recent[0][0] < now - RESEND_WINDOW:
                recent.popleft()
            recent.append((now, names))

    def _tell(self, per_node: dict[str, set[str]], counter: str) -> None:
        """Events straight to the nodes named by a leased answer; one this node cannot reach now is broadcast."""
        for node, names in per_node.items():
            if node == self.node_id:
                self._local(names)
                continue
            self.counters[counter] += 1
            if not self.rpc.cast(node, "nt.ev", sorted(names)):  # lost later: its periodic re-read covers it
                self._broadcast(names, False)

    def _on_lease(self, sender: str, payload: Any) -> None:
        table = self.lookup.table
        try:
            epoch, duration = int(payload[0]), min(float(payload[1]), self.lease)
            answers = [(str(q), frozenset(str(n) for n in nodes)) for q, nodes in payload[2]]
        except (TypeError, ValueError, IndexError, KeyError):
            return
        if table is None or epoch != table.epoch or duration <= 0:
            return
        # Only the owner of a queue's slot may answer for it (peers are authenticated, yet never trusted blindly).
        self._held.take(epoch, duration, ((q, nodes) for q, nodes in answers if table.owner_of(route_key(q)) == sender))

    def _on_update(self, sender: str, payload: Any) -> None:
        table = self.lookup.table
        try:
            epoch = int(payload[0])
            updates = [(str(q), frozenset(str(n) for n in nodes)) for q, nodes in payload[1]]
        except (TypeError, ValueError, IndexError, KeyError):
            return
        if table is None or epoch != table.epoch:
            return
        catch_up: dict[str, set[str]] = {}
        for queue, nodes in updates:
            if table.owner_of(route_key(queue)) != sender:
                continue
            for node in self._held.update(epoch, queue, nodes):
                catch_up.setdefault(node, set()).add(queue)
        if catch_up:  # we may have told the old answer's nodes of news a new reader (a new node) has not seen
            self._tell(catch_up, "notify_catchup_msgs")

    def _on_void(self, sender: str, payload: Any) -> None:
        self._held.clear()

    def _on_peer_down(self, node_id: str) -> None:
        self._held.clear()  # an update from it may be lost
        self._granted.drop_holder(node_id)
        recent = self._recent.pop(node_id, None)
        if recent:
            horizon = self.clock() - RESEND_WINDOW
            self._broadcast({name for t, names in recent if t >= horizon for name in names})

    # --- owner side ----------------------------------------------------------------------------------------
    def _on_route(self, sender: str, payload: Any) -> None:
        try:
            epoch, names = int(payload[0]), {str(q) for q in payload[1]}
            wants_lease = len(payload) > 2 and bool(payload[2])
            skip_sender = len(payload) > 3 and bool(payload[3])
        except (TypeError, ValueError, IndexError, KeyError):
            return
        self._route(names, epoch, sender if wants_lease and self.lease > 0 else None, sender if skip_sender else None)

    def _route(self, queues: set[str], epoch: int, holder: str | None, skip: str | None) -> None:
        """Forward to the nodes with readers but `skip` (the publisher, told already); lease the answers to
        `holder` (the publisher) if it asked."""
        per_node: dict[str, set[str]] = {}
        unknown: set[str] = set()
        answers: list[list[Any]] = []
        for queue in queues:
            nodes = self.lookup.local_nodes_for_queue(queue, epoch)
            if nodes is None:
                unknown.add(queue)
                continue
            if holder is not None and self._granted.grant(queue, holder):
                answers.append([queue, sorted(nodes)])
            for node in nodes:
                if node != skip:
                    per_node.setdefault(node, set()).add(queue)
        if answers and holder is not None:
            self.counters["notify_lease_msgs"] += 1
            self.rpc.cast(holder, "nt.lease", [epoch, self.lease, answers])
            self._schedule_sweep()
        for node, names in per_node.items():
            if node == self.node_id:
                self._local(names)
            else:
                self.counters["notify_event_msgs"] += 1
                self.rpc.cast(node, "nt.ev", sorted(names))  # lost: that node's periodic re-read covers it
        if unknown:
            self.counters["notify_unknown"] += len(unknown)
            self._broadcast(unknown, skip != self.node_id)

    def _answers_changed(self, queues: set[str]) -> None:
        """Readers of some queues changed: send the new answers to the holders of leases on them."""
        if not len(self._granted):
            return
        epoch = self.lookup.epoch
        per_holder: dict[str, list[list[Any]]] = {}
        for queue in queues:
            holders = self._granted.holders(queue)
            nodes = self.lookup.local_nodes_for_queue(queue, epoch) if holders else None
            if nodes is None:
                continue
            for holder in holders:
                per_holder.setdefault(holder, []).append([queue, sorted(nodes)])
        for holder, updates in per_holder.items():
            self.counters["notify_update_msgs"] += 1
            self.rpc.cast(holder, "nt.upd", [epoch, updates])  # lost: the lease ends, the re-read covers the rest

    def _answers_void(self) -> None:
        """Our shard stopped answering (resync, new epoch): every lease on it ends now."""
        for holder in self._granted.all_holders():
            self.counters["notify_void_msgs"] += 1
            self.rpc.cast(holder, "nt.void", [])
        self._granted.clear()

    def _schedule_sweep(self) -> None:
        if self._sweep_handle is None:
            self._sweep_handle = asyncio.get_running_loop().call_later(self.lease, self._sweep)

    def _sweep(self) -> None:
        self._sweep_handle = None
        self._granted.sweep()
        if len(self._granted):
            self._schedule_sweep()

    def _broadcast(self, queues: set[str], tell_self: bool = True) -> None:
        if not queues:
            return
        self.counters["notify_broadcasts"] += 1
        table = self.lookup.table
        names = sorted(queues)
        for member in table.members if table is not None else ():
            if member != self.node_id:
                self.counters["notify_broadcast_msgs"] += 1
                self.rpc.cast(member, "nt.ev", names)
        if tell_self:
            self._local(queues)

    # --- receiving -----------------------------------------------------------------------------------------
    def _on_event(self, sender: str, payload: Any) -> None:
        try:
            names = {str(q) for q in payload}
        except TypeError:
            return
        self._local(names)

    def _local(self, queues: set[str]) -> None:
        """Merge everything arriving within this tick into one call of the node's handler."""
        self._incoming.update(queues)
        if not self._deliver_scheduled and self._incoming:
            self._deliver_scheduled = True
            asyncio.get_running_loop().call_soon(self._deliver)

    def _deliver(self) -> None:
        self._deliver_scheduled = False
        incoming, self._incoming = self._incoming, set()
        if incoming and self._handler is not None:
            self.counters["notify_local_events"] += 1
            self._handler(incoming)
