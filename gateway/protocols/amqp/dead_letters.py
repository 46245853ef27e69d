"""Dead-lettering, as RabbitMQ does it: a message rejected without requeue (`rejected`), expired (`expired`) or
pushed out by a length limit (`maxlen`) is republished to the queue's `x-dead-letter-exchange`, with
`x-dead-letter-routing-key` or its own routing key, carrying the `x-death` header.

Store once: the dead-lettered copy is a new append (RabbitMQ republishes too), the original's claim is settled
only once the copy is durable. A node dying in between leaves the claim to lapse: the message is dead-lettered
again (at least once, where RabbitMQ's default is at most once). No dead-letter exchange, or one that does not
exist: the message is dropped, as in RabbitMQ (one a length limit drops is counted as
`tidewire_dropped_total{reason="queue_full"}`).

`x-death` is an array of tables, newest first: reason, queue, time, exchange, routing-keys, count (and
original-expiration when the message had its own). A message dead-lettered again from the same queue for the
same reason has that entry's count raised and moved to the front. `x-first-death-reason`, `-queue` and
`-exchange` are set the first time and kept.

Cycles: a message that went round queues dead-lettering it with no rejection anywhere on the way (expiring in a
queue that dead-letters back to itself, say) is dropped when it comes back to a queue it was dead-lettered from
and is to be dead-lettered again: RabbitMQ drops it as it comes back, here it goes round once more.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tidewire.gateway.core.group_reader import Delivery
from tidewire.gateway.core.ingress import publish_future
from tidewire.gateway.core.tenants import mount_topic, unmount, vhost_mount
from tidewire.gateway.protocols.amqp.arguments import QueueArgs
from tidewire.gateway.protocols.amqp.exchanges import Exchange
from tidewire.gateway.protocols.amqp.mapping import DEATHS, origin, publish_topic
from tidewire.store.base import PROTOCOL_AMQP, GroupRecord, Message
from tidewire.store.properties import Properties

if TYPE_CHECKING:
    from tidewire.gateway.node import Node
    from tidewire.gateway.protocols.amqp.exchanges import Exchanges

REJECTED, EXPIRED, MAXLEN = "rejected", "expired", "maxlen"
FIRST_DEATH = ("x-first-death-reason", "x-first-death-queue", "x-first-death-exchange")


def vhost_of(record: GroupRecord) -> str:
    """`amqp/<vhost>/<queue>`: the vhost may hold '/', the queue name is in attrs."""
    queue = str(record.attrs.get("queue", ""))
    return record.name[len("amqp/"):len(record.name) - len(queue) - 1]


def _deaths(message: Message) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
    """The message's x-death entries and its other user properties."""
    deaths: list[dict[str, Any]] = []
    user: list[tuple[str, str]] = []
    for name, value in Properties.from_block(message.properties).user:
        if name == DEATHS:
            try:
                loaded = json.loads(value)
            except ValueError:
                loaded = []
            deaths = [d for d in loaded if isinstance(d, dict)] if isinstance(loaded, list) else []
        else:
            user.append((name, value))
    return deaths, user


def cyclic(message: Message, queue: str, reason: str) -> bool:
    """Was the message dead-lettered from `queue` before, with no rejection on its way (a cycle to break)?"""
    if reason == REJECTED:
        return False
    deaths, _ = _deaths(message)
    return any(d.get("queue") == queue for d in deaths) and not any(d.get("reason") == REJECTED for d in deaths)


def dead_lettered(message: Message, reason: str, queue: str, target: Exchange, routing_key: str | None,
                  kinds: dict[str, str], now_ms: int, mount: str = "") -> Message:
    """The copy of `message` that `queue` dead-letters to `target` (pure); `mount`: the queue's vhost's."""
    props = Properties.from_block(message.properties)
    exchange, key = origin(unmount(mount, message.topic) if mount else message.topic, kinds)
    deaths, user = _deaths(message)
    now_s = now_ms // 1000
    for i, entry in enumerate(deaths):
        if entry.get("queue") == queue and entry.get("reason") == reason:
            count = entry.get("count")
            entry["count"] = (count if isinstance(count, int) else 0) + 1
            entry["time"] = now_s
            deaths.insert(0, deaths.pop(i))
            break
    else:
        entry = {"count": 1, "reason": reason, "queue": queue, "time": now_s, "exchange": exchange,
                 "routing-keys": [key]}
        if message.expires_at_ms:
            entry["original-expiration"] = str(max(0, message.expires_at_ms - message.timestamp_ms))
        deaths.insert(0, entry)
    present = {name for name, _ in user}
    for name, value in zip(FIRST_DEATH, (reason, queue, exchange), strict=True):
        if name not in present:
            user.append((name, value))
    user.append((DEATHS, json.dumps(deaths, separators=(",", ":"))))
    props.user = user
    props.expiry_interval = None  # RabbitMQ drops the expiration (kept in x-death as original-expiration)
    topic = publish_topic(target.name, target.kind, key if routing_key is None else routing_key)
    if mount:
        topic = mount_topic(mount, topic)
    return Message(topic, message.payload, message.qos, False, props.to_block(), now_ms, 0, "",
                   protocol=PROTOCOL_AMQP)


class DeadLetters:
    """The node's dead-lettering (one per server)."""

    def __init__(self, node: Node, exchanges: Exchanges) -> None:
        self.node = node
        self.exchanges = exchanges

    async def messages(self, record: GroupRecord, messages: Sequence[Message], reason: str) -> None:
        """Republish `messages` of the queue to its dead-letter exchange (if any); returns once they are durable."""
        if not messages:
            return
        args = QueueArgs.of(record.attrs)
        target = None if args.dlx is None else await self.exchanges.get(vhost_of(record), args.dlx)
        if target is None:
            if reason == MAXLEN:
                self.node.counters.drop("queue_full", len(messages))
            return
        now = int(self.node.clock.time() * 1000)
        queue = str(record.attrs.get("queue", ""))
        kept = [m for m in messages if not cyclic(m, queue, reason)]
        if len(kept) < len(messages):
            self.node.counters.drop(reason, len(messages) - len(kept))
        mount = vhost_mount(vhost_of(record))
        copies = [dead_lettered(m, reason, queue, target, args.dlrk, self.exchanges.kinds, now, mount) for m in kept]
        if not copies:
            return
        await asyncio.gather(*publish_future(self.node.publish, copies))

    async def deliveries(self, record: GroupRecord, deliveries: Sequence[Delivery], reason: str) -> None:
        """Dead-letter claimed messages of the queue, then settle their claims."""
        await self.messages(record, [d.message for d in deliveries], reason)
        await self.node.groups.ack(record.name, [(d.claim.seq, d.claim.token) for d in deliveries])

    async def settled(self, record: GroupRecord, handles: Sequence[tuple[int, int]], reason: str) -> None:
        """Dead-letter the messages of these claims (a consumer's Reject/Nack without requeue) and settle them."""
        if QueueArgs.of(record.attrs).dlx is not None:
            messages = await self.node.store.fetch([seq for seq, _ in handles])
            await self.messages(record, messages, reason)
        await self.node.groups.ack(record.name, list(handles))
