"""A client's delivery state: subscriptions, one cursor over the merge of its queues, the in-flight window.

Offsets are global seqs, so a session walks all its queues with a single cursor: a message indexed into two
of its queues (overlapping filters) has one seq and is delivered once, at the highest granted QoS. The
committed offset (what survives a disconnect or restart) is just below the oldest unacknowledged message.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from gateway.codec import publish_parts, pubrel
from store.base import Message, SessionRecord, Store, SubscriptionRecord

if TYPE_CHECKING:
    from cache.queue_cache import QueueCache

_NO_HORIZON = 1 << 62


class Writer(Protocol):
    """The connection side a session pushes to."""

    paused: bool

    def write_chunks(self, chunks: list[bytes]) -> None: ...


class SessionOwner(Protocol):
    """What a session needs from its node."""

    cache: QueueCache
    store: Store

    def session_dirty(self, session: Session) -> None: ...


class Inflight:
    __slots__ = ("message", "qos", "released", "sent_at", "stream")

    def __init__(self, message: Message | None, qos: int, stream: bool, sent_at: float) -> None:
        self.message = message
        self.qos = qos
        self.stream = stream  # False for retained deliveries, which are outside the queue stream
        self.released = False  # PUBREC received, PUBREL sent: delivered, waiting for PUBCOMP
        self.sent_at = sent_at


def encoded_publish(message: Message, level: int, qos: int, retain: bool) -> tuple[bytes, bytes]:
    """The (head, tail) of this message's PUBLISH for one receiver kind, encoded once and shared."""
    cache = message.encoded
    if cache is None:
        cache = message.encoded = {}
    key = (level, qos, retain)
    parts = cache.get(key)
    if parts is None:
        parts = cache[key] = publish_parts(message.topic, message.payload, qos, retain, message.properties,
                                           level)
    return parts


