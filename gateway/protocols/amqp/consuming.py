"""One channel's consuming side: consumers (Basic.Consume) over `node.groups`, Basic.Get, delivery tags, acks.

Basic.Qos prefetch is the credit of `gateway.core.group_reader.Consumer`: a consumer takes `prefetch - unacked` (its
own prefetch, or `amqp_max_unacked` for prefetch 0), within the channel's shared limit when Qos was global. A
no-ack consumer takes a batch at a time while the socket drains (the write buffer is its only limit) and its
deliveries are settled as they are sent. A delivery's tag maps to its claim (group, seq, token): Ack settles
it, Nack/Reject with requeue gives it back (redelivered: the claim's delivery count goes above 1), without
requeue dead-letters it (`dead_letters`, reason `rejected`) and settles it. Closing the channel requeues what
it left unacked.

With the lake on (`node.events`), each Basic.Deliver / Get-Ok is recorded as `delivered` (dup: a redelivery), each
settled Ack as `acked` and each reject without requeue as `dropped` (reason `rejected`), under the connection's
id with the queue and the consumer tag (`pipeline.lake.schema`).

Consumer timeout, as RabbitMQ: a delivery (Basic.Deliver or Get-Ok) not acked within the queue's
`x-consumer-timeout` or the node's `consumer_timeout` closes the channel with 406 PRECONDITION_FAILED
(`overdue`, checked on the connection's tick), which requeues what it held. Its claim stays hidden a little
longer than that (`CLAIM_MARGIN_MS`), so no other consumer gets the message while the channel still holds it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, NamedTuple

from pamqp import commands

from tidewire.gateway.core.group_reader import Delivery
from tidewire.gateway.core.tenants import unmount
from tidewire.gateway.protocols.amqp.codec import PRECONDITION_FAILED, Fault, Method, fault
from tidewire.gateway.protocols.amqp.dead_letters import REJECTED
from tidewire.gateway.protocols.amqp.mapping import origin, properties_out
from tidewire.pipeline.lake.event_names import ACKED, DELIVERED, DROPPED
from tidewire.store.base import Message

if TYPE_CHECKING:
    from tidewire.gateway.protocols.amqp.connection import AmqpConnection

Basic = commands.Basic
CLAIM_MARGIN_MS = 5_000  # a claim outlives its consumer timeout by this: the channel is closed first


class Unacked(NamedTuple):
    group: str
    seq: int
    token: int
    consumer: AmqpConsumer | None  # None: a Basic.Get
    due: float  # the consumer timeout: monotonic time by which it must be acked
    topic: str  # the message's, for its `acked` event
    queue: str  # its name as the client knows it (`group` is the store's), for its events


class AmqpConsumer:
    """A Basic.Consume: a competing consumer of the queue's group (`gateway.core.group_reader.Consumer`)."""

    __slots__ = ("active", "channel", "group", "member", "no_ack", "prefetch", "queue", "tag", "unacked",
                 "visibility_ms")

    def __init__(self, channel: Deliveries, tag: str, queue: str, group: str, no_ack: bool, member: str,
                 prefetch: int, visibility_ms: int) -> None:
        self.channel = channel
        self.tag = tag
        self.queue = queue
        self.group = group
        self.no_ack = no_ack
        self.member = member  # its id among the queue's consumers in the store (`Queues.join`)
        self.prefetch = prefetch
        self.visibility_ms = visibility_ms
        self.unacked = 0
        self.active = True

    def credit(self) -> int:
        return self.channel.credit_for(self)

    def deliver(self, deliveries: list[Delivery]) -> None:
        self.channel.deliver(self, deliveries)

    def server_cancel(self) -> None:
        self.channel.server_cancel(self)


