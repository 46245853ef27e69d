"""A queue's ready backlog: its exact message count, and its length limits (`x-max-length`, `x-max-length-bytes`,
`x-overflow`) as RabbitMQ applies them.

Ready messages are what Queue.Declare-Ok, Basic.Get-Ok, Queue.Purge-Ok and Queue.Delete-Ok count, and what the
limits bound (RabbitMQ leaves out deliveries awaiting their ack): the queue's unclaimed backlog after its cursor
(each message once, however many bindings it matched) plus its claims visible now (`Store.ready_claims`:
requeued or lapsed). Expired messages at the head go first. A queue with one filter holding messages is counted
from the store's queue index (`queue_tail`); several, or a byte count, read the backlog: exact, at the cost of
reading it.

Limits. `drop-head` (the default) dead-letters (reason `maxlen`) or drops the oldest ready messages until the
queue is within its limits; `reject-publish` refuses a publish that would go over (Basic.Nack to a publisher
in confirm mode; `reject-publish-dlx` also dead-letters it). An AMQP publish routed to a limited queue is
checked, stored and made durable before the channel's next command, under a lock per queue on this node, so
one node's publishers see exact limits (a limited queue costs its publishers a store round trip per message).
Messages that reach a limited queue by other ways (MQTT and RocketMQ publishers, dead-lettering) and publishes
through other nodes are trimmed by the node holding the queue's trim lease, in `Queues.sweep` (every
`EXPIRY_CHECK_S`) and before every count. Where RabbitMQ keeps a message refused by one queue for the others it
was routed to, here the whole publish is refused (it is stored once for every queue).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from tidewire.gateway.core.ingress import DurableSink
from tidewire.gateway.protocols.amqp.arguments import QueueArgs
from tidewire.gateway.protocols.amqp.dead_letters import MAXLEN, DeadLetters
from tidewire.store.base import GroupRecord, Message

if TYPE_CHECKING:
    from tidewire.gateway.node import Node

PAGE = 1000  # messages per read when a count reads the backlog
TRIM_LEASE_MS = 3000  # one node trims a queue at a time: two would both drop the same surplus
HOLD_MS = 60_000  # messages claimed to be dropped stay hidden this long if the node dies meanwhile


class Landed:
    """A sink that hands durability on to the publisher's and resolves `future` (the publish is in the queue)."""

    __slots__ = ("future", "sink")

    def __init__(self, sink: DurableSink, future: asyncio.Future[bool]) -> None:
        self.sink = sink
        self.future = future

    def durable(self, tokens: list[Any]) -> None:
        self.sink.durable(tokens)
        if not self.future.done():
            self.future.set_result(True)

    def failed(self, tokens: list[Any], reason: str) -> None:
        self.sink.failed(tokens, reason)
        if not self.future.done():
            self.future.set_result(False)

    def pause_publishes(self) -> None:
        self.sink.pause_publishes()

    def resume_publishes(self) -> None:
        self.sink.resume_publishes()


_EVERY = 1 << 62  # a bound filter's last seq: every message of its queue is the queue's


