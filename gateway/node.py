"""The node runtime: sessions and subscriptions of this node, the publish pipeline and notify dispatch.

Publish path: a batch per event-loop tick → one `store.append` → notify (queue names) → for each notified
queue one cache refresh → every local session on it pulls and pushes within its credit. Publishers' acks
wait for `store.sync()` (group commit) while the next batch is already being appended.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Coroutine, Iterable
from typing import TYPE_CHECKING, Any

from cache.queue_cache import QueueCache
from extensions.hooks import Authorizer, ClientInfo, SubscribeAccess
from gateway.codec import ReasonCode, SubscriptionRequest
from gateway.config import Settings
from gateway.session import Session
from gateway.topics import FilterTrie, first_level_queue, is_wildcard, valid_topic_filter
from lookup.base import Lookup
from notify.base import Notifier
from store.base import NEVER_EXPIRES, Message, SessionRecord, Store, SubscriptionRecord, WillRecord

if TYPE_CHECKING:
    from gateway.connection import MqttConnection

log = logging.getLogger("tidewire.node")

P2P_PREFIX = "p2p#"  # '#' can't appear in a topic name or inside a filter level: no clash with other queues


def p2p_queue(client_id: str) -> str:
    return P2P_PREFIX + client_id


def is_first_level_queue(topic_filter: str) -> bool:
    """`a/#` is the first-level queue every message of `a/...` is indexed into anyway."""
    head = topic_filter[:-2]
    return topic_filter.endswith("/#") and "/" not in head and "+" not in head and "#" not in head


def _now_ms() -> int:
    return int(time.time() * 1000)


class Node:
    def __init__(self, settings: Settings, store: Store, lookup: Lookup, notifier: Notifier,
                 authorizer: Authorizer) -> None:
        self.settings = settings
        self.node_id = settings.node_id
        self.store = store
        self.lookup = lookup
        self.notifier = notifier
        self.authorizer = authorizer
        self.cache = QueueCache(store, settings.cache_messages_per_queue, settings.pull_batch)
        self.connections: dict[str, MqttConnection] = {}
        self._queue_sessions: dict[str, set[Session]] = {}
        self._wildcards: FilterTrie[str] = FilterTrie()  # wildcard queues, derived from all live sessions
        self._topic_queues: dict[str, tuple[str, ...]] = {}  # topic → queues; cleared when wildcards change
        self._offline_expiry: dict[str, int] = {}  # client id → ms when its stored session expires
        self._client_locks: dict[str, asyncio.Lock] = {}
        self._will_timers: dict[str, asyncio.TimerHandle] = {}
        # publish pipeline
        self._batch: list[Message] = []
        self._acks: list[tuple[MqttConnection, bytes]] = []
        self._retained: list[Message] = []
        self._dirty: set[Session] = set()
        self._flush_wanted = asyncio.Event()
        self._notified: set[str] = set()
        self._dispatch_wanted = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._background: set[asyncio.Task[None]] = set()
        self.started_at = time.time()

    # --- lifecycle ----------------------------------------------------------------------------------------
    async def start(self) -> None:
        self.notifier.register(self.node_id, self._on_notify)
        now = _now_ms()
        for record in await self.store.list_sessions():
            if record.disconnected_at_ms == 0:  # online when the previous process died
                record.disconnected_at_ms = now
                await self.store.put_session(record)
            if self._expired(record, now):
                await self.store.delete_session(record.client_id)
                continue
            self._offline_expiry[record.client_id] = self._expiry_deadline(record)
            for topic_filter in record.subscriptions:
                self._add_wildcard(topic_filter, record.client_id)
        for will in await self.store.list_wills():
            # Its connection died with the previous process without a DISCONNECT.
            self.publish(will.message)
            await self.store.delete_will(will.client_id)
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._flush_loop()), loop.create_task(self._dispatch_loop()),
                       loop.create_task(self._housekeeping_loop())]

    async def stop(self) -> None:
        for conn in list(self.connections.values()):
            conn.shutdown(ReasonCode.SERVER_SHUTTING_DOWN)
        for handle in self._will_timers.values():
            handle.cancel()
        await self._flush_once()
        for task in self._tasks:
            task.cancel()
        for task in [*self._tasks, *self._background]:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.store.sync()

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("task.failed", exc_info=task.exception())

    # --- sessions -----------------------------------------------------------------------------------------
    def _lock(self, client_id: str) -> asyncio.Lock:
        lock = self._client_locks.get(client_id)
        if lock is None:
            lock = self._client_locks[client_id] = asyncio.Lock()
        return lock

    async def open_session(self, conn: MqttConnection, client_id: str, level: int, clean_start: bool,
                           expiry: int, window: int) -> tuple[Session, bool]:
        """Take over or restore the client's session (or start one); returns it and `session_present`."""
        lock = self._lock(client_id)
        async with lock:
            session: Session | None = None
            old = self.connections.get(client_id)
            if old is not None:
                log.info("client.takeover", extra={"client_id": client_id})
                session = old.take_over()
            self._cancel_will(client_id)
            await self.store.delete_will(client_id)
            self._offline_expiry.pop(client_id, None)
            record: SessionRecord | None = None
            if session is None:
                record = await self.store.get_session(client_id)
                if record is not None and self._expired(record, _now_ms()):
                    await self._drop_stored(record)
                    record = None
            if clean_start:
                if session is not None:
                    self._forget_subscriptions(session.record)
                    session = None
                if record is not None:
                    await self._drop_stored(record)
                    record = None
            present = session is not None or record is not None
            if session is None:
                if record is None:
                    last = self.store.last_seq()
                    record = SessionRecord(client_id, offset=last, sent_upto=last)
                session = Session(self, record, persistent=expiry > 0, window=window,
                                  pull_batch=self.settings.pull_batch,
                                  retry_interval=self.settings.retry_interval)
            record = session.record
            record.protocol_level = session.level = level
            record.expiry_interval = expiry
            record.disconnected_at_ms = 0
            session.persistent = expiry > 0
            session.window = window
            self.connections[client_id] = conn
            self.lookup.set_client_location(client_id, self.node_id)
            for topic_filter in record.subscriptions:
                self._register(session, topic_filter)
                # The ACL may have changed while the client was away.
                self._set_access(session, conn.info, topic_filter,
                                 self.authorizer.subscribe_access(conn.info, topic_filter))
            if session.persistent:
                await self.store.put_session(session.snapshot())
        if not lock.locked() and self._client_locks.get(client_id) is lock:
            del self._client_locks[client_id]
        return session, present

    def close_session(self, conn: MqttConnection, session: Session, *, transfer: bool = False) -> None:
        """The connection is gone. Unless the session moves to a new connection, park it in the store."""
        if self.connections.get(session.client_id) is conn:
            del self.connections[session.client_id]
            self.lookup.remove_client_location(session.client_id, self.node_id)
        for topic_filter in session.subscriptions:
            self._unregister(session, topic_filter)
        session.detach()
        self._dirty.discard(session)
        if transfer:
            return
        if session.persistent:
            record = session.snapshot()
            record.disconnected_at_ms = _now_ms()
            self._offline_expiry[session.client_id] = self._expiry_deadline(record)
            self.spawn(self.store.put_session(record))
        else:
            self._forget_subscriptions(session.record)
            self.spawn(self.store.delete_session(session.client_id))

    def _expiry_deadline(self, record: SessionRecord) -> int:
        if record.expiry_interval >= NEVER_EXPIRES:
            return 1 << 62
        return (record.disconnected_at_ms or _now_ms()) + record.expiry_interval * 1000

    def _expired(self, record: SessionRecord, now_ms: int) -> bool:
        return record.disconnected_at_ms > 0 and self._expiry_deadline(record) <= now_ms

    async def _drop_stored(self, record: SessionRecord) -> None:
        self._forget_subscriptions(record)
        self._offline_expiry.pop(record.client_id, None)
        await self.store.delete_session(record.client_id)

    def _forget_subscriptions(self, record: SessionRecord) -> None:
        for topic_filter in record.subscriptions:
            self._remove_wildcard(topic_filter, record.client_id)

    # --- subscriptions ------------------------------------------------------------------------------------
    def _add_wildcard(self, topic_filter: str, client_id: str) -> None:
        if is_wildcard(topic_filter) and not is_first_level_queue(topic_filter):
            if self._wildcards.add(topic_filter, client_id):
                self._topic_queues.clear()

    def _remove_wildcard(self, topic_filter: str, client_id: str) -> None:
        if is_wildcard(topic_filter) and not is_first_level_queue(topic_filter):
            if self._wildcards.remove(topic_filter, client_id):
                self._topic_queues.clear()

    def _register(self, session: Session, queue: str) -> None:
        sessions = self._queue_sessions.get(queue)
        if sessions is None:
            sessions = self._queue_sessions[queue] = set()
        if session not in sessions:
            sessions.add(session)
            self.cache.track(queue)
            self.lookup.add_queue_subscriber(queue, self.node_id)

    def _unregister(self, session: Session, queue: str) -> None:
        sessions = self._queue_sessions.get(queue)
        if sessions is not None and session in sessions:
            sessions.discard(session)
            if not sessions:
                del self._queue_sessions[queue]
            self.cache.untrack(queue)
            self.lookup.remove_queue_subscriber(queue, self.node_id)

    def subscribe(self, session: Session, conn: MqttConnection,
                  requests: list[SubscriptionRequest]) -> tuple[list[int], list[tuple[str, int]]]:
        """Register subscriptions; returns SUBACK codes and the (filter, qos) whose retained messages to send."""
        v5 = session.level >= 5
        codes: list[int] = []
        retained: list[tuple[str, int]] = []
        for request in requests:
            topic_filter = request.topic_filter
            if not valid_topic_filter(topic_filter) or topic_filter.count("/") >= self.settings.max_topic_levels:
                codes.append(ReasonCode.TOPIC_FILTER_INVALID if v5 else 0x80)
                continue
            if topic_filter.startswith("$share/"):
                codes.append(ReasonCode.SHARED_SUBSCRIPTIONS_NOT_SUPPORTED if v5 else 0x80)
                continue
            access = self.authorizer.subscribe_access(conn.info, topic_filter)
            if access == SubscribeAccess.DENIED:
                log.info("acl.denied", extra={"client_id": session.client_id, "filter": topic_filter,
                                              "access": "subscribe"})
                codes.append(ReasonCode.NOT_AUTHORIZED if v5 else 0x80)
                continue
            qos = min(request.qos, 2)
            self._set_access(session, conn.info, topic_filter, access)
            existing = session.subscriptions.get(topic_filter)
            since = existing.since_seq if existing is not None else self.store.last_seq()
            session.subscriptions[topic_filter] = SubscriptionRecord(
                topic_filter, qos, request.no_local, request.retain_as_published, request.retain_handling,
                0, since)
            if existing is None:
                self._register(session, topic_filter)
                self._add_wildcard(topic_filter, session.client_id)
            if request.retain_handling == 0 or (request.retain_handling == 1 and existing is None):
                retained.append((topic_filter, qos))
            codes.append(qos)
        return codes, retained

    def _set_access(self, session: Session, client: ClientInfo, topic_filter: str,
                    access: SubscribeAccess) -> None:
        if access == SubscribeAccess.GRANTED:
            if session.filtered:
                session.filtered.discard(topic_filter)
            return
        if session.filtered is None:
            session.filtered = set()
        session.filtered.add(topic_filter)
        if session.read_check is None:
            authorizer = self.authorizer
            session.read_check = lambda topic: authorizer.allow_read(client, topic)

    def unsubscribe(self, session: Session, filters: list[str]) -> list[int]:
        codes: list[int] = []
        for topic_filter in filters:
            if session.subscriptions.pop(topic_filter, None) is None:
                codes.append(ReasonCode.NO_SUBSCRIPTION_EXISTED)
                continue
            if session.filtered:
                session.filtered.discard(topic_filter)
            self._unregister(session, topic_filter)
            self._remove_wildcard(topic_filter, session.client_id)
            codes.append(ReasonCode.SUCCESS)
        return codes

    async def send_retained(self, session: Session, filters: list[tuple[str, int]]) -> None:
        now = _now_ms()
        for topic_filter, qos in filters:
            messages = await self.store.match_retained(topic_filter)
            live = [m for m in messages if not m.expires_at_ms or m.expires_at_ms > now]
            if live:
                session.send_retained(live, qos)

    def session_dirty(self, session: Session) -> None:
        if session.persistent:
            self._dirty.add(session)

    # --- wills --------------------------------------------------------------------------------------------
    def schedule_will(self, client_id: str, message: Message, delay: int) -> None:
        if delay <= 0:
            self.publish(message)
            self.spawn(self.store.delete_will(client_id))
            return
        self._cancel_will(client_id)

        def fire() -> None:
            self._will_timers.pop(client_id, None)
            self.publish(message)
            self.spawn(self.store.delete_will(client_id))

        self._will_timers[client_id] = asyncio.get_running_loop().call_later(delay, fire)

    def _cancel_will(self, client_id: str) -> None:
        handle = self._will_timers.pop(client_id, None)
        if handle is not None:
            handle.cancel()

    def store_will(self, client_id: str, message: Message, delay: int) -> None:
        self.spawn(self.store.put_will(WillRecord(client_id, message, delay)))

    # --- publish pipeline ---------------------------------------------------------------------------------
    def queues_for(self, topic: str) -> tuple[str, ...]:
        queues = self._topic_queues.get(topic)
        if queues is None:
            if len(self._topic_queues) >= 65536:
                self._topic_queues.clear()  # bounded; hot topics come back on their next publish
            queues = self._topic_queues[topic] = self._queues_for(topic)
        return queues

    def _queues_for(self, topic: str) -> tuple[str, ...]:
        first = first_level_queue(topic)
        queues = [topic, first]
        if len(self._wildcards):
            for topic_filter, _ in self._wildcards.match(topic):
                queues.append(topic_filter)
        parts = topic.split("/", 2)
        if len(parts) == 3 and parts[1] == "p2p" and parts[2]:
            queues.append(p2p_queue(parts[2]))
        return tuple(queues)

    def publish(self, message: Message, conn: MqttConnection | None = None, ack: bytes = b"") -> None:
        """Queue a message for the next append batch; `ack` goes to `conn` once the batch is durable."""
        if not message.timestamp_ms:
            message.timestamp_ms = _now_ms()
        message.queues = self.queues_for(message.topic)
        self._batch.append(message)
        if ack and conn is not None:
            self._acks.append((conn, ack))
        if message.retain:
            self._retained.append(message)
        self._flush_wanted.set()

    async def _flush_loop(self) -> None:
        offsets_due = 0.0
        while True:
            await self._flush_wanted.wait()
            self._flush_wanted.clear()
            await self._flush_once(offsets=time.monotonic() >= offsets_due)
            if self._dirty:
                offsets_due = time.monotonic() + 0.1

    async def _flush_once(self, offsets: bool = True) -> None:
        batch, self._batch = self._batch, []
        acks, self._acks = self._acks, []
        retained, self._retained = self._retained, []
        if batch:
            await self.store.append(batch)
            queues: set[str] = set()
            for message in batch:
                queues.update(message.queues)
            self.notifier.notify(queues)
        for message in retained:
            await self.store.set_retained(message.topic, message if message.payload else None)
        if offsets and self._dirty:
            dirty, self._dirty = self._dirty, set()
            await self.store.set_offsets({s.client_id: (s.committed_offset(), s.record.sent_upto)
                                          for s in dirty})
        if acks:
            self.spawn(self._ack_when_durable(acks))

    async def _ack_when_durable(self, acks: list[tuple[MqttConnection, bytes]]) -> None:
        await self.store.sync()
        per_conn: dict[MqttConnection, list[bytes]] = {}
        for conn, ack in acks:
            chunks = per_conn.get(conn)
            if chunks is None:
                per_conn[conn] = [ack]
            else:
                chunks.append(ack)
        for conn, chunks in per_conn.items():
            conn.write_acks(chunks)

    def _on_notify(self, queues: set[str]) -> None:
        self._notified |= queues
        self._dispatch_wanted.set()

    async def _dispatch_loop(self) -> None:
        while True:
            await self._dispatch_wanted.wait()
            self._dispatch_wanted.clear()
            queues, self._notified = self._notified, set()
            live = [q for q in queues if q in self._queue_sessions]
            for queue in live:
                await self.cache.refresh(queue)
            for queue in live:
                for session in self._queue_sessions.get(queue, ()):
                    session.pull()

    async def _housekeeping_loop(self) -> None:
        retention_due = 0.0
        while True:
            await asyncio.sleep(1.0)
            if self._dirty:
                self._flush_wanted.set()
            now = _now_ms()
            for client_id in [c for c, deadline in self._offline_expiry.items() if deadline <= now]:
                if client_id in self.connections:
                    continue
                del self._offline_expiry[client_id]
                record = await self.store.get_session(client_id)
                if record is not None and self._expired(record, now):
                    await self._drop_stored(record)
                    log.info("session.expired", extra={"client_id": client_id})
            if time.monotonic() >= retention_due:
                retention_due = time.monotonic() + 60
                enforce = getattr(self.store, "enforce_retention", None)
                if enforce is not None:
                    await enforce()

    def stats(self) -> dict[str, int]:
        return {"connections": len(self.connections), "queues": len(self._queue_sessions),
                "wildcards": len(self._wildcards)}

    def local_queues(self) -> Iterable[str]:
        return self._queue_sessions.keys()
