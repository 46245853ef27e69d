"""Consumer groups on a node: competing, credit-based consumers of light queues, for any protocol handler.

A group (an AMQP queue, a RocketMQ consumer group's subscription) is a `GroupRecord` in the store: a set of
topic filters read with one cursor, as an MQTT session reads its subscriptions. The log holds each message
once; the group holds positions. Consumers on any node compete through the store: a node reads what is new
after the group's cursor (through the shared queue cache), and `store.claim` hands each seq to exactly one
claimer; what a consumer does not settle in time (or gives back) becomes visible again and `store.reclaim`
hands it out once more, counted as a redelivery. Nothing here knows AMQP or RocketMQ: a handler implements
`Consumer` (credit + deliver) and calls `ack` / `requeue`.

Expiry (`expiry`): a message past its own deadline or the group's TTL is never delivered. By default it is
passed over; a group with an `Expired` sink (AMQP dead-lettering) has it claimed and handed to the sink, which
settles it. `expire_head` does the same for the head of the unclaimed backlog when nobody consumes, on the
caller's schedule (the clock is the node's).

A group's handler may also name, per message, a lane (`Lane`: RocketMQ message groups; the store hands a
lane's messages out one at a time, in order, see `Store.claim`) and a due time (`Due`: RocketMQ delay and timer
messages; one claimed before it is due is hidden until then, so the due time lives in the store's claim and
any node hands it out when due).
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Awaitable, Callable, Coroutine, Sequence
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
EXPIRED_HOLD_MS = 60_000  # expired messages claimed for the sink stay hidden this long if it never settles them
EXPIRE_BATCH = 500
HORIZON_PAGE = 1000  # messages read at a time to find where a filter's queue ends (`set_filters`)
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
# Expired messages of the group `name`, claimed for the sink: it settles them (once dead-lettered). If it raises,
# they are visible again a second later.
Expired = Callable[[str, list["Delivery"]], Coroutine[Any, Any, None]]
ProcessGone = Callable[[str, list[str]], Awaitable[None]]  # (dead process, groups its death left without members)
Lane = Callable[[Message], str]  # "": in no lane
Due = Callable[[Message], int]  # ms since the epoch; 0: at once


class _Group:
    """The node-local reader of one group: its local consumers, the cursor as last learnt from the store."""

    __slots__ = ("_taking", "_task", "_wanted", "consumers", "cursor", "due", "expired", "groups", "lane",
                 "matcher", "name", "reclaim_due", "record", "ttl_ms")

    def __init__(self, groups: ConsumerGroups, record: GroupRecord) -> None:
        self.groups = groups  # the node's groups: the store, cache, clock and counters this one reads
        self.name = record.name
        self.record = record
        self.cursor = record.start_seq
        self.consumers: list[Consumer] = []
        self.matcher: Matcher | None = None
        self.ttl_ms: int | None = None
        self.expired: Expired | None = None
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
            expired: list[Delivery] = []
            try:
                batch = await self._take(consumer, credit, expired)
            finally:
                self._taking.discard(id(consumer))
            if batch and consumer in self.consumers:
                consumer.deliver(batch)
                if not isinstance(consumer, _Poll) or consumer.counted:
                    self.groups.counters.consumed(self.name, batch)
                delivered += len(batch)
            elif batch:  # it left while the claim was made: give them back at once
                await self.groups.store.set_visibility(self.name, [(d.claim.seq, d.claim.token) for d in batch], 0)
                self.reclaim_due = True
                self._wanted = True
            await self._expire(expired)
        return delivered

    def _expired(self, message: Message, now_ms: int) -> bool:
        if message.expires_at_ms and message.expires_at_ms <= now_ms:
            return True
        return self.ttl_ms is not None and message.timestamp_ms + self.ttl_ms <= now_ms

    async def _expire(self, expired: list[Delivery]) -> None:
        sink = self.expired
        if not expired or sink is None:
            return
        try:
            await sink(self.name, expired)
        except Exception:
            later = int(self.groups.clock.time() * 1000) + 1000
            await self.groups.store.set_visibility(self.name, [(d.claim.seq, d.claim.token) for d in expired], later)
            raise

    async def expire_head(self) -> int:
        """Expired messages at the head of the unclaimed backlog (up to the first one still fresh) go to the sink,
        or are passed over without one; returns how many. For a queue nobody consumes (RabbitMQ expires at the
        head whether or not a consumer is attached)."""
        store = self.groups.store
        done = 0
        while True:
            now = int(self.groups.clock.time() * 1000)
            candidates, upto = await self._read_new(EXPIRE_BATCH, keep_expired=True)
            before = self.cursor
            head: list[Message] = []
            for message in candidates:
                if not self._expired(message, now):
                    break
                head.append(message)
            if not head:
                return done
            last = upto if len(head) == len(candidates) else head[-1].seq
            seqs = [m.seq for m in head] if self.expired is not None else []
            claims, cursor = await store.claim(self.name, before, last, seqs, self.groups.node_id,
                                               now + EXPIRED_HOLD_MS)
            self.cursor = max(before, cursor)
            by_seq = {m.seq: m for m in head}
            await self._expire([Delivery(by_seq[c.seq], c) for c in claims])
            done += len(claims) if self.expired is not None else len(head)
            if self.cursor <= before or len(head) < len(candidates):
                return done

    async def _take(self, consumer: Consumer, credit: int, expired: list[Delivery]) -> list[Delivery]:
        """Claim up to `credit` messages for `consumer`; expired ones claimed on the way (a group with a sink) are
        added to `expired` instead."""
        store = self.groups.store
        now = int(self.groups.clock.time() * 1000)
        visible_at = now + consumer.visibility_ms
        batch: list[Delivery] = []
        keep_expired = self.expired is not None
        if self.reclaim_due:
            claims = await store.reclaim(self.name, self.groups.node_id, now, visible_at, credit)
            if len(claims) < credit:
                self.reclaim_due = False
            if claims:
                by_seq = {m.seq: m for m in await store.fetch([c.seq for c in claims])}
                gone: list[tuple[int, int]] = []
                for claim in claims:
                    message = by_seq.get(claim.seq)
                    if message is not None and keep_expired and self._expired(message, now):
                        expired.append(Delivery(message, claim))
                    elif message is None or not self._wanted_message(message, now):
                        gone.append((claim.seq, claim.token))  # retention took it, or it expired: settled
                    else:
                        batch.append(Delivery(message, claim))
                if gone:
                    await store.settle(self.name, gone)
                batch = await self._hold_early(batch, now)
                credit -= len(batch)
        while credit > 0:
            candidates, upto = await self._read_new(credit, keep_expired)
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
                fresh: list[Delivery] = []
                for c in claims:
                    message = by_seq[c.seq]
                    if keep_expired and self._expired(message, now):
                        expired.append(Delivery(message, c))
                    else:
                        fresh.append(Delivery(message, c))
                taken = await self._hold_early(fresh, now)
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
        if self._expired(message, now_ms):
            return False
        return self.matcher is None or self.matcher(message)

    async def _read_new(self, limit: int, keep_expired: bool = False) -> tuple[list[Message], int]:
        """Messages of the group's queues after its cursor (merged, deduplicated, filtered) up to `limit`, and
        the seq up to which that answer is complete. Expired ones are passed over unless `keep_expired`."""
        cache = self.groups.cache
        after = self.cursor
        merged: dict[int, Message] = {}
        upto = _FAR
        record = self.record
        sources = [(queue, _FAR) for queue in record.filters]
        sources += [(queue, last) for queue, last in record.drains.items() if last > after]
        for queue, last in sources:
            cached = cache.get(queue, after, limit)
            if cached is None or cached[1] <= after:
                messages, horizon = await self.groups.store.read(queue, after, limit)
            else:
                messages, horizon = cached
            if horizon < last:  # (a drained filter read past its last seq has nothing more for the group)
                upto = min(upto, horizon)
            for message in messages:
                if message.seq <= last:
                    merged[message.seq] = message
        if upto == _FAR:
            return [], after
        now = int(self.groups.clock.time() * 1000)
        wanted: list[Message] = []
        for seq in sorted(merged):
            if seq > upto:
                break
            message = merged[seq]
            if self._wanted_message(message, now) or (keep_expired and self._expired(message, now) and (
                    self.matcher is None or self.matcher(message))):
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
        """See `_Group.expire_head`; 0 for a group this node does not know."""
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
