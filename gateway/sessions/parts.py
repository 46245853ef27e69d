"""What a session is made of besides itself: the in-flight entry, the merge of its queues, and the protocols of
its connection, its node and the shared-subscription group of a message in flight."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from tidewire.gateway.protocols.mqtt.codec import pubrel
from tidewire.gateway.protocols.mqtt.outbound import encoded_publish_with, with_dup
from tidewire.pipeline.lake.event_names import DELIVERED
from tidewire.store.base import Message, Store, SubscriptionRecord

if TYPE_CHECKING:
    from tidewire.cache.queue_cache import QueueCache
    from tidewire.gateway.core.clock import Clock
    from tidewire.gateway.core.event_buffer import EventBuffer
    from tidewire.gateway.core.tenants import Tenant
    from tidewire.gateway.ops.sys_topics import Counters
    from tidewire.gateway.sessions.session import Session


Delivery = tuple[int, bool, tuple[int, ...]]  # qos (-1: skip), retain flag, subscription identifiers


class Writer(Protocol):
    """The connection side a session pushes to."""

    paused: bool
    alias_max: int  # the client's Topic Alias Maximum (0: none)
    max_packet: int  # the client's Maximum Packet Size (0: no limit)
    mount: str  # its tenant's mount point, taken off the topics it is sent ("": the default tenant)
    tenant: Tenant | None  # its tenant (counts what it is sent); None: the default tenant

    def write_chunks(self, chunks: list[bytes]) -> None: ...


class GroupHandle(Protocol):
    """The shared-subscription group a message in flight belongs to."""

    def acked(self, seq: int) -> None: ...

    def returned(self, message: Message) -> None: ...


class SessionOwner(Protocol):
    """What a session needs from its node."""

    node_id: str  # the owner of the record a session started clean makes when it needs one
    cache: QueueCache
    store: Store
    events: EventBuffer | None  # session and delivery events for an exporter (None: not recorded)
    counters: Counters  # drops by reason
    clock: Clock  # in-flight send times (3.1.1 retry), delivery events' timestamps, message expiry

    def session_dirty(self, session: Session) -> None: ...

    def save_then(self, session: Session, then: Callable[[], None]) -> None:
        """Save the session's record now and call `then()` once the store has it."""

    def count_out(self, messages: int, nbytes: int, retried: int = 0) -> None:
        """`messages` PUBLISH packets written (`retried` of them sent again), `nbytes` in all."""


class Inflight:
    __slots__ = ("group", "message", "qos", "released", "retain", "sent_at", "stream", "sub_ids")

    def __init__(self, message: Message | None, qos: int, stream: bool, sent_at: float, retain: bool = False,
                 sub_ids: tuple[int, ...] = (), group: GroupHandle | None = None) -> None:
        self.message = message
        self.qos = qos
        self.stream = stream  # False for retained and shared deliveries, which are outside the session's queues
        self.released = False  # PUBREC received, PUBREL sent: delivered, waiting for PUBCOMP
        self.sent_at = sent_at
        self.retain = retain
        self.sub_ids = sub_ids
        self.group = group


def resend(inflight: dict[int, Inflight], level: int, deadline: float, events: EventBuffer | None,
           client_id: str, clock: Clock, mount: str = "") -> tuple[list[bytes], int]:
    """PUBREL, or the PUBLISH with DUP, of every in-flight entry last sent at or before `deadline` (monotonic s),
    which count as sent now: on a new connection (everything) and on 3.1.1's retry timer. Returns the packets
    and how many of them are PUBLISH. `mount`: the receiver's tenant mount point (`Writer.mount`)."""
    chunks: list[bytes] = []
    published = 0
    now = clock.monotonic()
    now_ms = int(clock.time() * 1000)
    for pid, entry in inflight.items():
        if entry.sent_at > deadline:
            continue
        entry.sent_at = now
        message = entry.message
        if entry.released or message is None:
            chunks.append(pubrel(pid))
            continue
        head, tail = encoded_publish_with(message, level, entry.qos, entry.retain, entry.sub_ids, 0, 0, True, mount)
        chunks += (with_dup(head), pid.to_bytes(2, "big"), tail)
        published += 1
        if events is not None:
            events.add(DELIVERED, now_ms, client_id, "mqtt", message.topic, message.seq, entry.qos, True)
    return chunks, published


def merge(lists: list[tuple[SubscriptionRecord, list[Message]]], horizon: int, client_id: str,
          filtered: set[str] | None, read_check: Callable[[str], bool] | None,
          ) -> tuple[list[Message], dict[int, Delivery], int]:
    """Merge a session's queues by seq up to `horizon`: one copy per message at the highest granted QoS with every
    matching subscription identifier (QoS -1: readable through none). Returns the merge, each message's delivery
    and the highest seq left beyond the horizon (0: none)."""
    deliveries: dict[int, Delivery] = {}
    by_seq: dict[int, Message] = {}
    beyond = 0
    for sub, messages in lists:
        check = read_check if filtered and sub.filter in filtered else None
        for message in messages:
            seq = message.seq
            if seq > horizon:
                if seq > beyond:
                    beyond = seq
                continue
            readable = (check is None or check(message.topic)) and not (
                sub.no_local and message.publisher == client_id)
            qos = sub.qos if readable else -1
            retain = readable and sub.retain_as_published and message.retain
            ids: tuple[int, ...] = (sub.subscription_id,) if readable and sub.subscription_id else ()
            seen = deliveries.get(seq)
            if seen is None:
                by_seq[seq] = message
                deliveries[seq] = (qos, retain, ids)
            else:
                deliveries[seq] = (max(seen[0], qos), seen[1] or retain, seen[2] + ids)
    return [by_seq[seq] for seq in sorted(by_seq)], deliveries, beyond
