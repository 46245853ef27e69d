"""Delayed publish (EMQX's `$delayed/<seconds>/<topic>`): parsed here, kept in the store until due, published on
its topic then by whichever node finds it due first.

A delayed message (`Message.due_ms` set by its protocol, after the ACL and the publish hooks, which see its own
topic) is appended at once, as any message, on the internal topic `$TIDEWIRE_DELAYED/<due ms>/<r|n>/
<topic>` (`r`: the message is retained once published; the stored copy never is). No client reaches that topic:
a PUBLISH or SUBSCRIBE there is refused (`reserved`), and MQTT wildcards skip `$` topics. The consumer group
`tidewire/delayed` (`gateway.core.consumers`, as RocketMQ delay messages) reads it on every node: a message not
yet due has its claim hidden in the store until its due time, so the time lives in the store; at that time one
node reclaims it, publishes it on its topic and settles the claim. A restart makes the node's claims visible
again (`ConsumerGroups.load`), a dead node's are released by the survivor that saw it die (`owner_gone`): either
way they are hidden again until due, and published by one node. Between publishing and settling, a node's death
publishes it twice (at least once).

The pending count that bounds them (`delayed_max_messages`) is the store's count of the group's claims, read at
most once a second, plus what this node took since: a bound that holds within a second's publishes.

The parsing (`parse_delayed`) and the naming are pure; `DelayedPublishes` is the node's consumer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tidewire.gateway.core.group_reader import Delivery
from tidewire.gateway.core.ingress import publish_future
from tidewire.store.base import GroupRecord, Message, PendingClaim

if TYPE_CHECKING:
    from tidewire.gateway.core.clock import Clock
    from tidewire.gateway.core.consumers import ConsumerGroups
    from tidewire.store.base import Store

log = logging.getLogger("tidewire.delayed")

DELAYED_PREFIX = "$delayed/"
RESERVED_PREFIX = "$TIDEWIRE_DELAYED/"
GROUP = "tidewire/delayed"
MAX_INTERVAL = 4294967  # s: EMQX's; a value at or above it is a Unix time (s), as in EMQX
IN_FLIGHT = 1000  # due messages one node publishes at a time
HOLD_MS = 30_000  # a due message a node took stays hidden this long from the others while it publishes it
COUNT_EVERY_S = 1.0


@dataclass(frozen=True, slots=True)
class Delay:
    """A `$delayed/...` topic understood: the topic to publish on and when (ms since the epoch)."""

    topic: str
    due_ms: int


@dataclass(frozen=True, slots=True)
class BadDelay:
    """A `$delayed/...` topic refused: why (for the log)."""

    reason: str


def parse_delayed(topic: str, now_ms: int, max_seconds: int) -> Delay | BadDelay | None:
    """`$delayed/<seconds>/<topic>` (or `$delayed/<unix time>/<topic>`, EMQX's form for values of 4294967 and
    more): when and where to publish; None: not a delayed topic. An interval that is no whole number, a missing
    topic, a time in the past or a delay over `max_seconds` is refused."""
    if not topic.startswith(DELAYED_PREFIX):
        return None
    interval, sep, real = topic[len(DELAYED_PREFIX) :].partition("/")
    if not sep or not real:
        return BadDelay("no topic after the delay")
    if not interval.isascii() or not interval.isdigit() or len(interval) > 12:
        return BadDelay(f"delay {interval[:20]!r} is not a whole number of seconds")
    value = int(interval)
    if value < MAX_INTERVAL:
        delay_ms = value * 1000
    else:
        delay_ms = value * 1000 - now_ms
        if delay_ms < 0:
            return BadDelay("the publish time is past")
    if delay_ms > max_seconds * 1000:
        return BadDelay(f"delay over {max_seconds} s")
    return Delay(real, now_ms + delay_ms)


def reserved(topic: str) -> bool:
    """The internal topic of waiting delayed messages (or a filter over it): no client publishes or reads there."""
    return topic.startswith(RESERVED_PREFIX[:-1])


def held_form(message: Message, due_ms: int) -> Message:
    """The message as it waits in the store (its own topic and retain flag carried in the internal topic)."""
    flag = "r" if message.retain else "n"
    message.topic = f"{RESERVED_PREFIX}{due_ms}/{flag}/{message.topic}"
    message.retain = False
    message.due_ms = 0
    return message


def unpack(stored_topic: str) -> tuple[int, bool, str] | None:
    """(due ms, retain, topic) of a waiting message's internal topic; None: not one."""
    if not stored_topic.startswith(RESERVED_PREFIX):
        return None
    due, _, rest = stored_topic[len(RESERVED_PREFIX) :].partition("/")
    flag, _, topic = rest.partition("/")
    if not due.isdigit() or flag not in ("r", "n") or not topic:
        return None
    return int(due), flag == "r", topic


def due_of(message: Message) -> int:
    """When a waiting message is due (ms); 0 (at once) for one that does not parse."""
    parsed = unpack(message.topic)
    return parsed[0] if parsed is not None else 0


