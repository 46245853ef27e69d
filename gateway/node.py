"""The node runtime: sessions and subscriptions of this node, the publish pipeline and notify dispatch.

Publish path: a batch per event-loop tick → one `store.append` → notify (queue names) → for each notified
queue one cache refresh → every local session on it pulls and pushes within its credit (`gateway.core.dispatch`;
for a batch of this node's, in the same tick as its append). Subscribers get a message once it is appended,
before it is durable; publishers' acks wait for `store.sync()` (group commit) while the next batch is
already being appended.

Store errors never end a loop: the failed step is retried as is, with exponential backoff, logged once per
failure streak; nothing queued is lost or reordered, and acks still go out only once durable. Messages
waiting for append are bounded (`max_pending`): beyond it publishers' sockets stop being read, and only
clients' QoS 0 publishes may be dropped (counted), and only while the store is failing.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any

from tidewire.cache.queue_cache import QueueCache
from tidewire.extensions.authentication import AuthChain
from tidewire.extensions.enhanced_auth import EnhancedAuth
from tidewire.extensions.hooks import Authorizer, Narrowed, PerClient
from tidewire.extensions.plugin_guard import GuardedHook, PluginErrors
from tidewire.gateway.config import Settings
from tidewire.gateway.core.appends import Appends
from tidewire.gateway.core.clock import SYSTEM_CLOCK, Clock
from tidewire.gateway.core.consumers import ConsumerGroups
from tidewire.gateway.core.delayed import DelayedPublishes, held_form
from tidewire.gateway.core.dispatch import Dispatcher
from tidewire.gateway.core.event_buffer import EventBuffer
from tidewire.gateway.core.exclusive import ExclusiveLocks
from tidewire.gateway.core.ingress import DurableSink, tell_sinks
from tidewire.gateway.core.publish_hooks import PublishHooks
from tidewire.gateway.core.retained_quota import RetainedQuota
from tidewire.gateway.core.retry import Backoff, stop_if_cancelled
from tidewire.gateway.core.rewrite import TopicRewriter
from tidewire.gateway.core.sparkplug import PREFIX as SPARKPLUG_PREFIX
from tidewire.gateway.core.sparkplug import certificate as sparkplug_certificate
from tidewire.gateway.core.store_health import StoreHealth
from tidewire.gateway.core.subscriptions import Refusal, SubscriptionRegistry
from tidewire.gateway.core.tenants import PREFIX as TENANTS_PREFIX
from tidewire.gateway.core.tenants import tenants_from_settings
from tidewire.gateway.core.topology import SingleNode, Topology
from tidewire.gateway.core.writes import RecordWrites
from tidewire.gateway.ops.bans import BanList
from tidewire.gateway.ops.drain import QUIESCE_S, disconnect_all, quiesce, wait_closed
from tidewire.gateway.ops.housekeeping import housekeeping_loop
from tidewire.gateway.ops.slow_subscribers import SlowSubscribers
from tidewire.gateway.ops.sys_topics import Counters, SysTopics
from tidewire.gateway.ops.tracing import Tracing
from tidewire.gateway.protocols.mqtt.codec import ReasonCode, SubscriptionRequest
from tidewire.gateway.sessions.opener import SessionOpener
from tidewire.gateway.sessions.session import Session
from tidewire.gateway.sessions.wills import DelayedWills, delay_left
from tidewire.gateway.transport.admission import Admission
from tidewire.gateway.transport.ratelimit import TokenBucket
from tidewire.lookup.base import Lookup
from tidewire.notify.base import Notifier
from tidewire.store.base import Message, Store

if TYPE_CHECKING:
    from tidewire.gateway.ops.dynsec import DynamicSecurity
    from tidewire.gateway.protocols.mqtt.lifecycle import ChannelBase

log = logging.getLogger("tidewire.node")

MAX_PENDING_PUBLISHES = 50_000  # messages waiting for append before publishers are held back
# A subscription's retained messages are read from the store in pages of at most this many messages or bytes
# (`Node.send_retained`): what a slow consumer of a wide wildcard makes the node hold.
RETAINED_PAGE = 256
RETAINED_PAGE_BYTES = 1 << 20


class Node:
    def __init__(self, settings: Settings, store: Store, lookup: Lookup, notifier: Notifier,
                 authorizer: Authorizer, enhanced_auth: EnhancedAuth | None = None,
                 auth: AuthChain | None = None, *, max_pending: int = MAX_PENDING_PUBLISHES,
                 clock: Clock = SYSTEM_CLOCK, topology: Callable[[Node], Topology] | None = None,
                 authorizers: Sequence[Authorizer] = (), publish_hooks: Sequence[GuardedHook] = (),
                 plugin_errors: PluginErrors | None = None) -> None:
        """`topology`: the cluster role to play, made from the node (None: a node alone), chosen once, here.
        `authorizers`: plugins that must allow too (after `authorizer`); `publish_hooks`: run on every publish
        (`gateway.core.publish_hooks`); `plugin_errors`: what the plugins' guards count (`gateway.security`)."""
        # The one clock every part of the node reads (`gateway.core.clock`): a test moves it by hand.
        self.clock = clock
        self.settings = settings
        self.enhanced_auth = enhanced_auth
        self.auth = auth if auth is not None else AuthChain((), allow_anonymous=True)
        self.admission = Admission(settings)
        self.store_health = self.admission.store = StoreHealth(clock)  # new clients are refused while it is down
        self.node_id = settings.node_id
        self.store = store
        self.lookup = lookup
        self.notifier = notifier
        self.authorizer = PerClient(authorizer) if not authorizers else Narrowed(authorizer, list(authorizers))
        self.plugin_errors = plugin_errors if plugin_errors is not None else PluginErrors()
        # Cache refreshes read 4 pull batches at once: one round trip of a networked store serves more readers.
        self.cache = QueueCache(store, settings.cache_messages_per_queue, settings.pull_batch * 4,
                                metrics=settings.metrics)
        self.connections: dict[str, ChannelBase] = {}
        self.traces = Tracing(settings, self.node_id, clock, self.connections)  # packet traces (admin API)
        self.slow_subscribers = SlowSubscribers(settings.slow_subscribers_top, settings.slow_subscribers_threshold_ms,
                                                settings.slow_subscribers_expire)
        self.bans = BanList(self)  # cluster-wide bans, checked on connect (gateway.ops.bans)
        self.dynsec: DynamicSecurity | None = None  # dynamic security, set before `start` when on (gateway.ops.dynsec)
        self.writes = RecordWrites(store, clock)
        self.topology: Topology = topology(self) if topology is not None else SingleNode()
        self.subscriptions = SubscriptionRegistry(self.node_id, settings, store, self.writes, lookup, self.cache,
                                                  self.authorizer, self.topology, self)
        self.counters = Counters(settings.metrics)
        # None without hooks: the protocols test for it and publish as if hooks did not exist (no await, no task).
        self.hooks = PublishHooks(publish_hooks, settings, self.authorizer, self.publish, self.counters.drop,
                                  self.spawn) if publish_hooks else None
        # competing consumers of other protocols (AMQP queues, RocketMQ)
        self.groups = ConsumerGroups(self.node_id, store, self.cache, self.subscriptions, self.counters, clock,
                                     self.spawn)
        self.sys = SysTopics(settings.node_id, self.publish, settings.sys_events, clock)
        if settings.lake_dir is None:  # the lake exports the whole log: there every event goes into it
            self.sys.audience = self.subscriptions.routed  # no event nobody reads is stored
        # Session and delivery events for the lake (pipeline.lake.event_export drains them); None: not recorded.
        self.events = self.sys.events = EventBuffer(settings.lake_events_buffer) if settings.lake_dir else None
        self.sessions = SessionOpener(self)  # open (takeover, claim, restore) and close client sessions
        self.tenants = tenants_from_settings(settings, TokenBucket)  # who is in which tenant, and its limits and counts
        # publish pipeline: appends (→ store) → _unretained → (set_retained) → _durable_acks → (sync) → acks
        self.max_pending = max_pending
        # what the protocols ask before taking a retained publish (`max_retained_*`)
        self.sparkplug_aware = settings.sparkplug_aware  # gateway.core.sparkplug
        self.retained_quota = RetainedQuota(settings.max_retained_messages, settings.max_retained_bytes,
                                            settings.max_retained_payload)
        self._unretained: deque[Message] = deque()  # appended; retained entry not yet set
        self._to_notify: set[str] = set()  # queues of appended messages, notified once retained entries are set
        # Appended batches and what `append` said lies around them, handed to the cache with the notify.
        self._uncached: list[tuple[list[Message], int | None]] = []
        self._appended_acks: list[tuple[DurableSink, Any]] = []  # appended; wait for `_unretained`
        self._durable_acks: list[tuple[DurableSink, Any]] = []  # wait for one successful sync
        self._ack_wanted = asyncio.Event()
        self._held: set[DurableSink] = set()  # publishers not read while the batch is over max_pending
        self._dropping = False  # a drop streak is logged once
        self._flush_retry = Backoff("flush", clock, self.store_health)
        self._sync_retry = Backoff("sync", clock, self.store_health)
        self._dirty: set[Session] = set()
        self._flush_wanted = asyncio.Event()
        self.appends = Appends(store, self.subscriptions.wildcards, clock.monotonic, self._flush_wanted.set)
        self.dispatcher = Dispatcher(self.subscriptions.readers, self._p2p_reader, self.cache, clock)
        self._tasks: list[asyncio.Task[None]] = []
        self._background: set[asyncio.Task[None]] = set()
        self.wills = DelayedWills(lambda message: self._enqueue(message, None, None, droppable=False), self.writes)
        # EMQX's conveniences (`gateway.core.rewrite`, `.delayed`, `.exclusive`; auto-subscribe is the channel's)
        self.rewriter = TopicRewriter(settings.topic_rewrite)
        self.delayed = DelayedPublishes(store, self.groups, clock, self.publish, self.spawn,
                                        settings.delayed_max_messages)
        self.exclusive = ExclusiveLocks(store, self.node_id, lambda: self.topology.holder, self.spawn)

    def _p2p_reader(self, client_id: str) -> Session | None:
        """The session reading `client_id`'s P2P queue here: its connection's, if connected to this node."""
        conn = self.connections.get(client_id)
        return conn.session if conn is not None else None

    @property
    def draining(self) -> bool:
        """Set when the node stops (`gateway.ops.drain`)."""
        return self.admission.draining

    @draining.setter
    def draining(self, value: bool) -> None:
        self.admission.draining = value

    # --- lifecycle ----------------------------------------------------------------------------------------
    async def start(self) -> None:
        self.notifier.register(self.node_id, self.notified)
        await self.bans.refresh()  # in force before the first client: a ban outlives a restart
        if self.dynsec is not None:
            await self.dynsec.load()
        now = int(self.clock.time() * 1000)
        topology = self.topology
        # Only sessions marked online are read (not every stored one): expiry reads the store's index as it goes.
        for client_id in await self.store.online_sessions():
            record = await self.store.get_session(client_id)
            if record is not None and record.disconnected_at_ms == 0 and (
                    topology.stale_owner(record.owner)):
                record.disconnected_at_ms = now  # online when the process that held it died
                await self.store.put_session(record)
        await self.subscriptions.load(self.store)
        if self.retained_quota.capped:
            self.retained_quota.settled(*await self.store.retained_usage())
        await self.groups.load()
        if self.settings.delayed_publish:
            await self.delayed.start()
        await self.subscriptions.wildcards.refresh_wildcards()
        for will in await self.store.list_wills():
            if not topology.stale_owner(will.owner):
                continue  # its client is online on a live node
            if topology.shared:  # the client may come back on any node: no timer here
                self._enqueue(will.message, None, None, droppable=False)
                await self.store.delete_will(will.client_id)
            else:  # its connection ended with this node's last run: what is left of its delay
                self.wills.publish_after(will.client_id, will.message, await delay_left(self.store, will, now))
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._flush_loop()), loop.create_task(self._ack_loop()),
                       loop.create_task(self._dispatch_loop()), loop.create_task(housekeeping_loop(self))]
        self._tasks += [loop.create_task(work) for work in topology.loops()]
        self._tasks.append(loop.create_task(self.bans.run()))
        if self.dynsec is not None:
            self._tasks.append(loop.create_task(self.dynsec.run()))

    @property
    def store_down(self) -> bool:
        """A loop's last store call failed (`store_health`: appends, syncs, housekeeping, heartbeats retried)."""
        return self.store_health.down

    async def stop(self, reason: int = ReasonCode.SERVER_SHUTTING_DOWN, properties: dict[int, Any] | None = None,
                   *, timeout: float = 10.0) -> None:
        """Disconnect every client and flush, within `timeout` s (`gateway.ops.drain` runs this as step 3). Clients
        are first no longer read, so what they already sent is stored and acknowledged before their DISCONNECT
        (`reason`, `properties`: 5.0 only) and is not sent again; the pipeline (still running) then stores their
        wills, session records and offsets; what cannot be stored in time is logged, never acknowledged."""
        clock = self.clock
        deadline = clock.monotonic() + timeout

        def left() -> float:
            return max(0.0, deadline - clock.monotonic())

        async def flush() -> None:  # one last attempt, no retries: we are going away
            await self._flush_once(wait=True)
            while not self.appends.idle:  # appends started by that step
                await self._flush_once(wait=True)
            await self.store.sync()
            tell_sinks(self._durable_acks)
            self._durable_acks = []

        conns = list(self.connections.values())
        self._held.clear()  # else the pipeline, draining, would resume reading some of them
        await quiesce(conns, min(QUIESCE_S, timeout / 4), lambda: self.store_down, clock)
        await disconnect_all(conns, reason, properties)
        self.wills.cancel_all()  # wills in their delay stay stored: the next start publishes what is left
        await self.groups.stop()
        if self._background:  # spawned one-off work (retained lookups, session opens): a bounded wait
            await asyncio.wait(self._background, timeout=min(5.0, left()))
        late = list(self.connections.values())  # a session opened meanwhile: its CONNACK went out after the drain
        await disconnect_all(late, reason, properties)
        conns += late
        while (not self.appends.idle or self._unretained or self._appended_acks) and left() > 0 and (
                not self.store_down):  # the flush loop stores wills and last publishes: not cut mid-append
            self._flush_wanted.set()
            await asyncio.sleep(0.005)
        pending = set(self._tasks)
        for _ in range(20):  # a client library may swallow a cancel (redis-py can): ask again until they end
            for task in pending:
                task.cancel()
            _, pending = await asyncio.wait(pending, timeout=min(0.25, left())) if pending else (set(), set())
            if not pending or not left():
                break
        if cancelled := await self.writes.close(timeout=min(5.0, left())):
            log.error("stop.writes_lost", extra={"writes": cancelled})
        try:
            await asyncio.wait_for(flush(), max(left(), 0.001))
        except TimeoutError:
            log.error("stop.flush_timeout", extra={"unappended": self.appends.unlanded})
        except Exception:
            log.exception("stop.flush_failed", extra={"unappended": self.appends.unlanded})
        lost = self.appends.take_acks()
        if lost:
            tell_sinks(lost, "the node stopped before storing it")
        if still := await wait_closed([conn.io for conn in conns], min(self.settings.close_drain_timeout, left()),
                                      clock):
            log.info("stop.clients_not_closed", extra={"connections": still})

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("task.failed", exc_info=task.exception())

    def released(self, conn: ChannelBase, session: Session) -> None:
        """A connection ended (`SessionOpener.close`): no offsets of its session to save, no reading to resume."""
        self._dirty.discard(session)
        self._held.discard(conn)
        self.slow_subscribers.departed(session.client_id, session.stats, self.clock.monotonic())

    # --- subscriptions ----------------------------------------------------------------------------------
    def subscribe(self, session: Session, conn: ChannelBase, requests: list[SubscriptionRequest],
                  sub_id: int = 0) -> tuple[list[int | Refusal], list[tuple[str, int, int]], list[str]]:
        """`SubscriptionRegistry.subscribe`, with a `$SYS` event per subscription granted."""
        granted, retained, registering = self.subscriptions.subscribe(session, conn.info, requests, sub_id)
        for request, qos in zip(requests, granted, strict=True):
            if not isinstance(qos, Refusal):
                self.sys.event(session.client_id, "subscribed", topic=request.topic_filter, qos=qos)
        return granted, retained, registering

    def unsubscribe(self, session: Session, filters: list[str]) -> list[bool]:
        """`SubscriptionRegistry.unsubscribe`, with a `$SYS` event per subscription removed."""
        removed = self.subscriptions.unsubscribe(session, filters)
        for topic_filter, was in zip(filters, removed, strict=True):
            if was:
                self.sys.event(session.client_id, "unsubscribed", topic=topic_filter)
        return removed

    async def send_retained(self, session: Session, filters: list[tuple[str, int, int]]) -> None:
        """The retained messages of new subscriptions, streamed from the store a page at a time: the next page is
        read once the session sent the last within its credit, so a wildcard over a million retained messages
        holds a page in memory, never the match, and stops when the connection goes."""
        conn = session.conn
        for topic_filter, qos, sub_id in filters:
            after: str | None = None
            while conn is not None and session.conn is conn:
                page = await self.store.match_retained(topic_filter, after, RETAINED_PAGE, RETAINED_PAGE_BYTES)
                if not page or session.conn is not conn:
                    break
                after = page[-1].topic
                now = int(self.clock.time() * 1000)
                live = [m for m in page if not m.expires_at_ms or m.expires_at_ms > now]
                if live:
                    session.send_retained(live, qos, sub_id)
                    await session.retained_sent()

    def session_dirty(self, session: Session) -> None:
        if session.persistent:
            self._dirty.add(session)

    def save_then(self, session: Session, then: Callable[[], None]) -> None:
        self.writes.save_session(session.snapshot())
        self.spawn(self._when_saved(session.client_id, then))

    async def _when_saved(self, client_id: str, then: Callable[[], None]) -> None:
        await self.writes.session_settled(client_id)
        then()

    def count_out(self, messages: int, nbytes: int, retried: int = 0) -> None:
        """A session wrote `messages` MQTT PUBLISH packets (`retried` of them sent again), `nbytes` in all."""
        counters = self.counters
        counters.messages_out += messages
        counters.bytes_out += nbytes
        counters.retries += retried

    # --- publish pipeline ---------------------------------------------------------------------------------
    def publish(self, message: Message, sink: DurableSink | None = None, token: Any = None) -> None:
        """Queue a message for the next append batch (the protocol-neutral ingress: `gateway.core.ingress`). With a
        sink, `sink.durable([token, ...])` is called once the batch is durable.

        Over `max_pending` the sink (the publisher's connection) is paused until the batch drains; a message
        without a sink (MQTT QoS 0) is then dropped (and counted) if the store is failing. Nothing else is ever
        dropped."""
        self._enqueue(message, sink, token, droppable=sink is None and message.qos == 0 and bool(message.publisher))
        if self.sparkplug_aware and message.topic.startswith((SPARKPLUG_PREFIX, TENANTS_PREFIX)):
            birth = sparkplug_certificate(message)
            if birth is not None:  # right behind the birth: usually in its append batch, retained before its ack
                self._enqueue(birth, None, None, droppable=False)

    def _enqueue(self, message: Message, sink: DurableSink | None, token: Any, *, droppable: bool) -> None:
        if not message.timestamp_ms:
            message.timestamp_ms = int(self.clock.time() * 1000)
        if message.due_ms:  # a delayed publish (past its publish hooks): it waits in the store until due
            held_form(message, message.due_ms)
        counters = self.counters
        counters.messages_in += 1
        counters.bytes_in += len(message.payload)
        if message.protocol:  # MQTT's share is the rest (Counters.by_protocol): nothing more on its path
            counters.in_messages[message.protocol] += 1
            counters.in_bytes[message.protocol] += len(message.payload)
        if self.appends.unlanded >= self.max_pending:
            source = sink if sink is not None else self.connections.get(message.publisher)
            if source is not None and source not in self._held:
                source.pause_publishes()
                self._held.add(source)
            if droppable and self.store_down:
                counters.drop("store_unavailable")
                if not self._dropping:
                    self._dropping = True
                    log.warning("publish.dropping_qos0", extra={"pending": self.max_pending})
                return
        self.appends.add(message, (sink, token) if sink is not None else None)
        self._flush_wanted.set()

    def _release_publishers(self) -> None:
        held, self._held = self._held, set()
        self._dropping = False
        for conn in held:
            conn.resume_publishes()

    async def _flush_loop(self) -> None:
        offsets_due = 0.0
        retry = self._flush_retry
        clock = self.clock
        while True:
            await self._flush_wanted.wait()
            self._flush_wanted.clear()
            try:
                await self._flush_once(offsets=clock.monotonic() >= offsets_due)
            except Exception as exc:  # the store failed: everything is kept in place and tried again as is
                stop_if_cancelled()
                await asyncio.sleep(retry.failed(exc))
                self._flush_wanted.set()
                continue
            retry.succeeded()
            if self._dirty:
                offsets_due = clock.monotonic() + 0.1

    async def _flush_once(self, offsets: bool = True, wait: bool = False) -> None:
        """Land appends and start the next (`gateway.core.appends`), set retained entries, hand acks to the sync
        loop, write due offsets. Raises on a store error with every step not done still queued, so calling again
        resumes where it failed. `wait`: wait for the appends in flight too (the node stops)."""
        landed = await self.appends.step(wait)
        counters = self.counters
        for append in landed:
            batch = append.batch
            if any(m.duplicate for m in batch):  # a resend the store already held (`Message.dedupe`)
                # Not cached again; notified, in case the reply to the append that stored it was lost.
                self._to_notify.update(q for m in batch if m.duplicate for q in m.queues)
                batch = [m for m in batch if not m.duplicate]
                self._appended_acks.extend(append.acks)
                if not batch:
                    continue
                append.acks = []
            if counters.enabled:
                counters.append_seconds.observe(append.seconds)
                counters.topics.add(batch)
            self._uncached.append((batch, append.after))
            for message in batch:
                self._to_notify.update(message.queues)
                if message.retain:
                    self._unretained.append(message)
            self._appended_acks.extend(append.acks)
        if landed and self._held and self.appends.unlanded <= self.max_pending // 2:
            self._release_publishers()
        unretained = self._unretained
        quota = self.retained_quota
        if unretained:
            while unretained:
                message = unretained[0]
                await self.store.set_retained(message.topic, message if message.payload else None)
                unretained.popleft()
                quota.landed(len(message.payload))
                if message.topic.startswith(TENANTS_PREFIX):
                    self.tenants.retained_landed(message.topic, len(message.payload))
            if quota.capped:
                quota.settled(*await self.store.retained_usage())
        # Only now: a subscriber that got a retained message live and subscribes anew finds it retained.
        appended = upto = 0
        for uncached, after in self._uncached:  # taken as appended where nothing else lies between: no read back
            self.cache.add_appended(uncached, after)
            appended += len(uncached)
            # Ascending when the store vouched for the batch; with several partitions it may not be.
            upto = max(upto, uncached[-1].seq if after is not None else max(m.seq for m in uncached))
        self._uncached = []
        if self._to_notify:
            queues, self._to_notify = self._to_notify, set()
            mine = self.notifier.notify_from(self.node_id, queues)
            if mine:  # names come with their batches: `upto` is the last one's last seq
                self.dispatcher.appended(mine, upto)
                await self.dispatcher.run_inline(appended)  # never raises a store error: the task retries
        if self._appended_acks:
            self._durable_acks.extend(self._appended_acks)
            self._appended_acks = []
            self._ack_wanted.set()
        if offsets and self._dirty:
            dirty, self._dirty = self._dirty, set()
            try:
                await self.store.set_offsets({s.client_id: (s.committed_offset(), s.record.sent_upto, s.record.epoch)
                                              for s in dirty})
            except BaseException:  # also cancelled at stop: written by its last flush
                self._dirty |= dirty  # written on the next flush, with the positions current then
                raise

    async def _ack_loop(self) -> None:
        """PUBACK/PUBREC once a sync covers their messages; one sync serves every ack queued before it."""
        retry = self._sync_retry
        clock = self.clock
        while True:
            await self._ack_wanted.wait()
            self._ack_wanted.clear()
            acks: list[tuple[DurableSink, Any]] = []
            while True:
                acks.extend(self._durable_acks)
                self._durable_acks = []
                started = clock.monotonic()
                try:
                    await self.store.sync()
                except Exception as exc:
                    stop_if_cancelled()
                    await asyncio.sleep(retry.failed(exc))
                    continue
                if self.counters.enabled:
                    self.counters.fsync_seconds.observe(clock.monotonic() - started)
                break
            retry.succeeded()
            tell_sinks(acks)

    def notified(self, queues: set[str]) -> None:
        """Queues with new messages (from the notifier, or a periodic resync): refresh and pull them."""
        self.dispatcher.notified(queues)

    async def _dispatch_loop(self) -> None:
        await self.dispatcher.loop()

    def offsets_due(self) -> None:
        """Write dirty offsets soon (the flush loop writes them with the next batch, or now if idle)."""
        if self._dirty:
            self._flush_wanted.set()
