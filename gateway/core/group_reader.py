"""The node-local reader of one consumer group: its cursor, what it claims for its local consumers and when.

`GroupReader.serve` reads what is new after the group's cursor (through the shared queue cache), claims it in
the store for the consumers that have credit, and hands each its share; reclaimed messages (a consumer elsewhere
died or gave them back) go first. Expiry: a message past its own deadline or the group's TTL is never delivered;
it is passed over, or, with an `Expired` sink (AMQP dead-lettering), claimed and handed to the sink, which
settles it; `expire_head` does the same for the head of the unclaimed backlog when nobody consumes. Lanes
(`Lane`: RocketMQ message groups) are handed out one message at a time, in order, by the store; a message not
yet due (`Due`: RocketMQ delay and timer messages) has its claim hidden until then, so the due time lives in the
store. The node's registry of groups is `gateway.core.consumers.ConsumerGroups`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from tidewire.gateway.core.retry import Backoff, stop_if_cancelled
from tidewire.store.base import Claim, GroupRecord, Message

if TYPE_CHECKING:
    from tidewire.gateway.core.consumers import ConsumerGroups

log = logging.getLogger("tidewire.consumers")

EXPIRED_HOLD_MS = 60_000  # expired messages claimed for the sink stay hidden this long if it never settles them
EXPIRE_BATCH = 500
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
Lane = Callable[[Message], str]  # "": in no lane
Due = Callable[[Message], int]  # ms since the epoch; 0: at once


class GroupReader:
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
                self.groups.consumed(self.name, consumer, batch)
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
        limit = 1  # the head alone first: a queue swept twice a second whose head is fresh reads one message
        while True:
            now = int(self.groups.clock.time() * 1000)
            candidates, upto = await self._read_new(limit, keep_expired=True)
            limit = EXPIRE_BATCH
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
