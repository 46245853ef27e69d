"""A client's deliveries: one cursor over the merge of its queues, the in-flight window. What the session holds
between them (record, subscriptions, in-flight table), and how an idle one holds less, is `SessionState`
(gateway/sessions/state.py).

Offsets are global seqs, so a session walks all its queues with a single cursor: a message indexed into two
of its queues (overlapping filters) has one seq and is delivered once, at the highest granted QoS, carrying
every matching subscription identifier. The committed offset (what survives a disconnect or a restart) is
just below the oldest unacknowledged message. Shared-subscription messages are handed in by their group.
"""

from __future__ import annotations

import asyncio
import functools
from collections import deque

from tidewire.gateway.core.retry import STORE_RETRY_S
from tidewire.gateway.ops.client_stats import ClientStats
from tidewire.gateway.protocols.mqtt.codec import pubrel
from tidewire.gateway.protocols.mqtt.outbound import encoded_publish, encoded_publish_with, with_dup
from tidewire.gateway.sessions.parts import Delivery, GroupHandle, Inflight, SessionOwner, Writer, merge, resend
from tidewire.gateway.sessions.state import SessionState
from tidewire.pipeline.lake.event_names import ACKED, DELIVERED, DROPPED
from tidewire.store.base import Message, SessionRecord, SubscriptionRecord

_NO_HORIZON = 1 << 62


