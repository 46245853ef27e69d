"""Shared subscriptions: `$share/<group>/<filter>` reads the filter's queue with one cursor for the group and
hands each message to exactly one online member, chosen by the group's strategy among members with credit.

A member's unacknowledged messages return to the group when it disconnects and go to the others first; with
every member offline the group keeps its offset (persisted like a session) and resumes when one returns.

In a cluster one node at a time serves a group (`serving`): the holder of the group's lease in the store,
taken by a node with online members (`gateway.cluster`). It claims the group's record, so a former server's
late offset writes are fenced off, and resumes from the committed offset: what was in flight on a node that
died is delivered again, to the members of the new one.

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
from tidewire.store.base import Message, SessionRecord, SubscriptionRecord

if TYPE_CHECKING:
    from tidewire.cache.queue_cache import QueueCache
    from tidewire.store.base import Store

STRATEGIES = ("least_inflight", "round_robin", "random", "sticky", "hash_clientid", "hash_topic")


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


class GroupOwner(Protocol):
    cache: QueueCache
    store: Store

    def session_dirty(self, session: SharedGroup) -> None: ...


class SharedGroup:
    __slots__ = ("_pull_handle", "_reading", "_rr", "_sticky", "client_id", "cursor", "members", "name", "owner",
                 "persistent", "pull_batch", "queue", "record", "redeliver", "refs", "serving", "strategy", "unacked")

    def __init__(self, owner: GroupOwner, name: str, topic_filter: str, strategy: str, record: SessionRecord,
                 pull_batch: int) -> None:
        self.owner = owner
        self.name = name
        self.queue = topic_filter
        self.client_id = record.client_id  # "$share/<group>/<filter>": its store key, like a session's
        self.record = record
        self.strategy = strategy
        self.pull_batch = pull_batch
        self.persistent = True
        self.cursor = record.offset
        self.members: dict[str, Member] = {}  # online members
        self.refs: set[str] = set()  # client ids with this subscription, online or in a stored session
        self.redeliver: deque[Message] = deque()  # back from a member that left: delivered before new ones
        self.unacked: set[int] = set()
        self.serving = True  # False on a node of a cluster until it holds the group's lease
        self._rr = 0
        self._sticky = ""
        self._reading = False
        self._pull_handle: asyncio.Handle | None = None

    # --- membership -----------------------------------------------------------------------------------
    def join(self, session: GroupMember, sub: SubscriptionRecord) -> None:
        self.refs.add(session.client_id)
        self.members[session.client_id] = (session, sub)
        self.schedule_pull()

    def leave(self, session: GroupMember) -> None:
        member = self.members.get(session.client_id)
        if member is not None and member[0] is session:
            del self.members[session.client_id]

    def committed_offset(self) -> int:
        low = self.cursor
        for seq in self.unacked:
            if seq <= low:
                low = seq - 1
        for message in self.redeliver:
            if message.seq <= low:
                low = message.seq - 1
        return low

    # --- callbacks from members ----------------------------------------------------------------------
    def acked(self, seq: int) -> None:
        self.unacked.discard(seq)
        self.owner.session_dirty(self)
        self.schedule_pull()

    def returned(self, message: Message) -> None:
        self.unacked.discard(message.seq)
        self.redeliver.append(message)
        self.schedule_pull()

    # --- delivery -----------------------------------------------------------------------------------
    def schedule_pull(self) -> None:
        if self._pull_handle is None:
            self._pull_handle = asyncio.get_running_loop().call_soon(self._scheduled_pull)

    def _scheduled_pull(self) -> None:
        self._pull_handle = None
        self.pull()

    def serve(self, record: SessionRecord) -> None:
        """This node serves the group from now on, from the record it claimed."""
        self.record = record
        self.cursor = record.offset
        self.redeliver.clear()
        self.unacked.clear()
        self.serving = True
        self.schedule_pull()

    def stop_serving(self) -> None:
        """Another node serves the group: hand out nothing more (what is in flight is acked or redelivered there)."""
        self.serving = False
        self.redeliver.clear()
        self.unacked.clear()

    def pull(self) -> None:
        if not self.members or self._reading or not self.serving:
            return
        redeliver = self.redeliver
        while redeliver:
            if not self._deliver(redeliver[0]):
                return
            redeliver.popleft()
        got = self.owner.cache.get(self.queue, self.cursor, self.pull_batch)
        if got is None:
            self._reading = True
            asyncio.get_running_loop().create_task(self._pull_from_store())
            return
        self._push(got[0])

    async def _pull_from_store(self) -> None:
        try:
            messages, _ = await self.owner.store.read(self.queue, self.cursor, self.pull_batch)
        except OSError:  # the store is failing (the node's loops log it): try the same read again later
            asyncio.get_running_loop().call_later(STORE_RETRY_S, self.schedule_pull)
            return
        finally:
            self._reading = False
        self._push(messages)

    def _push(self, messages: list[Message]) -> None:
        cursor = self.cursor
        for message in messages:
            if message.seq <= cursor:
                continue  # already handed out while the store read was in progress
            if not self._deliver(message):
                break
            cursor = message.seq
        if cursor != self.cursor:
            self.cursor = cursor
            self.owner.session_dirty(self)
        if len(messages) == self.pull_batch and cursor == messages[-1].seq:
            self.schedule_pull()

    def _deliver(self, message: Message) -> bool:
        """Hand the message to one member; False when no member can take it now (it waits in the store)."""
        member = _CHOOSERS[self.strategy](self, message)
        if member is None:
            return False
        session, sub = member
        qos = message.qos if message.qos < sub.qos else sub.qos
        if session.push_shared(message, qos, sub.subscription_id, self) and qos:
            self.unacked.add(message.seq)
        self._sticky = session.client_id
        return True  # sent, or skipped as expired / too large for that member

    # --- strategies ---------------------------------------------------------------------------------
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
