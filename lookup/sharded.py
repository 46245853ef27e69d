"""The sharded lookup: client locations and queue subscribers held in memory across the nodes, by slot owner.

Each node keeps its own truth (the clients connected to it, the queues it has readers for) and reports
changes, batched per tick, to the owners of their slots (`lookup.slots`). There are no replicas: on every new
epoch each owner starts empty and every member re-sends everything it holds to every owner (START .. DONE);
an owner answers only once all members of its epoch are DONE, and "unknown" otherwise, so readers fall back
(kick broadcast, notify broadcast). Answers are hints: wrong or missing ones cost a broadcast or a delay,
never a message.

The reports from one node to one owner form a stream (generation, sequence number) over `RpcNode.cast`. A
gap (a lost cast, a broken connection) makes that sender's part unknown at the owner, which asks the sender to
re-send its full state; the sender does so on its own as soon as it learns of a loss. Owners store the sender
as the location, so a node only ever reports itself.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from tidewire.lookup.rpc import RpcError, RpcNode
from tidewire.lookup.slots import SlotTable, route_key
from tidewire.store.base import P2P_PREFIX

log = logging.getLogger("tidewire.cluster.lookup")

CLIENT_ADD, CLIENT_DEL, QUEUE_ADD, QUEUE_DEL = 0, 1, 2, 3
START, DONE = 1, 2  # stream flags: START resets the sender's entries at the owner; DONE completes its resync

Op = tuple[int, str]


@dataclass
class _OutStream:
    gen: int
    seq: int = 0
    dirty: bool = False  # something sent may be lost: re-send everything


@dataclass
class _InStream:
    gen: int
    next_seq: int = 0
    asked: int = -1  # the generation for which we already asked the sender to resync


@dataclass
class _Shard:
    """What this node holds as owner for one epoch."""

    table: SlotTable
    me: str
    clients: dict[str, set[str]] = field(default_factory=dict)  # client id -> nodes reporting it connected
    queues: dict[str, set[str]] = field(default_factory=dict)  # queue -> nodes with readers
    by_node: dict[str, tuple[set[str], set[str]]] = field(default_factory=dict)  # node -> its clients, queues
    streams: dict[str, _InStream] = field(default_factory=dict)
    done: set[str] = field(default_factory=set)
    complete: bool = False

    def reset(self, node: str) -> None:
        clients, queues = self.by_node.pop(node, (set(), set()))
        for key, table in ((clients, self.clients), (queues, self.queues)):
            for k in key:
                nodes = table.get(k)
                if nodes is not None:
                    nodes.discard(node)
                    if not nodes:
                        del table[k]
        self.undone(node)

    def undone(self, node: str) -> None:
        self.done.discard(node)
        self.complete = False

    def mark_done(self, node: str) -> None:
        self.done.add(node)
        self.complete = self.done.issuperset(self.table.members)

    def apply(self, node: str, ops: list[Any]) -> set[str]:
        """Apply one sender's ops; returns the queues whose answer (`local_nodes_for_queue`) they changed."""
        mine = self.by_node.setdefault(node, (set(), set()))
        changed: set[str] = set()
        for op, key in ops:
            is_client = op in (CLIENT_ADD, CLIENT_DEL)
            if self.table.owner_of(key if is_client else route_key(key)) != self.me:
                continue  # not our slot (cannot happen within one epoch; never trust a peer blindly)
            table, index = (self.clients, mine[0]) if is_client else (self.queues, mine[1])
            if op in (CLIENT_ADD, QUEUE_ADD):
                nodes = table.setdefault(key, set())
                if node not in nodes:
                    nodes.add(node)
                    changed.add(P2P_PREFIX + key if is_client else key)
                index.add(key)
            else:
                held = table.get(key)
                if held is not None and node in held:
                    held.discard(node)
                    changed.add(P2P_PREFIX + key if is_client else key)
                    if not held:
                        del table[key]
                index.discard(key)
        return changed


