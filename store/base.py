"""The store interface every engine implements (embedded now, Redis later), and the records it keeps.

Offsets are global log sequence numbers (`seq`): every message appended gets the next seq, and a queue is an
ordered index of the seqs indexed into it. A consumer's position in any queue is "the last seq handled", so one
cursor can walk the merge of several queues, and seq gaps (after retention or a crash) are harmless.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

NEVER_EXPIRES = 0xFFFFFFFF
# A client's P2P queue. '#' can't appear in a topic name or inside a filter level: no clash with other queues.
P2P_PREFIX = "p2p#"


def p2p_queue(client_id: str) -> str:
    return P2P_PREFIX + client_id


@dataclass(slots=True, eq=False)
class Message:
    """One application message, stored once and indexed into `queues`.

    `properties` is the encoded MQTT 5 property block content (no length prefix) to forward unchanged, minus
    topic alias, subscription identifiers and message expiry, which depend on the receiver or the clock.
    """

    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    properties: bytes = b""
    timestamp_ms: int = 0
    expires_at_ms: int = 0  # 0: never
    publisher: str = ""  # client id of the publisher ("" for internal), for no-local later
    queues: tuple[str, ...] = ()
    seq: int = -1  # assigned by Store.append
    # Encoded PUBLISH packets keyed by (protocol level, qos, retain); filled lazily by the gateway so the same
    # bytes are shared across subscribers. Not persisted.
    encoded: dict[tuple[object, ...], tuple[bytes, bytes]] | None = None


@dataclass(slots=True)
class SubscriptionRecord:
    filter: str  # also the queue name it reads from
    qos: int
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0
    subscription_id: int = 0  # 0: none
    since_seq: int = 0  # messages with seq <= since_seq predate the subscription


@dataclass(slots=True)
class SessionRecord:
    """A persistent session as kept in the store while the client is away (and while it is online)."""

    client_id: str
    protocol_level: int = 4
    expiry_interval: int = NEVER_EXPIRES  # seconds after disconnect; NEVER_EXPIRES for 3.1.1 clean=0
    subscriptions: dict[str, SubscriptionRecord] = field(default_factory=dict)
    offset: int = 0  # every seq <= offset in the session's queues is handled (delivered and acked)
    sent_upto: int = 0  # highest seq ever sent: resends at or below it carry DUP
    inbound_qos2: list[int] = field(default_factory=list)  # packet ids PUBREC'd, awaiting PUBREL
    outbound_pubrel: list[int] = field(default_factory=list)  # packet ids PUBREL'd, awaiting PUBCOMP
    disconnected_at_ms: int = 0  # 0 while online


@dataclass(slots=True)
class WillRecord:
    client_id: str
    message: Message
    delay_interval: int = 0  # seconds (MQTT 5 will delay)


class Store(Protocol):
    """Async, batched interface of a store engine. Every call may be a network round trip in another engine."""

    async def open(self) -> None:
        """Open or recover: rebuild indexes from the log, cut a torn tail."""

    async def close(self) -> None:
        """Flush and sync everything, release files."""

    # --- messages -------------------------------------------------------------------------------------
    async def append(self, messages: Sequence[Message]) -> None:
        """Append a batch in order, assign each `seq`, index into each `message.queues`.

        Returns when the batch is readable by `read` (written, not necessarily synced)."""

    async def sync(self) -> None:
        """Return once everything appended (and every offset/session write) before the call is durable
        according to the fsync policy. Concurrent callers share one fsync (group commit)."""

    async def read(self, queue: str, after_seq: int, limit: int) -> list[Message]:
        """Up to `limit` messages of `queue` with seq > after_seq, ascending by seq."""

    def last_seq(self) -> int:
        """Highest seq assigned so far (0 when empty). Cheap, no I/O: a new subscription starts here."""

    # --- sessions and offsets ---------------------------------------------------------------------------
    async def get_session(self, client_id: str) -> SessionRecord | None: ...

    async def put_session(self, record: SessionRecord) -> None: ...

    async def delete_session(self, client_id: str) -> None:
        """Remove the session and its offsets."""

    async def list_sessions(self) -> list[SessionRecord]:
        """Every stored session (startup: wildcard set, expiry sweep)."""

    async def set_offsets(self, offsets: dict[str, tuple[int, int]]) -> None:
        """Batched update of `(offset, sent_upto)` per client id (a no-op for unknown sessions)."""

    # --- retained -----------------------------------------------------------------------------------------
    async def set_retained(self, topic: str, message: Message | None) -> None:
        """Set or replace the retained message of `topic`; None deletes it."""

    async def match_retained(self, topic_filter: str) -> list[Message]:
        """Retained messages whose topic matches the filter, found through an index (no full scan)."""

    # --- wills ----------------------------------------------------------------------------------------------
    async def put_will(self, will: WillRecord) -> None: ...

    async def delete_will(self, client_id: str) -> None: ...

    async def list_wills(self) -> list[WillRecord]:
        """Wills still stored (at startup: their connections died with the previous process)."""
