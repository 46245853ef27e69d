"""Consumer groups on a node: competing, credit-based consumers of light queues, for any protocol handler.

A group (an AMQP queue, a RocketMQ consumer group's subscription) is a `GroupRecord` in the store: a set of
topic filters read with one cursor, as an MQTT session reads its subscriptions. The log holds each message
once; the group holds positions. Consumers on any node compete through the store: a node reads what is new
after the group's cursor (through the shared queue cache), and `store.claim` hands each seq to exactly one
claimer; what a consumer does not settle in time (or gives back) becomes visible again and `store.reclaim`
hands it out once more, counted as a redelivery. Nothing here knows AMQP or RocketMQ: a handler implements
`Consumer` (credit + deliver) and calls `ack` / `requeue`.

Each group is read on this node by a `gateway.core.group_reader.GroupReader`: claims, expiry (`expiry`: passed
over, or handed to an `Expired` sink), lanes and due times (`kinds`: RocketMQ FIFO and delay messages) are
its; here are the node's groups and the calls the protocols make.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from tidewire.gateway.core.group_reader import Consumer, Delivery, Due, Expired, GroupReader, Lane, Matcher
from tidewire.gateway.core.topics import FilterTrie
from tidewire.store.base import Claim, GroupRecord, Message

if TYPE_CHECKING:
    from tidewire.cache.queue_cache import QueueCache
    from tidewire.gateway.core.clock import Clock
    from tidewire.gateway.core.subscriptions import SubscriptionRegistry
    from tidewire.store.base import Store

log = logging.getLogger("tidewire.consumers")


class DeliveryCounters(Protocol):
    def consumed(self, group: str, deliveries: Sequence[tuple[Message, Claim]]) -> None:
        """A consumer of `group` was handed `deliveries` (one call per batch)."""

RECLAIM_INTERVAL = 1.0  # s between looks for claims that lapsed (a consumer elsewhere died or timed out)
HORIZON_PAGE = 1000  # messages read at a time to find where a filter's queue ends (`set_filters`)
ProcessGone = Callable[[str, list[str]], Awaitable[None]]  # (dead process, groups its death left without members)


class ConsumerGroups:
    """The node's consumer groups: `node.groups`. It gets the few parts it uses, not the node."""

    def __init__(self, node_id: str, store: Store, cache: QueueCache, subscriptions: SubscriptionRegistry,
                 counters: DeliveryCounters, clock: Clock, spawn: Callable[[Coroutine[Any, Any, None]], None]) -> None:
        self.node_id = node_id
        self.store = store
        self.cache = cache
        self.subscriptions = subscriptions
        self.counters = counters
        self.clock = clock
        self.spawn = spawn  # a background task the node keeps (and cancels at stop)
        self._groups: dict[str, GroupReader] = {}  # every group this node knows (declared here or loaded)
        self._routes: FilterTrie[str] = FilterTrie()  # filter → group names, for `routed`
        self._routes_read = 0.0
        self._reclaim_task: asyncio.Task[None] | None = None
        self._process_gone: list[ProcessGone] = []

    # --- lifecycle ---------------------------------------------------------------------------------------
    async def load(self) -> None:
        """At startup: every stored group; what this node's previous life had claimed is visible again, and its
        non-durable groups are gone (as RabbitMQ drops non-durable queues on restart)."""
        for record in await self.store.list_groups():
            if not record.durable and record.attrs.get("node") == self.node_id:
                await self.store.delete_group(record.name)
                continue
            await self.store.release_owner(record.name, self.node_id)
            self._know(record)
        self._routes_read = self.clock.monotonic()
        self._reclaim_task = asyncio.get_running_loop().create_task(self._reclaim_loop())

    async def stop(self) -> None:
        if self._reclaim_task is not None:
            self._reclaim_task.cancel()
        for group in self._groups.values():
            if group._task is not None:
                group._task.cancel()

    async def owner_gone(self, owner: str, process: str) -> None:
        """A node's process (`process`: its membership token) died: what it had claimed is visible again now,
        not when the claims lapse; the consumers it held are no longer members (`Store.join_group`), and the
        handlers given to `on_process_gone` learn which groups that left without any (an AMQP auto-delete queue
        goes then)."""
        for record in await self.store.list_groups():
            if await self.store.release_owner(record.name, owner) and (
                    group := self._groups.get(record.name)) is not None:
                group.reclaim_due = True
                group.pull()
        if not process:
            return  # (no token known: a successor's members must not be taken for its)
        emptied = await self.store.release_members(owner, process)
        for handler in self._process_gone:
            await handler(process, emptied)

    def on_process_gone(self, handler: ProcessGone) -> None:
        """`await handler(process, emptied)` after a dead process's members were released (see `owner_gone`)."""
        self._process_gone.append(handler)

    async def _reclaim_loop(self) -> None:
        while True:
            await asyncio.sleep(RECLAIM_INTERVAL)
            for group in list(self._groups.values()):
                if group.consumers:
                    group.reclaim_due = True
                    group.pull()

    # --- definitions -----------------------------------------------------------------------------------
    def _know(self, record: GroupRecord) -> GroupReader:
        group = self._groups.get(record.name)
        subscriptions = self.subscriptions
        owner = "group:" + record.name
        old = set(group.record.filters) if group is not None else set()
        new = set(record.filters)
        if group is None:
            group = self._groups[record.name] = GroupReader(self, record)
        group.record = record
        for topic_filter in new - old:
            subscriptions.wildcards.hold(topic_filter, owner)
            self._routes.add(topic_filter, record.name)
            if group.consumers:
                subscriptions.add_reader(group, topic_filter)
        for topic_filter in old - new:
            subscriptions.wildcards.release(topic_filter, owner)
            self._routes.remove(topic_filter, record.name)
            if group.consumers:
                subscriptions.remove_reader(group, topic_filter)
        return group

    def _forget(self, name: str) -> None:
        group = self._groups.pop(name, None)
        if group is None:
            return
        subscriptions = self.subscriptions
        for topic_filter in group.record.filters:
            subscriptions.wildcards.release(topic_filter, "group:" + name)
            self._routes.remove(topic_filter, name)
            if group.consumers:
                subscriptions.remove_reader(group, topic_filter)
        group.consumers.clear()
        if group._task is not None:
            group._task.cancel()

    async def declare(self, record: GroupRecord) -> tuple[GroupRecord, bool]:
        """Create the group unless it exists; returns the stored definition and whether it was created (by this
        call: of nodes declaring it at once, one creates it and the others get its definition). A new group
        starts at the log's end; `attrs["node"]` records the declaring node."""
        while True:
            stored = await self.store.get_group(record.name)
            if stored is not None:
                self._know(stored)
                return stored, False
            new = copy.copy(record)
            new.filters = sorted(set(record.filters))
            new.start_seq = self.store.last_seq()
            new.created_ms = record.created_ms or int(self.clock.time() * 1000)
            new.attrs = {"node": self.node_id, **record.attrs}
            group = self._know(new)
            await self.subscriptions.wildcards_registered(new.filters)  # indexed before anyone can read it
            if await self.store.add_group(new):
                group.pull()
                return new, True

    async def get(self, name: str) -> GroupRecord | None:
        record = await self.store.get_group(name)
        if record is None:
            self._forget(name)
        else:
            self._know(record)
        return record

    async def set_filters(self, record: GroupRecord, filters: list[str]) -> GroupRecord:
        """Store the group with these filters (bind/unbind); returns the stored definition (a copy of `record`)
        once every node indexes what is published from now on into the new filters' queues.

        A filter taken off keeps what it routed to the group so far, as a queue keeps its messages when a binding
        goes (RabbitMQ): the group reads it on up to the seq its queue is complete to now (`GroupRecord.drains`),
        never past it, until its cursor passes that seq. The messages stay stored once; only that bound is kept."""
        record = copy.copy(record)  # `_know` compares with the filters held before: maybe this very object's
        wanted = sorted(set(filters))
        drains = {f: last for f, last in record.drains.items() if f not in wanted}
        for topic_filter in set(record.filters) - set(wanted):
            drains[topic_filter] = await self._complete_to(topic_filter)  # before its hold goes, below
        if drains:
            cursor, _ = await self.store.group_position(record.name)
            drains = {f: last for f, last in drains.items() if last > cursor}
        record.filters = wanted
        record.drains = drains
        group = self._know(record)
        await self.subscriptions.wildcards_registered(record.filters)
        await self.store.put_group(record)
        group.pull()
        return record

    async def _complete_to(self, queue: str) -> int:
        """The seq up to which `queue` is complete now: every message stored in it so far is at or below it."""
        after = self.store.last_seq()  # (what another node stored since may lie above this node's last_seq)
        while True:
            messages, upto = await self.store.read(queue, after, HORIZON_PAGE)
            if len(messages) < HORIZON_PAGE:
                return upto
            after = upto

    async def reread(self, name: str) -> None:
        """Another node changed the group's filters: read the definition now, before its consumers here claim
        more (a group this node does not know stays unknown; a deleted one is forgotten)."""
        if name in self._groups:
            await self.get(name)

    async def delete(self, name: str) -> None:
        self._forget(name)
        await self.store.delete_group(name)

    async def routed(self, topic: str) -> bool:
        """Would a message on `topic` reach some consumer: a group's filter, an MQTT subscriber here, a wildcard
        of the cluster-wide set? (A group declared on another node is seen after at most a second.)"""
        if self._routes.match(topic) or self.subscriptions.routed(topic):
            return True
        clock = self.clock
        if clock.monotonic() - self._routes_read > 1.0:
            self._routes_read = clock.monotonic()
            for record in await self.store.list_groups():
                if record.name not in self._groups:
                    self._know(record)
            return bool(self._routes.match(topic))
        return False

    def known(self, name: str) -> GroupRecord | None:
        """The group's definition as this node last read it (None: not known here)."""
        group = self._groups.get(name)
        return None if group is None else group.record

    def routed_groups(self, topic: str) -> list[GroupRecord]:
        """The definitions of the groups known here (declared or used on this node, or loaded) that read `topic`."""
        names = {name for _, found in self._routes.match(topic) for name in found}
        return [self._groups[name].record for name in sorted(names) if name in self._groups]

    def matcher(self, name: str, matcher: Matcher | None) -> None:
        """What of the group's messages its consumers on this node want (RocketMQ tags/SQL, AMQP TTL); the rest
        is passed over, never claimed. Every node must use the same matcher for a group."""
        group = self._groups.get(name)
        if group is not None:
            group.matcher = matcher

    def expiry(self, name: str, ttl_ms: int | None, expired: Expired | None) -> None:
        """The group's message TTL (ms after the append; None: only messages' own deadlines) and what becomes of
        expired messages (None: passed over). Every node must use the same for a group."""
        group = self._groups.get(name)
        if group is not None:
            group.ttl_ms = ttl_ms
            group.expired = expired

    async def expire_head(self, name: str) -> int:
        """See `GroupReader.expire_head`; 0 for a group this node does not know."""
        group = self._groups.get(name)
        return 0 if group is None else await group.expire_head()
    def kinds(self, name: str, lane: Lane | None, due: Due | None) -> None:
        """Each message's lane and due time for the group (RocketMQ FIFO and delay messages); None: no lanes,
        everything due at once. Every node must use the same for a group, as for `matcher`."""
        group = self._groups.get(name)
        if group is not None:
            group.lane, group.due = lane, due

    # --- consuming -------------------------------------------------------------------------------------
    def consume(self, name: str, consumer: Consumer) -> bool:
        """Start handing the group's messages to `consumer` (False: unknown group, `declare` or `get` it)."""
        group = self._groups.get(name)
        if group is None:
            return False
        if not group.consumers:
            for topic_filter in group.record.filters:
                self.subscriptions.add_reader(group, topic_filter)
        group.consumers.append(consumer)
        group.reclaim_due = True
        group.pull()
        return True

    def cancel(self, name: str, consumer: Consumer) -> None:
        """Stop delivering to `consumer` (its unsettled messages are the handler's to requeue or keep)."""
        group = self._groups.get(name)
        if group is None or consumer not in group.consumers:
            return
        group.consumers.remove(consumer)
        if not group.consumers:
            for topic_filter in group.record.filters:
                self.subscriptions.remove_reader(group, topic_filter)

    def consumer_count(self, name: str) -> int:
        group = self._groups.get(name)
        return len(group.consumers) if group is not None else 0

    def wake(self, name: str) -> None:
        """A consumer has credit again."""
        group = self._groups.get(name)
        if group is not None:
            group.pull()

    async def ack(self, name: str, handles: list[tuple[int, int]]) -> list[int]:
        """Settle (seq, token) handles; returns the seqs settled (a stale handle settles nothing)."""
        if not handles:
            return []
        settled = await self.store.settle(name, handles)
        group = self._groups.get(name)
        if settled and group is not None and group.lane is not None:  # a lane's next message is due now
            group.reclaim_due = True
            group.pull()
        return settled

    async def requeue(self, name: str, handles: list[tuple[int, int]], delay_ms: int = 0) -> list[Claim]:
        """Give claims back, visible again after `delay_ms` (0: now, to any consumer, as a redelivery), or keep
        them hidden longer (RocketMQ ChangeInvisibleDuration); returns the claims with their new tokens."""
        if not handles:
            return []
        visible_at = int(self.clock.time() * 1000) + delay_ms if delay_ms else 0
        claims = await self.store.set_visibility(name, handles, visible_at)
        group = self._groups.get(name)
        if group is not None and not delay_ms:
            group.reclaim_due = True
            group.pull()
        return claims

    async def receive(self, name: str, max_messages: int, visibility_ms: int, wait_s: float,
                      counted: bool = True) -> list[Delivery]:
        """One poll: up to `max_messages`, waiting up to `wait_s` for the first (RocketMQ ReceiveMessage, AMQP
        Basic.Get with `wait_s` 0). Empty if nothing came. Not `counted`: taken to be dropped, not delivered
        (AMQP's drop-head), so not counted as sent."""
        group = self._groups.get(name)
        if group is None:
            return []
        poll = _Poll(max_messages, visibility_ms, counted)
        group.consumers.append(poll)
        if len(group.consumers) == 1:
            for topic_filter in group.record.filters:
                self.subscriptions.add_reader(group, topic_filter)
        try:
            group.reclaim_due = True
            await group.serve()  # now, not via the loop: a Basic.Get answers at once
            if not poll.got and wait_s > 0:
                group.pull()
                try:
                    await asyncio.wait_for(asyncio.shield(poll.done), wait_s)
                except TimeoutError:
                    pass
        except asyncio.CancelledError:
            if poll.got:  # claimed for a caller that is gone: visible to the others again now, not at lapse
                handles = [(d.claim.seq, d.claim.token) for d in poll.got]
                self.spawn(self._give_back(name, handles))
            raise
        finally:
            self.cancel(name, poll)
        return poll.got

    def consumed(self, name: str, consumer: Consumer, deliveries: list[Delivery]) -> None:
        """`consumer` was handed `deliveries` of group `name`: counted as sent, unless a poll asked otherwise."""
        if not isinstance(consumer, _Poll) or consumer.counted:
            self.counters.consumed(name, deliveries)

    async def _give_back(self, name: str, handles: list[tuple[int, int]]) -> None:
        await self.requeue(name, handles)


class _Poll:
    """A consumer for one poll: takes up to its batch, once."""

    __slots__ = ("counted", "done", "got", "size", "visibility_ms")

    def __init__(self, size: int, visibility_ms: int, counted: bool) -> None:
        self.size = size
        self.visibility_ms = visibility_ms
        self.counted = counted
        self.got: list[Delivery] = []
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def credit(self) -> int:
        return 0 if self.got else self.size

    def deliver(self, deliveries: list[Delivery]) -> None:
        self.got = deliveries
        if not self.done.done():
            self.done.set_result(None)