def released_form(message: Message, now_ms: int) -> Message | None:
    """The message to publish on its topic at its time; None: not a waiting message."""
    parsed = unpack(message.topic)
    if parsed is None:
        return None
    _, retain, topic = parsed
    return Message(topic, message.payload, message.qos, retain, message.properties, now_ms, message.expires_at_ms,
                   message.publisher)


@dataclass(frozen=True, slots=True)
class Waiting:
    """A delayed message not yet published, for operators."""

    seq: int
    topic: str
    due_ms: int
    publisher: str
    published_ms: int
    qos: int
    retain: bool
    holder: str  # the node whose claim hides it until due ("": none yet)


class DelayedPublishes:
    """The node's consumer of the delayed group: publishes what is due, counts what waits, lists and cancels."""

    def __init__(self, store: Store, groups: ConsumerGroups, clock: Clock,
                 publish: Callable[..., None], spawn: Callable[[Any], None], max_messages: int) -> None:
        self.store = store
        self.groups = groups
        self.clock = clock
        self.publish = publish  # Node.publish
        self.spawn = spawn
        self.max_messages = max_messages
        self.visibility_ms = HOLD_MS  # `Consumer`
        self._in_flight = 0
        self._counted = 0  # the group's pending claims at the last count
        self._taken = 0  # delayed messages accepted here since the last count started
        self._taken_before = 0  # ... and in the second before it (maybe not in the count yet)
        self._counted_at = -COUNT_EVERY_S
        self._counting = False
        self.published = 0

    async def start(self) -> None:
        """Declare the group (once for the cluster) and consume it on this node."""
        await self.groups.declare(GroupRecord(GROUP, [RESERVED_PREFIX + "#"], durable=True,
                                              attrs={"feature": "delayed publish"}))
        self.groups.kinds(GROUP, None, due_of)
        self.groups.consume(GROUP, self)

    # --- the bound ----------------------------------------------------------------------------------------
    def admit(self) -> bool:
        """May one more delayed message be taken (`delayed_max_messages`)? Counted as taken when it may. The
        estimate errs high: what was taken before a count is added to it until the next count."""
        now = self.clock.monotonic()
        if now - self._counted_at >= COUNT_EVERY_S and not self._counting:
            self._counting = True
            self._counted_at = now
            self._taken_before, self._taken = self._taken, 0
            self.spawn(self._count())
        if self._counted + self._taken_before + self._taken >= self.max_messages:
            return False
        self._taken += 1
        return True

    async def _count(self) -> None:
        try:
            _, pending = await self.store.group_position(GROUP)
            self._counted = pending
        except Exception as exc:
            log.warning("delayed.count_failed", extra={"error": str(exc)})
        finally:
            self._counting = False

    # --- `Consumer` of the group ------------------------------------------------------------------------------
    def credit(self) -> int:
        return IN_FLIGHT - self._in_flight

    def deliver(self, deliveries: list[Delivery]) -> None:
        now_ms = int(self.clock.time() * 1000)
        ready: list[Message] = []
        handles: list[tuple[int, int]] = []
        for message, claim in deliveries:
            released = released_form(message, now_ms)
            if released is not None:
                ready.append(released)
            handles.append((claim.seq, claim.token))
        self._in_flight += len(deliveries)
        self.spawn(self._settle(ready, handles))

    async def _settle(self, ready: list[Message], handles: list[tuple[int, int]]) -> None:
        try:
            if ready:
                await asyncio.gather(*publish_future(self.publish, ready))
            await self.groups.ack(GROUP, handles)  # a failure leaves the claims to lapse: published again then
            self.published += len(ready)
        finally:
            self._in_flight -= len(handles)
            self.groups.wake(GROUP)

    # --- operators ----------------------------------------------------------------------------------------
    async def waiting(self, after_seq: int, limit: int) -> list[Waiting]:
        """Delayed messages not yet published, in the order they were taken, after `after_seq`."""
        claims = await self.store.pending_claims(GROUP, after_seq, limit)
        messages = {m.seq: m for m in await self.store.fetch([c.seq for c in claims])}
        found: list[Waiting] = []
        for claim in claims:
            message = messages.get(claim.seq)
            parsed = unpack(message.topic) if message is not None else None
            if message is None or parsed is None:
                continue
            due, retain, topic = parsed
            found.append(Waiting(claim.seq, topic, due, message.publisher, message.timestamp_ms, message.qos,
                                 retain, claim.owner))
        return found

    async def cancel(self, seq: int) -> bool:
        """Drop a waiting delayed message; False: none with that seq waits (published, cancelled, unknown)."""
        claims: list[PendingClaim] = await self.store.pending_claims(GROUP, seq - 1, 1)
        if not claims or claims[0].seq != seq:
            return False
        return bool(await self.groups.ack(GROUP, [(seq, claims[0].token)]))