class Backlog:
    """Counts and limits of the node's AMQP queues (one per server)."""

    def __init__(self, node: Node, dead_letters: DeadLetters) -> None:
        self.node = node
        self.dead_letters = dead_letters
        self._locks: dict[str, asyncio.Lock] = {}  # group → lock of its limited publishes on this node
        self._users: dict[str, int] = {}
        self._leases: dict[str, float] = {}  # group → monotonic time until which this node holds its trim lease

    # --- counting ----------------------------------------------------------------------------------------
    async def ready(self, record: GroupRecord, with_bytes: bool = False) -> tuple[int, int]:
        """(ready messages, their body bytes: 0 unless `with_bytes`), exact; expired messages at the head go
        first (to the dead-letter exchange, if any)."""
        node = self.node
        store = node.store
        await node.groups.expire_head(record.name)
        cursor, _ = await store.group_position(record.name)
        if cursor < 0:
            return 0, 0
        claimed = await store.ready_claims(record.name, int(node.clock.time() * 1000))
        size = 0
        if with_bytes and claimed:
            size = sum(len(m.payload) for m in await store.fetch(claimed))
        if not with_bytes and not record.drains:
            tails = [(await store.queue_tail(f, cursor, 0))[0] for f in record.filters]
            if sum(1 for t in tails if t) <= 1:  # no message counted twice
                return len(claimed) + sum(tails), 0
        seen: set[int] = set()
        # An unbound filter (`drains`) still counts what it routed, up to its last seq.
        sources = [(f, _EVERY) for f in record.filters] + list(record.drains.items())
        for topic_filter, last in sources:
            after = cursor
            while after < last:
                messages, upto = await store.read(topic_filter, after, PAGE)
                for m in messages:
                    if m.seq <= last and m.seq not in seen:
                        seen.add(m.seq)
                        size += len(m.payload)
                if len(messages) < PAGE:
                    break
                after = upto
        return len(claimed) + len(seen), size

    # --- drop-head -----------------------------------------------------------------------------------------
    async def trim(self, record: GroupRecord) -> int:
        """Within its limits again: a drop-head queue's oldest ready messages are dead-lettered (reason maxlen)
        or dropped. Only by the node holding the queue's trim lease. Returns how many went."""
        args = QueueArgs.of(record.attrs)
        if not args.limited or args.overflow != "drop-head" or not await self._hold(record.name):
            return 0
        dropped = 0
        while True:
            count, size = await self.ready(record, args.max_length_bytes is not None)
            over = count - args.max_length if args.max_length is not None else 0
            if args.max_length_bytes is not None and size > args.max_length_bytes:
                over = max(over, 1)  # the head's size is known once it is taken: one at a time
            if over <= 0:
                return dropped
            taken = await self.node.groups.receive(record.name, over, HOLD_MS, 0, counted=False)
            if not taken:
                return dropped
            await self.dead_letters.deliveries(record, taken, MAXLEN)
            dropped += len(taken)

    async def _hold(self, name: str) -> bool:
        clock = self.node.clock
        now = clock.monotonic()
        if self._leases.get(name, 0.0) - now > TRIM_LEASE_MS / 3000:
            return True
        node = self.node
        if await node.store.lease("amqp-trim/" + name, node.node_id, TRIM_LEASE_MS) == 0:
            self._leases.pop(name, None)
            return False
        self._leases[name] = now + TRIM_LEASE_MS / 1000
        return True

    def forget(self, name: str) -> None:
        self._leases.pop(name, None)

    # --- publishing --------------------------------------------------------------------------------------
    def limited(self, topic: str) -> list[GroupRecord]:
        """The AMQP queues with a length limit that a publish on `topic` reaches (as this node knows them)."""
        return [r for r in self.node.groups.routed_groups(topic)
                if r.name.startswith("amqp/") and QueueArgs.of(r.attrs).limited]

    async def publish(self, message: Message, sink: DurableSink, token: Any, records: list[GroupRecord]) -> bool:
        """Publish a message bound for limited queues: refused (`sink.failed`, after dead-lettering it for
        reject-publish-dlx) if one of them refuses publishes and is full, else stored and durable before this
        returns, the drop-head queues trimmed after it. False: refused."""
        names = [r.name for r in records]
        for name in names:
            self._users[name] = self._users.get(name, 0) + 1
        try:
            for name in names:  # in name order (`routed_groups`): no two publishers wait for each other
                await self._locks.setdefault(name, asyncio.Lock()).acquire()
            try:
                return await self._publish_locked(message, sink, token, records)
            finally:
                for name in names:
                    self._locks[name].release()
        finally:
            for name in names:
                self._users[name] -= 1
                if not self._users[name]:
                    del self._users[name]
                    del self._locks[name]

    async def _publish_locked(self, message: Message, sink: DurableSink, token: Any,
                              records: list[GroupRecord]) -> bool:
        for record in records:
            args = QueueArgs.of(record.attrs)
            if args.overflow == "drop-head":
                continue
            count, size = await self.ready(record, args.max_length_bytes is not None)
            if (args.max_length is not None and count >= args.max_length) or (
                    args.max_length_bytes is not None and size + len(message.payload) > args.max_length_bytes):
                if args.overflow == "reject-publish-dlx":
                    await self.dead_letters.messages(record, [message], MAXLEN)
                else:
                    self.node.counters.drop("queue_full")
                sink.failed([token], f"queue '{record.attrs.get('queue', record.name)}' is full")
                return False
        landed: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self.node.publish(message, Landed(sink, landed), token)
        if not await landed:
            return False
        for record in records:
            await self.trim(record)
        return True