class Session(SessionState):
    __slots__ = ("_extra_sent", "_held", "_new_qos2", "_pid", "_pull_handle", "_reading_store", "_retry_handle",
                 "_save_again", "_saves", "aliases", "conn", "extra", "pending", "persistent", "pull_batch",
                 "retry_interval", "stats", "window")

    def __init__(self, owner: SessionOwner, record: SessionRecord | None, *, persistent: bool, window: int,
                 pull_batch: int, retry_interval: float, stored: bool = True, client_id: str = "", level: int = 4,
                 start: int = 0) -> None:
        """`record` None: a session started clean, `client_id` at `level` from seq `start`, which makes its record
        when it first needs one (a subscription, a P2P message, a save, a takeover): most idle clients never do."""
        self.persistent = persistent
        self.window = window
        self.pull_batch = pull_batch
        self.retry_interval = retry_interval
        self.extra: deque[tuple[Message, int, tuple[int, ...]]] | None = None  # retained, waiting for credit
        self._extra_sent: asyncio.Future[None] | None = None  # `retained_sent` waits on it
        self.conn: Writer | None = None
        self.aliases: dict[str, int] | None = None  # outgoing topic aliases of the current connection
        self.pending = False
        self._pid = 0
        # QoS 2 in flight must be in the stored record before it goes out (`_write`): what waits for that save.
        self._held: list[bytes] | None = None
        self._new_qos2 = False  # a stream QoS 2 message got a new packet id in this push
        self._save_again = False
        self._saves = 0  # bumped when the connection goes: a save under way then releases nothing
        self._reading_store = False
        self._pull_handle: asyncio.Handle | None = None
        self._retry_handle: asyncio.TimerHandle | None = None
        self.stats = ClientStats()  # this client's counters and ack times (admin API, slow-subscriber ranking)
        super().__init__(owner, record, stored, client_id, level, start)

    # --- connection lifecycle ---------------------------------------------------------------------------
    def attach(self, conn: Writer, *, fresh: bool = False) -> None:
        """Bind to a (new) connection and resend what is in flight: PUBREL, or PUBLISH with DUP. `fresh`: the
        session was made in this same call, so nothing can wait in its P2P queue (no append ran since)."""
        self.conn = conn
        self.aliases = {} if conn.alias_max else None  # aliases never outlive a connection
        self.p2p_pending = self.p2p_sub is not None and not fresh  # anything sent to it while it was away
        if self.inflight:
            chunks, published = resend(self.inflight, self.level, _NO_HORIZON, self.owner.events, self.client_id,
                                       self.owner.clock, conn.mount)
            if chunks:
                conn.write_chunks(chunks)
                self._count_out(published, sum(map(len, chunks)), published)
            self._arm_retry()
        self.pull()

    def detach(self) -> None:
        """The connection is gone: shared-subscription messages in flight go back to their groups."""
        self.conn = None
        self._held, self._save_again = None, False  # in flight: resent (DUP, same ids) on the next connection
        self._saves += 1
        self._wake_retained()
        for pid in [pid for pid, e in self.inflight.items() if e.group is not None and not e.released]:
            entry = self.inflight.pop(pid)
            if entry.group is not None and entry.message is not None:
                entry.group.returned(entry.message)
        if self._pull_handle is not None:
            self._pull_handle.cancel()
            self._pull_handle = None
        if self._retry_handle is not None:
            self._retry_handle.cancel()
            self._retry_handle = None

    def credit(self) -> int:
        """Free in-flight slots for QoS 1/2 (0 while the socket is backed up)."""
        conn = self.conn
        if conn is None or conn.paused:
            return 0
        return self.window - len(self.inflight)

    # --- acknowledgements -------------------------------------------------------------------------------
    def on_puback(self, pid: int, now: float) -> None:
        """`now`: when the PUBACK was read (monotonic s; the read's time, so a read of many acks asks the clock
        once)."""
        entry = self.inflight.pop(pid, None)
        if entry is not None:
            self.stats.acked(now - entry.sent_at)
            self._acked(entry)

    def on_pubrec(self, pid: int, failed: bool, now: float) -> bool:
        """False if the packet id is unknown (the caller answers PUBREL 0x92 on 5.0)."""
        entry = self.inflight.get(pid)
        if entry is None:
            return False
        if not entry.released:  # the subscriber's answer to the PUBLISH (PUBCOMP answers our PUBREL)
            self.stats.acked(now - entry.sent_at)
        if failed:  # 5.0 PUBREC with an error code ends the exchange
            del self.inflight[pid]
            self._acked(entry)
            return True
        if not entry.released:
            entry.released = True
            if entry.group is not None and entry.message is not None:
                entry.group.acked(entry.message.seq)
            self.owner.session_dirty(self)
        if self.conn is not None:
            self.conn.write_chunks([pubrel(pid)])
        return True

    def on_pubcomp(self, pid: int) -> None:
        entry = self.inflight.pop(pid, None)
        if entry is not None:
            self._acked(entry)

    def _acked(self, entry: Inflight) -> None:
        events = self.owner.events
        if events is not None and entry.message is not None:
            m = entry.message
            events.add(ACKED, int(self.owner.clock.time() * 1000), self.client_id, "mqtt", m.topic, m.seq, entry.qos)
        if entry.stream:
            self.owner.session_dirty(self)
        elif entry.group is not None and not entry.released and entry.message is not None:
            entry.group.acked(entry.message.seq)
        if self.pending or self.extra:
            self._schedule_pull()  # once per tick: every ack read in this tick frees credit first

    # --- pushing ----------------------------------------------------------------------------------------
    def send_retained(self, messages: list[Message], max_qos: int, sub_id: int) -> None:
        if self.extra is None:
            self.extra = deque()
        ids = (sub_id,) if sub_id else ()
        for message in messages:
            self.extra.append((message, message.qos if message.qos < max_qos else max_qos, ids))
        self.pull()

    async def retained_sent(self) -> None:
        """Until the retained messages queued so far went out, within credit (or the connection is gone): who
        streams a subscription's retained messages page by page (`Node.send_retained`) reads the next page then,
        so a slow consumer holds at most a page in memory."""
        if not self.extra or self.conn is None:
            return
        if self._extra_sent is None:
            self._extra_sent = asyncio.get_running_loop().create_future()
        await asyncio.shield(self._extra_sent)

    def _wake_retained(self) -> None:
        sent, self._extra_sent = self._extra_sent, None
        if sent is not None and not sent.done():
            sent.set_result(None)

    def resume_writing(self) -> None:
        if self.pending:
            self.pull()

    def push_shared(self, message: Message, qos: int, sub_id: int, group: GroupHandle) -> bool:
        """Deliver one message chosen for this member by its group; False if it can't go out now."""
        conn = self.conn
        if conn is None or conn.paused or (qos and len(self.inflight) >= self.window):
            return False
        chunks: list[bytes] = []
        sent = self._encode_one(chunks, message, qos, False, (sub_id,) if sub_id else (), False, False, group,
                                int(self.owner.clock.time() * 1000))
        if chunks:
            conn.write_chunks(chunks)
            self._count_out(1, sum(map(len, chunks)))
            if conn.tenant is not None:
                conn.tenant.messages_out += 1
            self._arm_retry()
        return sent

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
        if self.p2p_pending:
            self._reading_store = True
            asyncio.get_running_loop().create_task(self._pull_from_store())
            return
        lists: list[tuple[SubscriptionRecord, list[Message]]] = []
        cache = self.owner.cache
        cursor = self.cursor
        horizon = _NO_HORIZON
        for sub in self.stream_subs:
            got = cache.get(sub.filter, cursor if cursor > sub.since_seq else sub.since_seq, self.pull_batch)
            if got is None:
                self._reading_store = True
                asyncio.get_running_loop().create_task(self._pull_from_store())
                return
            messages, upto = got
            if upto < horizon:
                horizon = upto
            if messages:
                lists.append((sub, messages))
        if lists:
            self._push_merged(conn, lists, horizon)

    async def _pull_from_store(self) -> None:
        p2p_sub = self.p2p_sub if self.p2p_pending else None
        p2p_complete = False
        try:
            cursor = self.cursor
            subs = [*self.stream_subs, p2p_sub] if p2p_sub is not None else list(self.stream_subs)
            answers: list[tuple[SubscriptionRecord, list[Message], int]] = []
            for sub in subs:
                answers.append((sub, *await self._read(sub, cursor, 0)))
            # A queue read before a message of another queue was appended may be known only below that
            # message: read those again, sealed up to it, rather than pass it or wait for a notify.
            needed = max((m[-1].seq for _, m, _ in answers if m), default=0)
            for i, (sub, messages, upto) in enumerate(answers):
                if upto < needed and len(messages) < self.pull_batch:
                    answers[i] = (sub, *await self._read(sub, cursor, needed))
        except OSError:
            # The store is failing (the node's loops log it): nothing moved, so try the same pull again later.
            asyncio.get_running_loop().call_later(STORE_RETRY_S, self.pull)
            return
        finally:
            self._reading_store = False
        if self.conn is None:
            return
        if self.cursor != cursor:
            self.pull()  # moved meanwhile: read again from where it is now
            return
        horizon = min((upto for _, _, upto in answers), default=_NO_HORIZON)
        lists = [(sub, messages) for sub, messages, _ in answers if messages]
        for sub, messages, _ in answers:
            if sub is p2p_sub:
                p2p_complete = len(messages) < self.pull_batch and (not messages or messages[-1].seq <= horizon)
        if lists:
            self._push_merged(self.conn, lists, horizon)
        if p2p_complete and not self.pending:
            self.p2p_pending = False
        elif self.pending:
            self.pull()  # work that came in while the store was read (retained messages, a notify) waits no more

    async def _read(self, sub: SubscriptionRecord, cursor: int, seal: int) -> tuple[list[Message], int]:
        after = cursor if cursor > sub.since_seq else sub.since_seq
        got = self.owner.cache.get(sub.filter, after, self.pull_batch) if not seal else None
        if got is not None:
            return got
        messages, upto = await self.owner.store.read(sub.filter, after, self.pull_batch, seal)
        return messages, upto

    def _catch_up(self, lagging: list[str], seal: int) -> None:
        """Queues known only below a message waiting in another queue: refresh them (sealed up to it), then
        pull again. The session reads nothing else meanwhile."""
        self._reading_store = True
        asyncio.get_running_loop().create_task(self._refresh_then_pull(lagging, seal))

    async def _refresh_then_pull(self, lagging: list[str], seal: int) -> None:
        try:
            for queue in lagging:
                await self.owner.cache.refresh(queue, seal)
        except OSError:
            self._reading_store = False
            asyncio.get_running_loop().call_later(STORE_RETRY_S, self.pull)
            return
        self._reading_store = False
        self.pull()

    def _push_merged(self, conn: Writer, lists: list[tuple[SubscriptionRecord, list[Message]]],
                     horizon: int) -> None:
        """Push the merge of `lists` up to `horizon`, the seq up to which every queue of the session is known:
        a message beyond it waits until the queues known less far are caught up."""
        if len(lists) == 1 and self.plain:
            sub, messages = lists[0]
            if messages[-1].seq <= horizon:
                self._push(conn, messages, None, sub.qos, len(messages) == self.pull_batch)
                return
        merged, deliveries, beyond = merge(lists, horizon, self.client_id, self.filtered, self.read_check)
        truncated = any(len(messages) == self.pull_batch for _, messages in lists)
        if merged:
            self._push(conn, merged, deliveries, 0, truncated and not beyond)
        if beyond and not self.pending and not self._reading_store:
            cache = self.owner.cache
            lagging = [sub.filter for sub in self.stream_subs if cache.known_upto(sub.filter) < beyond]
            if lagging:
                self._catch_up(lagging, beyond)
            elif truncated and merged:
                self._schedule_pull()

    def _push(self, conn: Writer, messages: list[Message], deliveries: dict[int, Delivery] | None, cap: int,
              more: bool) -> None:
        chunks: list[bytes] = []
        inflight = self._tracked()
        window = self.window
        level = self.level
        sent_upto = self.record.sent_upto
        clock = self.owner.clock
        now = clock.monotonic()
        now_ms = int(clock.time() * 1000)
        cursor = self.cursor
        blocked = False
        simple = not (conn.alias_max or conn.max_packet)
        mount = conn.mount  # a tenant's clients are sent their topics without it (gateway.core.tenants)
        retain = False
        ids: tuple[int, ...] = ()
        sent = retried = 0
        events = self.owner.events
        client_id = self.client_id
        for message in messages:
            if deliveries is not None:
                qos, retain, ids = deliveries[message.seq]
            else:
                qos = cap
            if message.qos < qos:
                qos = message.qos
            if qos and len(inflight) >= window:
                blocked = True
                break
            if qos < 0:
                cursor = message.seq
                continue
            if simple and not ids and not message.expires_at_ms:
                key = (level, qos, retain, mount) if mount else (level, qos, retain)
                parts = message.encoded.get(key) if message.encoded is not None else None
                head, tail = parts if parts is not None else encoded_publish(message, level, qos, retain, mount)
                if qos == 0:
                    chunks.append(head)
                else:
                    pid = self._next_pid() if qos == 1 else self._qos2_pid(message.seq)
                    inflight[pid] = Inflight(message, qos, True, now, retain, ids)
                    if message.seq <= sent_upto:  # sent before this connection (not acknowledged): again, as DUP
                        chunks += (with_dup(head), pid.to_bytes(2, "big"), tail)
                        retried += 1
                    else:
                        chunks += (head, pid.to_bytes(2, "big"), tail)
                sent += 1
                if events is not None:
                    events.add(DELIVERED, now_ms, client_id, "mqtt", message.topic, message.seq, qos,
                               message.seq <= sent_upto)
            else:
                dup = message.seq <= sent_upto
                if self._encode_one(chunks, message, qos, retain, ids, dup, True, None, now_ms):
                    sent += 1
                    retried += dup and qos > 0
            cursor = message.seq
        if cursor != self.cursor:
            self.cursor = cursor
            if cursor > sent_upto:
                self.record.sent_upto = cursor
            self.owner.session_dirty(self)
            if self.resend_pids is not None:  # what the cursor passed without sending is not sent again
                self.resend_pids = {seq: pid for seq, pid in self.resend_pids.items() if seq > cursor} or None
        if chunks:
            self._write(conn, chunks)
            self._count_out(sent, sum(map(len, chunks)), retried)
            if conn.tenant is not None:
                conn.tenant.messages_out += sent
            self._arm_retry()
        if blocked:
            self.pending = True
        elif more:
            self._schedule_pull()

    def _encode_one(self, chunks: list[bytes], message: Message, qos: int, retain: bool, ids: tuple[int, ...],
                    dup: bool, stream: bool, group: GroupHandle | None, now_ms: int) -> bool:
        """Encode one delivery with its per-receiver properties; False if expired or too large for the client."""
        expiry = 0
        events = self.owner.events
        if message.expires_at_ms:
            remaining = message.expires_at_ms - now_ms
            if remaining <= 0:
                self.owner.counters.drop("expired")
                self.stats.drops += 1
                if events is not None:
                    events.add(DROPPED, now_ms, self.client_id, "mqtt", message.topic, message.seq, qos, dup,
                               "expired")
                return False
            expiry = (remaining + 999) // 1000  # the interval left, forwarded (MQTT 5 §3.3.2.3.3)
        conn = self.conn
        assert conn is not None
        alias = 0
        send_topic = True
        aliases = self.aliases
        if aliases is not None and self.level >= 5:
            alias = aliases.get(message.topic, 0)
            if alias:
                send_topic = False
            elif len(aliases) < conn.alias_max:
                alias = len(aliases) + 1  # assigned below, once the packet is known to go out
        head, tail = encoded_publish_with(message, self.level, qos, retain, ids, expiry, alias, send_topic,
                                          conn.mount)
        if conn.max_packet and len(head) + len(tail) + (2 if qos else 0) > conn.max_packet:
            self.owner.counters.drop("too_large")
            self.stats.drops += 1
            if events is not None:
                events.add(DROPPED, now_ms, self.client_id, "mqtt", message.topic, message.seq, qos, dup,
                           "too_large")
            return False  # too large for this client only (MQTT 5 §3.1.2.11.4): skipped, not an error
        if alias and send_topic and aliases is not None:
            aliases[message.topic] = alias
        if events is not None:
            events.add(DELIVERED, now_ms, self.client_id, "mqtt", message.topic, message.seq, qos, dup)
        if qos == 0:
            chunks.append(head)
            return True
        pid = self._qos2_pid(message.seq) if qos == 2 and stream else self._next_pid()
        self._tracked()[pid] = Inflight(message, qos, stream, self.owner.clock.monotonic(), retain, ids, group)
        chunks += (with_dup(head) if dup else head, pid.to_bytes(2, "big"), tail)
        return True

    def _count_out(self, messages: int, nbytes: int, retried: int = 0) -> None:
        stats = self.stats
        stats.messages_out += messages
        stats.bytes_out += nbytes
        stats.retries += retried
        self.owner.count_out(messages, nbytes, retried)

    def _qos2_pid(self, seq: int) -> int:
        """The packet id of a stream message sent at QoS 2: the one it had before a move, or a new one (the
        session is then saved before it goes out: `_write`)."""
        resend = self.resend_pids
        if resend is not None:
            pid = resend.pop(seq, None)
            if not resend:
                self.resend_pids = None
            if pid is not None and pid not in self.inflight:
                return pid
        self._new_qos2 = True
        return self._next_pid()

    def _write(self, conn: Writer, chunks: list[bytes]) -> None:
        """Write a push; one that gave a QoS 2 message a new packet id waits until a persistent session's record
        holds the id (so a move, even after kill -9, resends under it), and every push after it waits behind."""
        new_qos2, self._new_qos2 = self._new_qos2, False
        if self._held is not None:
            self._held += chunks
            self._save_again |= new_qos2
        elif new_qos2 and self.persistent:
            self._held = chunks
            self.owner.save_then(self, functools.partial(self._saved, self._saves))
        else:
            conn.write_chunks(chunks)

    def _saved(self, saves: int) -> None:
        if saves != self._saves:
            return  # the connection went meanwhile
        if self._save_again:
            self._save_again = False
            self.owner.save_then(self, functools.partial(self._saved, saves))
            return
        held, self._held = self._held, None
        if held and self.conn is not None:
            self.conn.write_chunks(held)

    def _push_extra(self, conn: Writer) -> bool:
        """Send queued retained messages within credit; False when credit ran out first."""
        chunks: list[bytes] = []
        extra = self.extra
        assert extra is not None
        now_ms = int(self.owner.clock.time() * 1000)
        sent = 0
        while extra:
            message, qos, ids = extra[0]
            if qos and len(self.inflight) >= self.window:
                self.pending = True
                break
            extra.popleft()
            sent += self._encode_one(chunks, message, qos, True, ids, False, False, None, now_ms)
        if chunks:
            conn.write_chunks(chunks)
            self._count_out(sent, sum(map(len, chunks)))
            if conn.tenant is not None:
                conn.tenant.messages_out += sent
            self._arm_retry()
        if extra:
            return False
        self.extra = None
        self._wake_retained()
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
        reserved = self.resend_pids.values() if self.resend_pids is not None else ()
        while True:
            pid = pid % 65535 + 1
            if pid not in inflight and pid not in reserved:
                self._pid = pid
                return pid

    # --- retry (MQTT 3.1.1 only: 5.0 forbids resending on a live connection) ----------------------------
    def _arm_retry(self) -> None:
        if self.level >= 5 or self._retry_handle is not None or not self.inflight or self.conn is None:
            return
        self._retry_handle = asyncio.get_running_loop().call_later(self.retry_interval, self._retry)

    def _retry(self) -> None:
        self._retry_handle = None
        conn = self.conn
        if conn is None:
            return
        clock = self.owner.clock
        deadline = clock.monotonic() - self.retry_interval
        chunks, published = resend(self.inflight, self.level, deadline, self.owner.events, self.client_id, clock,
                                   conn.mount)
        if chunks:
            conn.write_chunks(chunks)
            self._count_out(published, sum(map(len, chunks)), published)
        self._arm_retry()
