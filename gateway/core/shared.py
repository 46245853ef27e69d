"""Shared subscriptions: `$share/<group>/<filter>` is a consumer group of the store (`gateway.core.consumers`)
named after the subscription; on every node its members there are one competing consumer of that group.

The group's messages are claimed in the store, each seq by one node, so members on every node receive and each
message goes to exactly one of them. A node claims as much as its members have credit for and hands each
message to one member, chosen by the group's strategy among this node's members. A member's PUBACK (QoS 1) or
PUBREC (QoS 2) settles the claim; a QoS 0 delivery settles at once. A member that disconnects gives its
unacknowledged messages back: visible again at once, they are reclaimed before anything new, by the members
still connected here or elsewhere. A node that dies keeps its claims until the cluster declares it dead
(`ConsumerGroups.owner_gone`), or until it restarts (`ConsumerGroups.load`); then they go to the others.

MQTT has no visibility timeout: a claim stays with its node as long as the node lives (`HOLD_MS`), however slow
the member. With every member offline nobody claims: the group keeps its position (its `GroupRecord` cursor)
and resumes when one returns.

Members are whatever satisfies `GroupMember` (MQTT sessions, `gateway.sessions.session.Session`): a group knows
nothing of a protocol.
"""

from __future__ import annotations

import asyncio
import random
import zlib
from collections import deque
from collections.abc import Callable
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING, Protocol

from tidewire.gateway.core.retry import STORE_RETRY_S
from tidewire.store.base import GroupRecord, Message, SubscriptionRecord

if TYPE_CHECKING:
    from tidewire.gateway.core.consumers import ConsumerGroups
    from tidewire.gateway.core.group_reader import Delivery

STRATEGIES = ("least_inflight", "round_robin", "random", "sticky", "hash_clientid", "hash_topic")

# How long a claim handed to a member stays hidden from the other consumers: for as long as its node lives. A
# node's claims are released when it restarts or is declared dead, a member's when it disconnects: MQTT has no
# visibility timeout, so a slow but connected member is never overtaken by a redelivery to another.
HOLD_MS = 10 * 365 * 24 * 3600 * 1000


class MemberLink(Protocol):
    """A member's connection, as far as its group looks at it."""

    @property
    def paused(self) -> bool: ...


class GroupMember(Protocol):
    """What a group needs of a member."""

    @property
    def client_id(self) -> str: ...

    @property
    def conn(self) -> MemberLink | None: ...

    def credit(self) -> int:
        """Free in-flight slots for QoS 1/2 (0 while it cannot take more)."""

    def push_shared(self, message: Message, qos: int, sub_id: int, group: SharedGroup) -> bool:
        """Deliver `message`, chosen for this member by `group`. True: sent (at QoS 1/2 the member tells the group
        `acked` or `returned` later); False: not sent (expired, too large for it), nothing more to hear of it."""


Member = tuple[GroupMember, SubscriptionRecord]


def parse_shared(topic_filter: str) -> tuple[str, str] | None:
    """`$share/<group>/<filter>` → (group, filter); None if it is not a valid shared subscription."""
    parts = topic_filter.split("/", 2)
    if len(parts) != 3 or parts[0] != "$share" or not parts[1] or "+" in parts[1] or "#" in parts[1]:
        return None
    return parts[1], parts[2]


def strategy_for(group: str, default: str, per_pattern: dict[str, str]) -> str:
    for pattern, strategy in per_pattern.items():
        if fnmatchcase(group, pattern):
            return strategy
    return default


def group_record(key: str) -> GroupRecord:
    """The store's consumer group of subscription `key` (`$share/<group>/<filter>`), as first declared."""
    parsed = parse_shared(key)
    assert parsed is not None
    return GroupRecord(key, [parsed[1]], durable=True, attrs={"mqtt_shared": True})


