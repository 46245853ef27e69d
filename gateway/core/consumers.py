"""Consumer groups on a node: competing, credit-based consumers of light queues, for any protocol handler.

A group (an AMQP queue, a RocketMQ consumer group's subscription) is a `GroupRecord` in the store: a set of
topic filters read with one cursor, as an MQTT session reads its subscriptions. The log holds each message
once; the group holds positions. Consumers on any node compete through the store: a node reads what is new
after the group's cursor (through the shared queue cache), and `store.claim` hands each seq to exactly one
claimer; what a consumer does not settle in time (or gives back) becomes visible again and `store.reclaim`
hands it out once more, counted as a redelivery. Nothing here knows AMQP or RocketMQ: a handler implements
`Consumer` (credit + deliver) and calls `ack` / `requeue`.

A group's handler may also name, per message, a lane (`Lane`: RocketMQ message groups; the store hands a
lane's messages out one at a time, in order, see `Store.claim`) and a due time (`Due`: RocketMQ delay and timer
messages; one claimed before it is due is hidden until then, so the due time lives in the store's claim and
any node hands it out when due).
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from tidewire.gateway.core.retry import Backoff, stop_if_cancelled
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
_FAR = 1 << 62


class Delivery(NamedTuple):
    message: Message
    claim: Claim  # (seq, deliveries, token): redelivered when deliveries > 1; ack/requeue by (seq, token)


class Consumer(Protocol):
    """One competing consumer on this node: an AMQP Basic.Consume, a RocketMQ ReceiveMessage poll."""

    visibility_ms: int  # how long what it gets stays hidden from the other consumers if it settles nothing

    def credit(self) -> int:
        """How many messages it takes now (AMQP prefetch minus unacked; a poll's batch size)."""

    def deliver(self, deliveries: list[Delivery]) -> None:
        """At most `credit()` messages, claimed for it."""


Matcher = Callable[[Message], bool]
Lane = Callable[[Message], str]  # "": in no lane
Due = Callable[[Message], int]  # ms since the epoch; 0: at once


class _Group:
    """The node-local reader of one group: its local consumers, the cursor as last learnt from the store."""

    __slots__ = ("_taking", "_task", "_wanted", "consumers", "cursor", "due", "groups", "lane", "matcher", "name",
                 "reclaim_due", "record")

    def __init__(self, groups: ConsumerGroups, record: GroupRecord) -> None:
        self.groups = groups  # the node's groups: the store, cache, clock and counters this one reads
        self.name = record.name
        self.record = record
        self.cursor = record.start_seq
        self.consumers: list[Consumer] = []
        self.matcher: Matcher | None = None
        self.lane: Lane | None = None
        self.due: Due | None = None
        self.reclaim_due = True
        self._wanted = False
        self._task: asyncio.Task[None] | None = None
        self._taking: set[int] = set()  # ids of consumers a claim is being made for (one at a time each)

    def pull(self) -> None:
        """New messages may be in its queues, or a consumer has credit again (the `Puller` seam)."""
        if not self.consumers:
            return
        if self._task is not None:
            self._wanted = True
            return
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        retry = Backoff("group " + self.name, self.groups.clock)
        try:
            while True:
                self._wanted = False
                try:
                    await self.serve()
                except Exception as exc:
                    stop_if_cancelled()
                    await asyncio.sleep(retry.failed(exc))
                    self._wanted = True
                else:
                    retry.succeeded()
                if not self._wanted:
                    return
        finally:
            self._task = None

    async def serve(self) -> int:
        """Hand each local consumer with credit what it can take: lapsed claims first, then new messages.
        Returns how many were delivered."""
        delivered = 0
        for consumer in list(self.consumers):
            credit = consumer.credit()
            if credit <= 0 or consumer not in self.consumers or id(consumer) in self._taking:
                continue
            self._taking.add(id(consumer))
            try:
                batch = await self._take(consumer, credit)
            finally:
                self._taking.discard(id(consumer))
            if batch and consumer in self.consumers:
                consumer.deliver(batch)
                self.groups.counters.consumed(self.name, batch)
                delivered += len(batch)
            elif batch:  # it left while the claim was made: give them back at once
                await self.groups.store.set_visibility(self.name, [(d.claim.seq, d.claim.token) for d in batch], 0)
                self.reclaim_due = True
                self._wanted = True
        return delivered

    async def _take(self, consumer: Consumer, credit: int) -> list[Delivery]:
        store = self.groups.store
        now = int(self.groups.clock.time() * 1000)
        visible_at = now + consumer.visibility_ms
        batch: list[Delivery] = []
        if self.reclaim_due:
            claims = await store.reclaim(self.name, self.groups.node_id, now, visible_at, credit)
            if len(claims) < credit:
                self.reclaim_due = False
            if claims:
                by_seq = {m.seq: m for m in await store.fetch([c.seq for c in claims])}
                gone: list[tuple[int, int]] = []
                for claim in claims:
                    message = by_seq.get(claim.seq)
                    if message is None or not self._wanted_message(message, now):
                        gone.append((claim.seq, claim.token))  # retention took it, or it expired: settled
                    else:
                        batch.append(Delivery(message, claim))
                if gone:
                    await store.settle(self.name, gone)
                batch = await self._hold_early(batch, now)
                credit -= len(batch)
        while credit > 0:
            candidates, upto = await self._read_new(credit)
            if upto <= self.cursor:
                break
            seqs = [m.seq for m in candidates]
            before = self.cursor
            lanes = None
            if self.lane is not None:
                lanes = {m.seq: lane for m in candidates if (lane := self.lane(m))} or None
            claims, cursor = await store.claim(self.name, before, upto, seqs, self.groups.node_id, visible_at, lanes)
            self.cursor = max(before, cursor)
            if claims:
                by_seq = {m.seq: m for m in candidates}
                taken = await self._hold_early([Delivery(by_seq[c.seq], c) for c in claims], now)
                batch += taken
                credit -= len(taken)
            elif self.cursor <= before:
                break  # nothing moved: read again on the next notify
        return batch

    async def _hold_early(self, batch: list[Delivery], now_ms: int) -> list[Delivery]:
        """What of `batch` is due; the claims of the rest are hidden until their due time."""
        if self.due is None:
            return batch
        due = self.due
        early: dict[int, list[tuple[int, int]]] = {}
        ready: list[Delivery] = []
        for delivery in batch:
            at = due(delivery.message)
            if at > now_ms:
                early.setdefault(at, []).append((delivery.claim.seq, delivery.claim.token))
            else:
                ready.append(delivery)
        for at, handles in early.items():
            await self.groups.store.set_visibility(self.name, handles, at)
        return ready

    def _wanted_message(self, message: Message, now_ms: int) -> bool:
        if message.expires_at_ms and message.expires_at_ms <= now_ms:
            return False
        return self.matcher is None or self.matcher(message)

    async def _read_new(self, limit: int) -> tuple[list[Message], int]:
        """Messages of the group's queues after its cursor (merged, deduplicated, filtered) up to `limit`, and
        the seq up to which that answer is complete."""
        cache = self.groups.cache
        after = self.cursor
        merged: dict[int, Message] = {}
        upto = _FAR
        for queue in self.record.filters:
            cached = cache.get(queue, after, limit)
            if cached is None or cached[1] <= after:
                messages, horizon = await self.groups.store.read(queue, after, limit)
            else:
                messages, horizon = cached
            upto = min(upto, horizon)
            for message in messages:
                merged[message.seq] = message
        if upto == _FAR:
            return [], after
        now = int(self.groups.clock.time() * 1000)
        wanted: list[Message] = []
        for seq in sorted(merged):
            if seq > upto:
                break
            message = merged[seq]
            if self._wanted_message(message, now):
                wanted.append(message)
                if len(wanted) == limit:
                    return wanted, seq  # cut: complete only up to the last one taken
        return wanted, upto


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
        self._groups: dict[str, _Group] = {}  # every group this node knows (declared here or loaded)
        self._routes: FilterTrie[str] = FilterTrie()  # filter → group names, for `routed`
        self._routes_read = 0.0
        self._reclaim_task: asyncio.Task[None] | None = None

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

    async def owner_gone(self, owner: str) -> None:
        """A node died: what it had claimed is visible again now, not when the claims lapse."""
        for record in await self.store.list_groups():
            if await self.store.release_owner(record.name, owner) and (
                    group := self._groups.get(record.name)) is not None:
                group.reclaim_due = True
                group.pull()

    async def _reclaim_loop(self) -> None:
        while True:
            await asyncio.sleep(RECLAIM_INTERVAL)
            for group in list(self._groups.values()):
                if group.consumers:
                    group.reclaim_due = True
                    group.pull()

    # --- definitions -----------------------------------------------------------------------------------
    def _know(self, record: GroupRecord) -> _Group:
        group = self._groups.get(record.name)
        subscriptions = self.subscriptions
        owner = "group:" + record.name
        old = set(group.record.filters) if group is not None else set()
        new = set(record.filters)
        if group is None:
            group = self._groups[record.name] = _Group(self, record)
        group.record = record
        for topic_filter in new - old:
            subscriptions.hold_wildcard(topic_filter, owner)
            self._routes.add(topic_filter, record.name)
            if group.consumers:
                subscriptions.add_reader(group, topic_filter)
        for topic_filter in old - new:
            subscriptions.release_wildcard(topic_filter, owner)
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
            subscriptions.release_wildcard(topic_filter, "group:" + name)
            self._routes.remove(topic_filter, name)
            if group.consumers:
                subscriptions.remove_reader(group, topic_filter)
        group.consumers.clear()
        if group._task is not None:
            group._task.cancel()

    async def declare(self, record: GroupRecord) -> tuple[GroupRecord, bool]:
        """Create the group unless it exists; returns the stored definition and whether it was created. A new
        group starts at the log's end; `attrs["node"]` records the declaring node."""
        stored = await self.store.get_group(record.name)
        if stored is not None:
            self._know(stored)
            return stored, False
        record.start_seq = self.store.last_seq()
        record.created_ms = record.created_ms or int(self.clock.time() * 1000)
        record.attrs.setdefault("node", self.node_id)
        return await self.set_filters(record, record.filters), True

    async def get(self, name: str) -> GroupRecord | None:
        record = await self.store.get_group(name)
        if record is None:
            self._forget(name)
        else:
            self._know(record)
        return record

    async def set_filters(self, record: GroupRecord, filters: list[str]) -> GroupRecord:
        """Store the group with these filters (bind/unbind); returns the stored definition (a copy of `record`)
        once every node indexes what is published from now on into the new filters' queues."""
        record = copy.copy(record)  # `_know` compares with the filters held before: maybe this very object's
        record.filters = sorted(set(filters))
        group = self._know(record)
        await self.subscriptions.wildcards_registered(record.filters)
        await self.store.put_group(record)
        group.pull()
        return record

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

    def matcher(self, name: str, matcher: Matcher | None) -> None:
        """What of the group's messages its consumers on this node want (RocketMQ tags/SQL, AMQP TTL); the rest
        is passed over, never claimed. Every node must use the same matcher for a group."""
        group = self._groups.get(name)
        if group is not None:
            group.matcher = matcher

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

    async def receive(self, name: str, max_messages: int, visibility_ms: int, wait_s: float) -> list[Delivery]:
        """One poll: up to `max_messages`, waiting up to `wait_s` for the first (RocketMQ ReceiveMessage, AMQP
        Basic.Get with `wait_s` 0). Empty if nothing came."""
        group = self._groups.get(name)
        if group is None:
            return []
        poll = _Poll(max_messages, visibility_ms)
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

    async def _give_back(self, name: str, handles: list[tuple[int, int]]) -> None:
        await self.requeue(name, handles)


class _Poll:
    """A consumer for one poll: takes up to its batch, once."""

    __slots__ = ("done", "got", "size", "visibility_ms")

    def __init__(self, size: int, visibility_ms: int) -> None:
        self.size = size
        self.visibility_ms = visibility_ms
        self.got: list[Delivery] = []
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def credit(self) -> int:
        return 0 if self.got else self.size

    def deliver(self, deliveries: list[Delivery]) -> None:
        self.got = deliveries
        if not self.done.done():
            self.done.set_result(None)