class Session:
    __slots__ = (
        "_pid", "_pull_handle", "_reading_store", "_retry_handle", "client_id", "conn", "cursor", "extra",
        "filtered", "inflight", "level", "owner", "pending", "persistent", "pull_batch", "read_check", "record",
        "retry_interval", "window",
    )

    def __init__(self, owner: SessionOwner, record: SessionRecord, *, persistent: bool, window: int,
                 pull_batch: int, retry_interval: float) -> None:
        self.owner = owner
        self.record = record
        self.client_id = record.client_id
        self.level = record.protocol_level
        self.persistent = persistent
        self.window = window
        self.pull_batch = pull_batch
        self.retry_interval = retry_interval
        self.cursor = record.offset
        self.inflight: dict[int, Inflight] = {}
        self.extra: deque[tuple[Message, int]] | None = None  # retained deliveries waiting for credit
        self.conn: Writer | None = None
        # Filters the ACL grants only in part: each delivery through them is checked with `read_check`.
        self.filtered: set[str] | None = None
        self.read_check: Callable[[str], bool] | None = None
        self.pending = False
        self._pid = 0
        self._reading_store = False
        self._pull_handle: asyncio.Handle | None = None
        self._retry_handle: asyncio.TimerHandle | None = None
        for pid in record.outbound_pubrel:
            entry = self.inflight[pid] = Inflight(None, 2, False, 0.0)
            entry.released = True

    @property
    def subscriptions(self) -> dict[str, SubscriptionRecord]:
        return self.record.subscriptions

    # --- connection lifecycle -----------------------------------------------------------------------------
    def attach(self, conn: Writer) -> None:
        """Bind to a (new) connection and resend what is in flight: PUBREL, or PUBLISH with DUP."""
        self.conn = conn
        chunks: list[bytes] = []
        now = time.monotonic()
        for pid, entry in self.inflight.items():
            entry.sent_at = now
            if entry.released or entry.message is None:
                chunks.append(pubrel(pid))
            else:
                head, tail = encoded_publish(entry.message, self.level, entry.qos, not entry.stream)
                chunks += (bytes((head[0] | 0x08,)) + head[1:], pid.to_bytes(2, "big"), tail)
        if chunks:
            conn.write_chunks(chunks)
        self._arm_retry()
        self.pull()

    def detach(self) -> None:
        self.conn = None
        if self._pull_handle is not None:
            self._pull_handle.cancel()
            self._pull_handle = None
        if self._retry_handle is not None:
            self._retry_handle.cancel()
            self._retry_handle = None

    def committed_offset(self) -> int:
        """Every seq at or below this is handled; the oldest unacknowledged stream message holds it back."""
        low = self.cursor
        for entry in self.inflight.values():
            if entry.stream and not entry.released and entry.message is not None and entry.message.seq <= low:
                low = entry.message.seq - 1
        return low

    def snapshot(self) -> SessionRecord:
        record = self.record
        record.offset = self.committed_offset()
        record.sent_upto = max(record.sent_upto, self.cursor)
        record.outbound_pubrel = [pid for pid, e in self.inflight.items() if e.released]
        return record

    # --- acknowledgements ---------------------------------------------------------------------------------
    def on_puback(self, pid: int) -> None:
        entry = self.inflight.pop(pid, None)
        if entry is not None:
            self._acked(entry)

    def on_pubrec(self, pid: int, failed: bool) -> bool:
        """False if the packet id is unknown (the caller answers PUBREL 0x92 on 5.0)."""
        entry = self.inflight.get(pid)
        if entry is None:
            return False
        if failed:  # 5.0 PUBREC with an error code ends the exchange
            del self.inflight[pid]
            self._acked(entry)
            return True
        if not entry.released:
            entry.released = True
            self.owner.session_dirty(self)
        if self.conn is not None:
            self.conn.write_chunks([pubrel(pid)])
        return True

    def on_pubcomp(self, pid: int) -> None:
        entry = self.inflight.pop(pid, None)
        if entry is not None:
            self._acked(entry)

    def _acked(self, entry: Inflight) -> None:
        if entry.stream:
            self.owner.session_dirty(self)
        if self.pending or self.extra:
            self._schedule_pull()  # once per tick: every ack read in this tick frees credit first

    # --- pushing ------------------------------------------------------------------------------------------
    def send_retained(self, messages: list[Message], max_qos: int) -> None:
        if self.extra is None:
            self.extra = deque()
        for message in messages:
            self.extra.append((message, message.qos if message.qos < max_qos else max_qos))
        self.pull()

    def resume_writing(self) -> None:
        if self.pending:
            self.pull()

    def pull(self) -> None:
        """Push what the cache holds for this session, within credit; read the store if behind the cache."""
        conn = self.conn
        if conn is None:
            return
        if conn.paused or self._reading_store:
            self.pending = True
            return
        self.pending = False
        if self.extra and not self._push_extra(conn):
            return
        lists: list[tuple[SubscriptionRecord, list[Message]]] = []
        cache = self.owner.cache
        for sub in self.record.subscriptions.values():
            after = self.cursor if self.cursor > sub.since_seq else sub.since_seq
            messages = cache.get(sub.filter, after, self.pull_batch)
            if messages is None:
                self._reading_store = True
                asyncio.get_running_loop().create_task(self._pull_from_store())
                return
            if messages:
                lists.append((sub, messages))
        if lists:
            self._push_merged(conn, lists)

    async def _pull_from_store(self) -> None:
        try:
            cursor = self.cursor
            lists: list[tuple[SubscriptionRecord, list[Message]]] = []
            for sub in list(self.record.subscriptions.values()):
                after = cursor if cursor > sub.since_seq else sub.since_seq
                messages = self.owner.cache.get(sub.filter, after, self.pull_batch)
                if messages is None:
                    messages = await self.owner.store.read(sub.filter, after, self.pull_batch)
                if messages:
                    lists.append((sub, messages))
        finally:
            self._reading_store = False
        if self.conn is not None and self.cursor == cursor and lists:
            self._push_merged(self.conn, lists)
        elif self.conn is not None:
            self.pull()

    def _push_merged(self, conn: Writer, lists: list[tuple[SubscriptionRecord, list[Message]]]) -> None:
        filtered = self.filtered
        if len(lists) == 1 and not (filtered and lists[0][0].filter in filtered):
            sub, messages = lists[0]
            more = len(messages) == self.pull_batch
            self._push(conn, messages, None, sub.qos, more)
            return
        # Several queues: merge by seq, one copy per message at the highest granted QoS, and stop at the
        # horizon of any truncated list (messages beyond it may be missing from that queue's answer).
        horizon = _NO_HORIZON
        caps: dict[int, int] = {}
        by_seq: dict[int, Message] = {}
        for sub, messages in lists:
            if len(messages) == self.pull_batch and messages[-1].seq < horizon:
                horizon = messages[-1].seq
            check = self.read_check if filtered and sub.filter in filtered else None
            for message in messages:
                seq = message.seq
                # -1: not readable through this subscription; skipped unless another one grants it
                qos = sub.qos if check is None or check(message.topic) else -1
                if caps.get(seq, -2) < qos:
                    caps[seq] = qos
                    by_seq[seq] = message
        merged = [by_seq[seq] for seq in sorted(by_seq) if seq <= horizon]
        self._push(conn, merged, caps, 0, horizon != _NO_HORIZON)

    def _push(self, conn: Writer, messages: list[Message], caps: dict[int, int] | None, cap: int,
              more: bool) -> None:
        chunks: list[bytes] = []
        inflight = self.inflight
        window = self.window
        level = self.level
        sent_upto = self.record.sent_upto
        now = time.monotonic()
        now_ms = int(time.time() * 1000)
        cursor = self.cursor
        blocked = False
        for message in messages:
            qos = caps[message.seq] if caps is not None else cap
            if message.qos < qos:
                qos = message.qos
            if qos < 0 or (message.expires_at_ms and message.expires_at_ms <= now_ms):
                cursor = message.seq
                continue
            if qos and len(inflight) >= window:
                blocked = True
                break
            parts = message.encoded.get((level, qos, False)) if message.encoded is not None else None
            head, tail = parts if parts is not None else encoded_publish(message, level, qos, False)
            if qos == 0:
                chunks += (head, tail)
            else:
                pid = self._next_pid()
                inflight[pid] = Inflight(message, qos, True, now)
                if message.seq <= sent_upto:
                    head = bytes((head[0] | 0x08,)) + head[1:]
                chunks += (head, pid.to_bytes(2, "big"), tail)
            cursor = message.seq
        if cursor != self.cursor:
            self.cursor = cursor
            if cursor > sent_upto:
                self.record.sent_upto = cursor
            self.owner.session_dirty(self)
        if chunks:
            conn.write_chunks(chunks)
            self._arm_retry()
        if blocked:
            self.pending = True
        elif more:
            self._schedule_pull()

    def _push_extra(self, conn: Writer) -> bool:
        """Send queued retained messages within credit; False when credit ran out first."""
        chunks: list[bytes] = []
        now = time.monotonic()
        extra = self.extra
        assert extra is not None
        while extra:
            message, qos = extra[0]
            if qos and len(self.inflight) >= self.window:
                self.pending = True
                break
            extra.popleft()
            head, tail = encoded_publish(message, self.level, qos, True)
            if qos:
                pid = self._next_pid()
                self.inflight[pid] = Inflight(message, qos, False, now)
                chunks += (head, pid.to_bytes(2, "big"), tail)
            else:
                chunks += (head, tail)
        if chunks:
            conn.write_chunks(chunks)
            self._arm_retry()
        if extra:
            return False
        self.extra = None
        return True

    def _schedule_pull(self) -> None:
        if self._pull_handle is None:
            self._pull_handle = asyncio.get_running_loop().call_soon(self._scheduled_pull)

    def _scheduled_pull(self) -> None:
        self._pull_handle = None
        self.pull()

    def _next_pid(self) -> int:
        pid = self._pid
        inflight = self.inflight
        while True:
            pid = pid % 65535 + 1
            if pid not in inflight:
                self._pid = pid
                return pid

    # --- retry (MQTT 3.1.1 only: 5.0 forbids resending on a live connection) ------------------------------
    def _arm_retry(self) -> None:
        if self.level >= 5 or self._retry_handle is not None or not self.inflight or self.conn is None:
            return
        self._retry_handle = asyncio.get_running_loop().call_later(self.retry_interval, self._retry)

    def _retry(self) -> None:
        self._retry_handle = None
        conn = self.conn
        if conn is None:
            return
        deadline = time.monotonic() - self.retry_interval
        chunks: list[bytes] = []
        for pid, entry in self.inflight.items():
            if entry.sent_at > deadline:
                continue
            entry.sent_at = time.monotonic()
            if entry.released or entry.message is None:
                chunks.append(pubrel(pid))
            else:
                head, tail = encoded_publish(entry.message, self.level, entry.qos, not entry.stream)
                chunks += (bytes((head[0] | 0x08,)) + head[1:], pid.to_bytes(2, "big"), tail)
        if chunks:
            conn.write_chunks(chunks)
        self._arm_retry()