class SharedGroup:
    """This node's members of one `$share` group: one `Consumer` of the store's group `key`."""

    __slots__ = ("_flushing", "_giving_back", "_rr", "_settling", "_sticky", "consuming", "groups", "key",
                 "members", "name", "opened", "pull_batch", "queue", "refs", "strategy", "tokens", "visibility_ms",
                 "waiting")

    def __init__(self, groups: ConsumerGroups, key: str, strategy: str, pull_batch: int) -> None:
        parsed = parse_shared(key)
        assert parsed is not None
        self.groups = groups
        self.key = key  # "$share/<group>/<filter>": the store group's name
        self.name, self.queue = parsed
        self.strategy = strategy
        self.pull_batch = pull_batch
        self.visibility_ms = HOLD_MS
        self.members: dict[str, Member] = {}  # online members on this node
        self.refs: set[str] = set()  # client ids here with this subscription, online or in a stored session
        self.tokens: dict[int, int] = {}  # seq -> claim token of what a member here has unacknowledged
        self.waiting: deque[Delivery] = deque()  # claimed for this node, no member could take it yet
        self.opened = False  # the store group is declared (`open`): claims can be made
        self.consuming = False  # registered with `groups` as a consumer
        self._settling: list[tuple[int, int]] = []  # acknowledged, to settle in the store
        self._giving_back: list[tuple[int, int]] = []  # returned by a member that left, to make visible again
        self._flushing = False  # a store call of `_flush` is under way
        self._rr = 0
        self._sticky = ""

    # --- the store group ----------------------------------------------------------------------------------
    async def open(self) -> None:
        """Declare the store group unless it exists (a new one starts at the log's end), then consume it."""
        await self.groups.declare(group_record(self.key))
        self.opened = True
        self._consume()

    def _consume(self) -> None:
        want = self.opened and bool(self.members)
        if want and not self.consuming:
            self.consuming = self.groups.consume(self.key, self)
        elif not want and self.consuming:
            self.consuming = False
            self.groups.cancel(self.key, self)

    # --- membership -----------------------------------------------------------------------------------
    def join(self, session: GroupMember, sub: SubscriptionRecord) -> None:
        self.refs.add(session.client_id)
        self.members[session.client_id] = (session, sub)
        self._consume()
        self.schedule_pull()

    def leave(self, session: GroupMember) -> None:
        member = self.members.get(session.client_id)
        if member is not None and member[0] is session:
            del self.members[session.client_id]
            if not self.members:
                self._consume()
                if self.waiting:  # nobody here to take them: to the members on other nodes now
                    self._giving_back += [(d.claim.seq, d.claim.token) for d in self.waiting]
                    self.waiting.clear()
                    self._schedule_flush()

    def leave_all(self) -> None:
        """No session here holds the group any more."""
        for session, _ in list(self.members.values()):
            self.leave(session)

    # --- the `Consumer` of `gateway.core.consumers` --------------------------------------------------------
    def credit(self) -> int:
        """What this node's members can take now (a QoS 0 member: a batch), less what waits for them already."""
        total = 0
        for session, sub in self.members.values():
            conn = session.conn
            if conn is None or conn.paused:
                continue
            total += session.credit() if sub.qos else self.pull_batch
            if total >= self.pull_batch:
                total = self.pull_batch
                break
        return total - len(self.waiting)

    def deliver(self, deliveries: list[Delivery]) -> None:
        self.waiting.extend(deliveries)
        self._hand_out()

    # --- callbacks from members ----------------------------------------------------------------------
    def acked(self, seq: int) -> None:
        token = self.tokens.pop(seq, None)
        if token is not None:
            self._settling.append((seq, token))
            self._schedule_flush()
        self.schedule_pull()

    def returned(self, message: Message) -> None:
        token = self.tokens.pop(message.seq, None)
        if token is not None:
            self._giving_back.append((message.seq, token))
            self._schedule_flush()

    # --- delivery -----------------------------------------------------------------------------------
    def schedule_pull(self) -> None:
        """A member may take more: what waits here first, then what the group has for this node."""
        if self.waiting:
            self._hand_out()
        if self.consuming:
            self.groups.wake(self.key)

    def _hand_out(self) -> None:
        waiting = self.waiting
        while waiting:
            delivery = waiting[0]
            message = delivery.message
            member = _CHOOSERS[self.strategy](self, message)
            if member is None:
                return  # it waits (claimed by this node) for a member with credit
            waiting.popleft()
            session, sub = member
            qos = message.qos if message.qos < sub.qos else sub.qos
            claim = delivery.claim
            if session.push_shared(message, qos, sub.subscription_id, self) and qos:
                self.tokens[claim.seq] = claim.token
            else:  # sent at QoS 0, or skipped (expired, too large for that member): done with
                self._settling.append((claim.seq, claim.token))
                self._schedule_flush()
            self._sticky = session.client_id

    def _schedule_flush(self) -> None:
        if not self._flushing:
            self._flushing = True
            self.groups.spawn(self._flush())

    async def _flush(self) -> None:
        """One store call at a time: what is acknowledged or given back meanwhile goes in the next one."""
        try:
            while self._settling or self._giving_back:
                if self._giving_back:
                    handles, self._giving_back = self._giving_back, []
                    await self._store_call(handles, settle=False)
                if self._settling:
                    handles, self._settling = self._settling, []
                    await self._store_call(handles, settle=True)
        finally:
            self._flushing = False

    async def _store_call(self, handles: list[tuple[int, int]], settle: bool) -> None:
        while True:
            try:
                if settle:
                    await self.groups.ack(self.key, handles)
                else:
                    await self.groups.requeue(self.key, handles)
                return
            except OSError:  # the store is failing (the node's loops log it): the claims stay ours meanwhile
                await asyncio.sleep(STORE_RETRY_S)

    # --- strategies: among this node's members --------------------------------------------------------------
    def _ready(self, message: Message) -> list[Member]:
        ready: list[Member] = []
        for member in self.members.values():
            session, sub = member
            conn = session.conn
            if conn is None or conn.paused:
                continue
            if (message.qos and sub.qos) and session.credit() <= 0:
                continue
            ready.append(member)
        return ready

    def _least_inflight(self, message: Message) -> Member | None:
        ready = self._ready(message)
        return max(ready, key=lambda m: m[0].credit()) if ready else None

    def _round_robin(self, message: Message) -> Member | None:
        ready = self._ready(message)
        if not ready:
            return None
        self._rr += 1
        return ready[self._rr % len(ready)]

    def _random(self, message: Message) -> Member | None:
        ready = self._ready(message)
        return random.choice(ready) if ready else None

    def _sticky_choice(self, message: Message) -> Member | None:
        ready = self._ready(message)
        for member in ready:
            if member[0].client_id == self._sticky:
                return member
        return ready[0] if ready else None

    def _hashed(self, key: str) -> Member | None:
        # The member is fixed by the key; if it has no credit the message waits for it (order per key kept).
        members = sorted(self.members)
        if not members:
            return None
        member = self.members[members[zlib.crc32(key.encode()) % len(members)]]
        session = member[0]
        if session.conn is None or session.conn.paused or session.credit() <= 0:
            return None
        return member

    def _hash_clientid(self, message: Message) -> Member | None:
        return self._hashed(message.publisher)

    def _hash_topic(self, message: Message) -> Member | None:
        return self._hashed(message.topic)


_CHOOSERS: dict[str, Callable[[SharedGroup, Message], Member | None]] = {
    "least_inflight": SharedGroup._least_inflight,
    "round_robin": SharedGroup._round_robin,
    "random": SharedGroup._random,
    "sticky": SharedGroup._sticky_choice,
    "hash_clientid": SharedGroup._hash_clientid,
    "hash_topic": SharedGroup._hash_topic,
}