class Deliveries:
    """Consumers, delivery tags and unacked deliveries of one channel."""

    def __init__(self, conn: AmqpConnection, number: int) -> None:
        self.conn = conn
        self.number = number
        self.next_tag = 1
        self.unacked: dict[int, Unacked] = {}  # delivery tag → claim, in tag order
        self.consumers: dict[str, AmqpConsumer] = {}
        self.prefetch = 0  # Basic.Qos global=False: for consumers started from now on
        self.channel_prefetch = 0  # Basic.Qos global=True: shared by the channel's consumers; 0: no limit
        self.closed = False
        settings = conn.node.settings
        self.max_unacked = settings.amqp_max_unacked
        self.batch = settings.pull_batch
        self.timeout_ms = settings.consumer_timeout * 1000  # unless the queue has x-consumer-timeout

    # --- the Consumer protocol, for node.groups ----------------------------------------------------------
    def credit_for(self, consumer: AmqpConsumer) -> int:
        if self.closed or not consumer.active or not self.conn.writable:
            return 0
        if consumer.no_ack:
            return self.batch
        credit = (consumer.prefetch or self.max_unacked) - consumer.unacked
        if self.channel_prefetch:
            credit = min(credit, self.channel_prefetch - len(self.unacked))
        return max(0, credit)

    def deliver(self, consumer: AmqpConsumer, batch: list[Delivery]) -> None:
        conn = self.conn
        if self.closed or not consumer.active or not conn.core.channel_open(self.number):
            conn.spawn(conn.node.groups.requeue(consumer.group, [(d.claim.seq, d.claim.token) for d in batch]))
            return
        settled: list[tuple[int, int]] = []
        due = conn.clock.monotonic() + self._timeout_ms(consumer.group) / 1000
        events = conn.node.events
        now_ms = int(conn.clock.time() * 1000)
        for message, claim in batch:
            tag = self._tag()
            redelivered = claim.deliveries > 1
            self._send(Basic.Deliver(consumer.tag, tag, redelivered, *self._origin(message.topic)), message)
            if events is not None:
                events.add(DELIVERED, now_ms, conn.id, "amqp", message.topic, claim.seq, None, redelivered,
                           consumer_group=consumer.queue, consumer_tag=consumer.tag)
            if consumer.no_ack:
                settled.append((claim.seq, claim.token))
            else:
                self.unacked[tag] = Unacked(consumer.group, claim.seq, claim.token, consumer, due, message.topic,
                                            consumer.queue)
                consumer.unacked += 1
        if settled:
            conn.spawn(conn.node.groups.ack(consumer.group, settled))
            conn.node.groups.wake(consumer.group)  # its credit never runs out: ask for the next batch

    def _timeout_ms(self, group: str) -> int:
        return self.conn.server.queues.args(group).consumer_timeout_ms or self.timeout_ms

    def overdue(self, now: float) -> Fault | None:
        """A delivery past its consumer timeout (the channel must close), or None."""
        for item in self.unacked.values():
            if item.due <= now:
                return Fault(PRECONDITION_FAILED, f"delivery acknowledgement on channel {self.number} timed out. "
                                                  f"Timeout value used: {self._timeout_ms(item.group)} ms. This "
                                                  "timeout value can be configured, see consumers doc guide to "
                                                  "learn more")
        return None

    def _origin(self, topic: str) -> tuple[str, str]:
        mount = self.conn.mount
        return origin(unmount(mount, topic) if mount else topic, self.conn.server.exchanges.kinds)

    def _tag(self) -> int:
        tag = self.next_tag
        self.next_tag += 1
        return tag

    def _send(self, method: Method, message: Message) -> None:
        self.conn.core.send_content(self.number, method, properties_out(message, int(self.conn.clock.time() * 1000)),
                                    message.payload)

    def server_cancel(self, consumer: AmqpConsumer) -> None:
        """The queue was deleted: Basic.Cancel to a client that understands it (consumer_cancel_notify)."""
        if self.consumers.pop(consumer.tag, None) is None:
            return
        consumer.active = False
        self.conn.node.groups.cancel(consumer.group, consumer)
        core = self.conn.core
        if core.channel_open(self.number) and core.client.capabilities.get("consumer_cancel_notify"):
            core.send_method(self.number, Basic.Cancel(consumer.tag))

    # --- commands ----------------------------------------------------------------------------------------
    def consume(self, group: str, queue: str, tag: str, no_ack: bool, member: str) -> None:
        """Start a consumer already registered as `member` of the queue (`Queues.join`)."""
        visibility_ms = self._timeout_ms(group) + CLAIM_MARGIN_MS
        consumer = AmqpConsumer(self, tag, queue, group, no_ack, member, self.prefetch, visibility_ms)
        self.consumers[tag] = consumer
        self.conn.server.queues.local_consumers.setdefault(group, set()).add(consumer)
        self.conn.node.groups.consume(group, consumer)

    async def cancel(self, tag: str) -> None:
        consumer = self.consumers.pop(tag, None)
        if consumer is not None:
            await self._stop(consumer)

    async def _stop(self, consumer: AmqpConsumer) -> None:
        consumer.active = False
        server = self.conn.server
        self.conn.node.groups.cancel(consumer.group, consumer)
        local = server.queues.local_consumers.get(consumer.group)
        if local is not None:
            local.discard(consumer)
            if not local:
                del server.queues.local_consumers[consumer.group]
        server.queues.touch(consumer.group)
        await server.queues.leave(consumer.group, consumer.member)  # (an auto-delete queue's last goes with it)

    async def get(self, group: str, queue: str, no_ack: bool, remaining: Callable[[], Awaitable[int]]) -> None:
        """Basic.Get: one message claimed now (Get-Ok counts the ready messages left), or Get-Empty."""
        node = self.conn.node
        timeout_ms = self._timeout_ms(group)
        got = await node.groups.receive(group, 1, timeout_ms + CLAIM_MARGIN_MS, 0)
        if not got:
            self.conn.core.send_method(self.number, Basic.GetEmpty())
            return
        message, claim = got[0]
        if self.closed or not self.conn.core.channel_open(self.number):
            await node.groups.requeue(group, [(claim.seq, claim.token)])
            return
        if no_ack:
            await node.groups.ack(group, [(claim.seq, claim.token)])
        count = await remaining()
        if self.closed or not self.conn.core.channel_open(self.number):
            if not no_ack:
                await node.groups.requeue(group, [(claim.seq, claim.token)])
            return
        tag = self._tag()
        redelivered = claim.deliveries > 1
        self._send(Basic.GetOk(tag, redelivered, *self._origin(message.topic), message_count=count), message)
        events = node.events
        if events is not None:
            events.add(DELIVERED, int(self.conn.clock.time() * 1000), self.conn.id, "amqp", message.topic, claim.seq,
                       None, redelivered, consumer_group=queue)
        if not no_ack:
            self.unacked[tag] = Unacked(group, claim.seq, claim.token, None,
                                        self.conn.clock.monotonic() + timeout_ms / 1000, message.topic, queue)

    def qos(self, count: int, shared: bool) -> None:
        if shared:
            self.channel_prefetch = count
        else:
            self.prefetch = count
        self._wake(self.consumers.values())

    async def settle(self, tag: int, multiple: bool, requeue: bool | None, method: Method) -> Fault | None:
        """Ack (`requeue` None), Nack or Reject (requeue or drop) of `tag` (and all below it with `multiple`)."""
        taken: list[Unacked] = []
        if multiple:
            if tag != 0 and tag not in self.unacked:
                return fault(PRECONDITION_FAILED, f"unknown delivery tag {tag}", method)
            for key in list(self.unacked):
                if tag != 0 and key > tag:
                    break
                taken.append(self.unacked.pop(key))
        else:
            one = self.unacked.pop(tag, None)
            if one is None:
                return fault(PRECONDITION_FAILED, f"unknown delivery tag {tag}", method)
            taken.append(one)
        await self._give(taken, requeue=bool(requeue), acked=requeue is None)
        return None

    async def recover(self) -> None:
        """Basic.Recover: every unacked delivery of the channel goes back to its queue."""
        taken = list(self.unacked.values())
        self.unacked.clear()
        await self._give(taken, requeue=True)

    async def _give(self, taken: list[Unacked], requeue: bool, acked: bool = False) -> None:
        by_group: dict[str, list[tuple[int, int]]] = {}
        consumers: set[AmqpConsumer] = set()
        for item in taken:
            by_group.setdefault(item.group, []).append((item.seq, item.token))
            if item.consumer is not None:
                item.consumer.unacked -= 1
                consumers.add(item.consumer)
        groups = self.conn.node.groups
        dead_letters = self.conn.server.queues.dead_letters
        settled: set[int] = set()
        for group, handles in by_group.items():
            record = groups.known(group)
            if requeue:
                await groups.requeue(group, handles)
            elif acked or record is None:
                settled.update(await groups.ack(group, handles))
            else:
                await dead_letters.settled(record, handles, REJECTED)
        if not requeue:
            self._record_settled(taken, settled if acked else None)
        self._wake(self.consumers.values() if self.channel_prefetch else consumers)

    def _record_settled(self, taken: list[Unacked], acked: set[int] | None) -> None:
        """`acked` for what an Ack settled (a lapsed claim's ack settles nothing: not recorded), else `dropped`
        (rejected without requeue)."""
        events = self.conn.node.events
        if events is None:
            return
        now_ms = int(self.conn.clock.time() * 1000)
        for item in taken:
            tag = item.consumer.tag if item.consumer is not None else None
            if acked is None:
                events.add(DROPPED, now_ms, self.conn.id, "amqp", item.topic, item.seq, None, reason=REJECTED,
                           consumer_group=item.queue, consumer_tag=tag)
            elif item.seq in acked:
                events.add(ACKED, now_ms, self.conn.id, "amqp", item.topic, item.seq, None, consumer_group=item.queue,
                           consumer_tag=tag)

    def _wake(self, consumers: Iterable[AmqpConsumer]) -> None:
        groups = self.conn.node.groups
        for group in {c.group for c in consumers if c.active}:
            groups.wake(group)

    def wake_all(self) -> None:
        self._wake(self.consumers.values())

    async def close(self) -> None:
        """The channel is gone: its consumers stop, what it left unacked goes back to the queues."""
        self.closed = True
        consumers = list(self.consumers.values())
        self.consumers.clear()
        for consumer in consumers:
            await self._stop(consumer)
        taken = list(self.unacked.values())
        self.unacked.clear()
        by_group: dict[str, list[tuple[int, int]]] = {}
        for item in taken:
            by_group.setdefault(item.group, []).append((item.seq, item.token))
        for group, handles in by_group.items():
            await self.conn.node.groups.requeue(group, handles)