class ShardedLookup:
    """The `Lookup` of a cluster node. Writers are sync and fire-and-forget; `client_location` may ask an owner."""

    def __init__(self, node_id: str, rpc: RpcNode, *, read_timeout: float = 0.5, chunk_ops: int = 2000,
                 repair_interval: float = 0.25, max_buffered: int = 10_000) -> None:
        self.node_id = node_id
        self.rpc = rpc
        self.read_timeout = read_timeout
        self.chunk_ops = chunk_ops
        self.repair_interval = repair_interval
        self.max_buffered = max_buffered  # messages of a newer epoch held until we learn that epoch
        self.table: SlotTable | None = None
        self.on_future_epoch: Callable[[], None] | None = None  # a peer is ahead: refresh membership now
        # Owner-side answers changed: these queues' readers (a complete shard), or every answer voided (the shard
        # became incomplete or a new epoch began). Leases on answers (`notify.leases`) follow them.
        self.on_answers_changed: Callable[[set[str]], None] | None = None
        self.on_answers_void: Callable[[], None] | None = None
        self._clients: dict[str, str] = {}  # our truth: client id -> this node
        self._queues: dict[str, int] = {}  # our truth: queue -> local readers
        self._pending: list[Op] = []
        self._flush_scheduled = False
        self._out: dict[str, _OutStream] = {}
        self._gen = 0
        self._shard: _Shard | None = None
        self._future: list[tuple[str, list[Any]]] = []
        self._future_dropped: set[tuple[str, int]] = set()
        self._repair: asyncio.TimerHandle | None = None
        self.counters = {"lookup_ops_sent": 0, "lookup_resyncs_sent": 0, "lookup_resyncs_asked": 0,
                         "lookup_gaps": 0, "lookup_reads_remote": 0, "lookup_reads_unknown": 0}
        rpc.handle("lk.ops", self._on_ops)
        rpc.handle("lk.get", self._on_get)
        rpc.handle("lk.resync", self._on_resync)
        rpc.on_peer_down(self._on_peer_down)

    @property
    def epoch(self) -> int:
        return self.table.epoch if self.table is not None else 0

    def close(self) -> None:
        if self._repair is not None:
            self._repair.cancel()
            self._repair = None

    # --- the Lookup protocol -------------------------------------------------------------------------------
    def set_client_location(self, client_id: str, node_id: str) -> None:
        if node_id == self.node_id and client_id not in self._clients:
            self._clients[client_id] = node_id
            self._emit(CLIENT_ADD, client_id)

    def remove_client_location(self, client_id: str, node_id: str) -> None:
        if node_id == self.node_id and self._clients.pop(client_id, None) is not None:
            self._emit(CLIENT_DEL, client_id)

    async def client_location(self, client_id: str) -> str | None:
        """The one node the client is connected to; None when nowhere, on several nodes, or unknown."""
        table = self.table
        if table is None:
            return None
        owner = table.owner_of(client_id)
        if owner == self.node_id:
            nodes = self.local_client_nodes(client_id, table.epoch)
        else:
            self.counters["lookup_reads_remote"] += 1
            try:
                reply = await self.rpc.call(owner or "", "lk.get", [table.epoch, client_id],
                                            timeout=self.read_timeout)
                owner_epoch, known, found = reply
                nodes = frozenset(found) if known and owner_epoch == table.epoch else None
                if owner_epoch > self.epoch and self.on_future_epoch is not None:
                    self.on_future_epoch()
            except (RpcError, ConnectionError, TimeoutError, TypeError, ValueError):
                nodes = None
        if nodes is None:
            self.counters["lookup_reads_unknown"] += 1
        return next(iter(nodes)) if nodes is not None and len(nodes) == 1 else None

    def add_queue_subscriber(self, queue: str, node_id: str) -> None:
        if node_id != self.node_id:
            return
        count = self._queues.get(queue, 0)
        self._queues[queue] = count + 1
        if count == 0:
            self._emit(QUEUE_ADD, queue)

    def remove_queue_subscriber(self, queue: str, node_id: str) -> None:
        count = self._queues.get(queue, 0) if node_id == self.node_id else 0
        if count > 1:
            self._queues[queue] = count - 1
        elif count == 1:
            del self._queues[queue]
            self._emit(QUEUE_DEL, queue)

    def nodes_for_queue(self, queue: str) -> frozenset[str] | None:
        """Answers only for slots this node owns; None otherwise (notify routes through the owner)."""
        return self.local_nodes_for_queue(queue, None)

    # --- owner-side answers ---------------------------------------------------------------------------------
    def local_client_nodes(self, client_id: str, epoch: int | None) -> frozenset[str] | None:
        shard = self._known_shard(client_id, epoch)
        return None if shard is None else frozenset(shard.clients.get(client_id, ()))

    def local_nodes_for_queue(self, queue: str, epoch: int | None) -> frozenset[str] | None:
        """Nodes with readers of `queue` (for `p2p#c`: where c is connected) if we own it and know it fully."""
        key = route_key(queue)
        shard = self._known_shard(key, epoch)
        if shard is None:
            return None
        nodes = set(shard.queues.get(queue, ()))
        if queue.startswith(P2P_PREFIX):
            nodes.update(shard.clients.get(key, ()))
        return frozenset(nodes)

    def _known_shard(self, key: str, epoch: int | None) -> _Shard | None:
        shard = self._shard
        if shard is None or not shard.complete or (epoch is not None and epoch != shard.table.epoch):
            return None
        return shard if shard.table.owner_of(key) == self.node_id else None

    # --- membership ----------------------------------------------------------------------------------------
    def set_membership(self, epoch: int, members: Iterable[str]) -> None:
        """A new epoch: start owning our new slots empty and re-send everything we hold to every owner."""
        if self.table is not None and epoch <= self.table.epoch:
            return
        table = self.table = SlotTable(epoch, members)
        self._shard = _Shard(table, self.node_id)
        if self.on_answers_void is not None:
            self.on_answers_void()
        self._pending.clear()
        self._out = {}
        self._resync(table.members)
        buffered, self._future = self._future, []
        for sender, payload in buffered:
            if payload[0] >= epoch:
                self._on_ops(sender, payload)
        for sender, dropped_epoch in list(self._future_dropped):
            if dropped_epoch <= epoch:
                self._future_dropped.discard((sender, dropped_epoch))
                if dropped_epoch == epoch:
                    self._ask_resync(sender, self._shard.streams.setdefault(sender, _InStream(-1)))

    # --- sending -------------------------------------------------------------------------------------------
    def _emit(self, op: int, key: str) -> None:
        if self.table is None:
            return  # the first resync carries it
        self._pending.append((op, key))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        pending, self._pending = self._pending, []
        table = self.table
        if table is None or not pending:
            return
        per_owner: dict[str, list[Op]] = {}
        for op, key in pending:
            owner = table.owner_of(key if op in (CLIENT_ADD, CLIENT_DEL) else route_key(key))
            if owner is not None:
                per_owner.setdefault(owner, []).append((op, key))
        for owner, ops in per_owner.items():
            stream = self._out.get(owner)
            if stream is not None and not stream.dirty:  # a dirty stream's resync will carry these anyway
                self._send(owner, stream, 0, ops)

    def _send(self, owner: str, stream: _OutStream, flags: int, ops: list[Op]) -> None:
        table = self.table
        assert table is not None
        gen = stream.gen
        payload = [table.epoch, gen, stream.seq, flags, ops]
        stream.seq += 1
        self.counters["lookup_ops_sent"] += len(ops)
        if not self.rpc.cast(owner, "lk.ops", payload, on_lost=lambda: self._lost(owner, gen)):
            self._lost(owner, gen)

    def _resync(self, owners: Iterable[str]) -> None:
        """Everything we hold, to each of `owners`, as a fresh stream: START, chunks, DONE."""
        table = self.table
        assert table is not None
        wanted = set(owners)
        per_owner: dict[str, list[Op]] = {owner: [] for owner in wanted}
        truth = [(CLIENT_ADD, c, c) for c in self._clients] + [(QUEUE_ADD, q, route_key(q)) for q in self._queues]
        for op, key, rkey in truth:
            ops = per_owner.get(table.owner_of(rkey) or "")
            if ops is not None:
                ops.append((op, key))
        for owner, ops in per_owner.items():
            self._gen += 1
            stream = self._out[owner] = _OutStream(self._gen)
            self.counters["lookup_resyncs_sent"] += 1
            chunks = [ops[i:i + self.chunk_ops] for i in range(0, len(ops), self.chunk_ops)] or [[]]
            for i, chunk in enumerate(chunks):
                flags = (START if i == 0 else 0) | (DONE if i == len(chunks) - 1 else 0)
                self._send(owner, stream, flags, chunk)
                if stream.dirty:
                    break  # the peer is down: the repair timer tries again

    def _lost(self, owner: str, gen: int) -> None:
        stream = self._out.get(owner)
        if stream is not None and stream.gen == gen and not stream.dirty:
            stream.dirty = True
            self._schedule_repair()

    def _on_peer_down(self, node_id: str) -> None:
        stream = self._out.get(node_id)
        if stream is not None:
            self._lost(node_id, stream.gen)

    def _schedule_repair(self) -> None:
        if self._repair is None:
            self._repair = asyncio.get_running_loop().call_later(self.repair_interval, self._do_repair)

    def _do_repair(self) -> None:
        self._repair = None
        table = self.table
        if table is None:
            return
        dirty = [owner for owner, stream in self._out.items() if stream.dirty and owner in table.members]
        if dirty:
            self._resync(dirty)

    def _on_resync(self, sender: str, payload: Any) -> None:
        """An owner saw a gap in our stream to it: re-send everything to it."""
        if isinstance(payload, list) and payload and payload[0] == self.epoch and sender in self._out:
            self._resync([sender])

    # --- receiving (owner side) -----------------------------------------------------------------------------
    def _on_ops(self, sender: str, payload: Any) -> None:
        try:
            epoch, gen, seq, flags, ops = payload
            ops = [(int(op), str(key)) for op, key in ops]
            epoch, gen, seq, flags = int(epoch), int(gen), int(seq), int(flags)
        except (TypeError, ValueError):
            log.warning("malformed lookup update from %s ignored", sender)
            return
        shard = self._shard
        if shard is None or epoch > shard.table.epoch:
            if len(self._future) < self.max_buffered:
                self._future.append((sender, [epoch, gen, seq, flags, ops]))
            else:
                self._future_dropped.add((sender, epoch))
            if self.on_future_epoch is not None:
                self.on_future_epoch()
            return
        if epoch < shard.table.epoch or sender not in shard.table.members:
            return  # the sender re-sends everything once it learns the new epoch
        was_complete = shard.complete
        try:
            self._apply_stream(shard, sender, gen, seq, flags, ops)
        finally:
            if was_complete and not shard.complete and self.on_answers_void is not None:
                self.on_answers_void()

    def _apply_stream(self, shard: _Shard, sender: str, gen: int, seq: int, flags: int, ops: list[Any]) -> None:
        stream = shard.streams.get(sender)
        if flags & START:
            if stream is not None and gen <= stream.gen:
                return  # an older resync arriving late
            shard.reset(sender)
            stream = shard.streams[sender] = _InStream(gen)
        elif stream is None or gen != stream.gen or seq != stream.next_seq:
            if stream is None or gen >= stream.gen:
                if stream is None or stream.next_seq >= 0:
                    self.counters["lookup_gaps"] += 1
                stream = shard.streams.setdefault(sender, _InStream(-1))
                stream.next_seq = -1  # broken: nothing more of this generation counts, only a new START
                shard.undone(sender)
                self._ask_resync(sender, stream)
            return
        changed = shard.apply(sender, ops)
        stream.next_seq = seq + 1
        if flags & DONE:
            shard.mark_done(sender)
        if changed and shard.complete and self.on_answers_changed is not None:
            self.on_answers_changed(changed)

    def _ask_resync(self, sender: str, stream: _InStream) -> None:
        if stream.asked != stream.gen:  # once per generation: the sender's next START answers it
            stream.asked = stream.gen
            self.counters["lookup_resyncs_asked"] += 1
            self.rpc.cast(sender, "lk.resync", [self.epoch])

    def _on_get(self, sender: str, payload: Any) -> list[Any]:
        try:
            epoch, client_id = int(payload[0]), str(payload[1])
        except (TypeError, ValueError, IndexError, KeyError):
            return [self.epoch, 0, []]
        nodes = self.local_client_nodes(client_id, epoch)
        return [self.epoch, 0, []] if nodes is None else [self.epoch, 1, sorted(nodes)]

    def stats(self) -> dict[str, int]:
        shard = self._shard
        owned = 0 if shard is None else len(shard.clients) + len(shard.queues)
        return {**self.counters, "lookup_entries_owned": owned,
                "lookup_complete": int(shard is not None and shard.complete)}
