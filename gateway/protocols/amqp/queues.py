"""AMQP queues as consumer groups of the store: definitions, bindings, purge, delete, expiry.

A queue is the consumer group `amqp/<vhost>/<queue>` (`node.groups`): its filters are its bindings mapped to
topic filters (`mapping.binding_filter`) plus `$queue/<name>` (the default exchange's binding every queue has).
The log holds each message once; the group holds a position and its claims, so a durable queue's position
survives a restart and any node can serve it. `attrs` keep the AMQP settings: `exclusive` (the owning
connection's id), `auto_delete`, the `x-` arguments (`arguments.QueueArgs`: x-expires, x-message-ttl,
dead-lettering, length limits, x-consumer-timeout), `bindings` ([[exchange, key, filter, arguments], ...]: a
headers exchange's binding has no filter, `routing` routes it; arguments are `routing.encode_arguments`'s text)
and `used_ms` (last use of an expiring queue seen by a node).

Message counts are exact (`backlog.Backlog.ready`). Expired messages are dead-lettered (`dead_letters`) or
passed over by the consumer groups (`ConsumerGroups.expiry`); `sweep` expires the heads and trims the limited
queues this node declared or used, every `server.EXPIRY_CHECK_S` on the node's clock, so that happens with no
consumer attached.

Consumers are members of the group in the store (`Store.join_group`), so exclusive consumers, consumer counts
and auto-delete hold across the cluster; a process that dies leaves no member behind (the survivor that saw it
die releases its members and deletes its exclusive queues: `process_gone`; a node's next start releases those
of its earlier processes: `drop_orphans`). An unbound binding keeps what it routed to the queue
(`ConsumerGroups.set_filters`, counted until drained).

Limits of the mapping, by design: two nodes binding the same queue at the same instant may lose one binding (the
record is read, changed and written back).
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from tidewire.gateway.core.group_reader import Delivery
from tidewire.gateway.core.retry import Backoff, stop_if_cancelled
from tidewire.gateway.core.tenants import mount_filter, vhost_mount
from tidewire.gateway.core.topics import first_level_queue, matches
from tidewire.gateway.protocols.amqp.arguments import ARGUMENT_NAMES, ATTRS, QueueArgs, show
from tidewire.gateway.protocols.amqp.backlog import Backlog
from tidewire.gateway.protocols.amqp.codec import NOT_FOUND, PRECONDITION_FAILED, RESOURCE_LOCKED, Fault, Method, fault
from tidewire.gateway.protocols.amqp.dead_letters import EXPIRED, DeadLetters, vhost_of
from tidewire.gateway.protocols.amqp.exchanges import Exchanges, stored_bindings
from tidewire.gateway.protocols.amqp.mapping import queue_topic
from tidewire.store.base import GroupRecord

if TYPE_CHECKING:
    from tidewire.gateway.node import Node

GROUP_PREFIX = "amqp/"
REBIND = "amqp.rebind"  # the cluster call that has every node read a queue's bindings again
PURGE_BATCH = 1000
_FAR_MS = 1 << 50


def group_name(vhost: str, queue: str) -> str:
    return f"{GROUP_PREFIX}{vhost}/{queue}"


@dataclass(frozen=True, slots=True)
class QueueSpec:
    name: str
    durable: bool
    exclusive: bool
    auto_delete: bool
    args: QueueArgs = dataclasses.field(default_factory=QueueArgs)


class Cancellable(Protocol):
    def server_cancel(self) -> None:
        """The queue is gone: tell the client (Basic.Cancel) and stop."""


class Queues:
    """Queue operations for every connection of this node (one per server)."""

    def __init__(self, node: Node, exchanges: Exchanges | None = None) -> None:
        self.node = node
        self.dead_letters = DeadLetters(node, exchanges if exchanges is not None else Exchanges(node))
        self.backlog = Backlog(node, self.dead_letters)
        self._swept: set[str] = set()  # groups with a TTL, a dead-letter exchange or a limit, used on this node
        self.local_consumers: dict[str, set[Cancellable]] = {}  # group → consumers on this node
        self._expiring: dict[str, tuple[int, float]] = {}  # group → (x-expires ms, last use here, monotonic)
        self._stored_use: dict[str, float] = {}  # group → when `used_ms` was last written (monotonic)
        self._listing: asyncio.Task[list[GroupRecord]] | None = None  # the store read of every group in flight
        self._listings = 0  # how many such reads were started
        node.topology.answer(REBIND, self._rebound)

    # --- lookups -----------------------------------------------------------------------------------------
    async def find(self, vhost: str, queue: str, conn_id: str, method: Method) -> GroupRecord | Fault:
        """The queue's record, known to this node's groups (its TTL matcher installed); 404 / 405 otherwise."""
        record = await self.node.groups.get(group_name(vhost, queue))
        if record is None:
            return fault(NOT_FOUND, f"no queue '{queue}' in vhost '{vhost}'", method)
        owner = record.attrs.get("exclusive")
        if owner and owner != conn_id:
            return fault(RESOURCE_LOCKED, f"cannot obtain exclusive access to locked queue '{queue}' in vhost "
                                          f"'{vhost}'", method)
        self._install(record)
        return record

    def _install(self, record: GroupRecord) -> None:
        args = QueueArgs.of(record.attrs)
        sink = None
        if args.dlx is not None:
            async def sink(name: str, deliveries: list[Delivery], record: GroupRecord = record) -> None:
                await self.dead_letters.deliveries(record, deliveries, EXPIRED)

        self.node.groups.expiry(record.name, args.ttl_ms, sink)
        if args.ttl_ms is not None or args.dlx is not None or args.limited:
            self._swept.add(record.name)
        if args.expires_ms is not None:
            self._expiring[record.name] = (args.expires_ms, self.node.clock.monotonic())

    def args(self, name: str) -> QueueArgs:
        """The queue's arguments as this node knows them (defaults for a queue it does not know)."""
        record = self.node.groups.known(name)
        return QueueArgs() if record is None else QueueArgs.of(record.attrs)

    def touch(self, name: str) -> None:
        """The queue is used (declared, consumed, read): an x-expires queue's clock starts again."""
        entry = self._expiring.get(name)
        if entry is not None:
            self._expiring[name] = (entry[0], self.node.clock.monotonic())

    # --- declare -----------------------------------------------------------------------------------------
    async def declare(self, vhost: str, spec: QueueSpec, conn_id: str,
                      method: Method) -> tuple[GroupRecord, bool] | Fault:
        attrs: dict[str, Any] = {"queue": spec.name, "exclusive": conn_id if spec.exclusive else "",
                                 "auto_delete": spec.auto_delete, **spec.args.attrs(), "bindings": []}
        if spec.exclusive:  # it goes with this process too, if the process dies (`process_gone`)
            attrs["process"] = self.node.topology.holder
        record = GroupRecord(group_name(vhost, spec.name), [mount_filter(vhost_mount(vhost), queue_topic(spec.name))],
                             spec.durable, attrs=attrs)
        stored, created = await self.node.groups.declare(record)
        if not created:
            found = await self.find(vhost, spec.name, conn_id, method)
            if isinstance(found, Fault):
                return found
            stored = found
            current = stored.attrs
            theirs_args = QueueArgs.of(current)
            for arg, mine, theirs in (("durable", spec.durable, stored.durable),
                                      ("exclusive", spec.exclusive, bool(current.get("exclusive"))),
                                      ("auto_delete", spec.auto_delete, bool(current.get("auto_delete"))),
                                      *((ARGUMENT_NAMES[a], getattr(spec.args, a), getattr(theirs_args, a))
                                        for a in ATTRS)):
                if mine != theirs:
                    return fault(PRECONDITION_FAILED, f"inequivalent arg '{arg}' for queue '{spec.name}' in vhost "
                                                      f"'{vhost}': received '{show(mine)}' but current is "
                                                      f"'{show(theirs)}'", method)
        self._install(stored)
        self.touch(stored.name)
        return stored, created

    # --- bindings ----------------------------------------------------------------------------------------
    async def bind(self, record: GroupRecord, exchange: str, key: str, topic_filter: str,
                   arguments: str = "") -> None:
        bindings = _bindings(record)
        if [exchange, key, topic_filter, arguments] not in bindings:
            bindings.append([exchange, key, topic_filter, arguments])
        await self._store_bindings(record, bindings)

    async def unbind(self, record: GroupRecord, exchange: str, key: str, arguments: str = "") -> None:
        bindings = [b for b in _bindings(record) if not (b[0] == exchange and b[1] == key and b[3] == arguments)]
        await self._store_bindings(record, bindings)

    async def _store_bindings(self, record: GroupRecord, bindings: list[list[str]]) -> None:
        # A copy: `record` may be the very object node.groups holds, and set_filters diffs old against new.
        changed = dataclasses.replace(record, attrs={**record.attrs, "bindings": bindings})
        queue = str(record.attrs.get("queue", record.name.rsplit("/", 1)[-1]))
        # Bindings keep the client's filters (the routing graph matches them); what the queue reads is mounted.
        mount = vhost_mount(vhost_of(record))
        await self.node.groups.set_filters(changed, [mount_filter(mount, f) for f in (
            queue_topic(queue), *(b[2] for b in bindings if b[2]))])
        # Bind-Ok / Unbind-Ok once every live node reads the new bindings: a consumer elsewhere reading the old
        # ones would take what is published after an unbind, or move the queue's cursor past what a new
        # binding routes (lost to the queue).
        await self.node.topology.ask_others(REBIND, record.name, None)

    async def _rebound(self, name: str) -> int:
        """Another node changed the queue's bindings (`_store_bindings`)."""
        await self.node.groups.reread(name)
        return 204

    async def bound_to(self, vhost: str, exchange: str) -> list[GroupRecord]:
        """Every queue of the vhost with a binding to `exchange` (a scan: exchange deletion is rare)."""
        prefix = group_name(vhost, "")
        return [record for record in await self.node.store.list_groups()
                if record.name.startswith(prefix) and any(b[0] == exchange for b in _bindings(record))]

    async def drop_bindings(self, vhost: str, exchange: str) -> None:
        for record in await self.bound_to(vhost, exchange):
            await self._store_bindings(record, [b for b in _bindings(record) if b[0] != exchange])

    async def routed_in_store(self, topic: str) -> bool:
        """Does a group stored *now* (on any node) read `topic`, or a stored session (an offline persistent one
        included) subscribe to it exactly or to its first level (`<first>/#`; its other wildcards are in the
        cluster-wide set `node.groups.routed` saw)? For a mandatory publish that this node's view finds
        unroutable (groups refreshed once a second): the client may have bound the queue through another node a
        moment ago, and an offline session gets the message when it comes back. One read of the groups serves
        every caller that arrived before it began; when the store cannot answer, the publish counts as routed
        (stored, never wrongly returned)."""
        try:
            records = await self._groups_now()
            if any(matches(topic_filter, topic) for record in records for topic_filter in record.filters):
                return True
            candidates = [topic, first_level_queue(topic)]
            if not topic.startswith("$"):
                candidates.append("#")
            return await self.node.store.subscribed(candidates)
        except Exception:
            return True

    async def _groups_now(self) -> list[GroupRecord]:
        arrived = self._listings
        while True:
            task = self._listing
            if task is None or task.done():
                self._listings += 1
                task = self._listing = asyncio.get_running_loop().create_task(self.node.store.list_groups())
            started = self._listings
            result = await asyncio.shield(task)
            if started > arrived:  # this read began after the caller arrived: it sees what the client saw
                return result

    # --- contents ----------------------------------------------------------------------------------------
    async def message_count(self, record: GroupRecord) -> int:
        """Ready messages, exact (deliveries awaiting their ack are not counted, as in RabbitMQ), once expired
        heads are gone and the queue is within its length limits."""
        await self.backlog.trim(record)
        return await self.ready_count(record)

    async def ready_count(self, record: GroupRecord) -> int:
        """Ready messages, exact, as they are now (no trim: for Get-Ok, right after one)."""
        count, _ = await self.backlog.ready(record)
        return count

    async def purge(self, record: GroupRecord) -> int:
        """Drop what is ready: new messages (the cursor moves to the log's end) and claims visible again.
        Deliveries still unacked stay, as in RabbitMQ. Returns the count dropped."""
        count = await self.message_count(record)
        store = self.node.store
        cursor, _ = await store.group_position(record.name)
        if cursor < 0:
            return 0
        await store.claim(record.name, cursor, max(cursor, store.last_seq()), [], self.node.node_id, _FAR_MS)
        while True:
            now_ms = int(self.node.clock.time() * 1000)
            claims = await store.reclaim(record.name, self.node.node_id, now_ms, _FAR_MS, PURGE_BATCH)
            if claims:
                await store.settle(record.name, [(c.seq, c.token) for c in claims])
            if len(claims) < PURGE_BATCH:
                return count

    async def delete(self, record: GroupRecord) -> int:
        """Delete the queue; its consumers on this node get Basic.Cancel. Returns its ready message count."""
        count = await self.message_count(record)
        for consumer in list(self.local_consumers.get(record.name, ())):
            consumer.server_cancel()
        self.local_consumers.pop(record.name, None)
        self._expiring.pop(record.name, None)
        self._stored_use.pop(record.name, None)
        self._swept.discard(record.name)
        self.backlog.forget(record.name)
        await self.node.groups.delete(record.name)
        return count

    # --- consumers, counted cluster-wide (`Store.join_group`) ----------------------------------------------
    async def join(self, name: str, member: str, exclusive: bool) -> bool:
        """Register a consumer of the queue; False if an exclusive consumer holds it anywhere in the cluster, or
        if `exclusive` and it has a consumer anywhere."""
        node = self.node
        return await node.store.join_group(name, member, node.node_id, node.topology.holder, exclusive) >= 0

    async def leave(self, name: str, member: str) -> None:
        """A consumer stopped: an auto-delete queue goes when that was its last consumer anywhere. If the store
        cannot take that now, it is retried in the background (the channel closes meanwhile): a member left
        registered would keep an exclusive consumer's lock."""
        try:
            await self._leave(name, member)
        except Exception as exc:
            self.node.spawn(self._leave_later(name, member, exc))

    async def _leave(self, name: str, member: str) -> None:
        store = self.node.store
        if await store.leave_group(name, member):
            return
        record = await store.get_group(name)
        if record is not None and record.attrs.get("auto_delete"):
            await self.delete(record)

    async def _leave_later(self, name: str, member: str, exc: Exception) -> None:
        retry = Backoff("amqp consumer leave", self.node.clock, self.node.store_health)
        while True:
            await asyncio.sleep(retry.failed(exc))
            try:
                await self._leave(name, member)
            except Exception as again:
                stop_if_cancelled()
                exc = again
            else:
                retry.succeeded()
                return

    async def consumer_count(self, record: GroupRecord) -> int:
        return await self.node.store.group_members(record.name)

    async def process_gone(self, process: str, emptied: list[str]) -> None:
        """A process of the cluster died (`ConsumerGroups.owner_gone`, on the survivor that saw it): the exclusive
        queues of its connections go, and so do the auto-delete queues its consumers were the last of."""
        emptied_set = set(emptied)
        for record in await self.node.store.list_groups():
            attrs = record.attrs
            if not record.name.startswith(GROUP_PREFIX):
                continue
            if (attrs.get("exclusive") and attrs.get("process") == process) or (
                    record.name in emptied_set and attrs.get("auto_delete")):
                await self.delete(record)

    # --- x-expires ---------------------------------------------------------------------------------------
    async def expire_due(self) -> None:
        """Delete the x-expires queues nobody used for that long. Use on this node is tracked here; use on
        other nodes is what they wrote to `used_ms` (each node writes it while it has consumers)."""
        groups = self.node.groups
        clock = self.node.clock
        now = clock.monotonic()
        for name, (expires_ms, last_used) in list(self._expiring.items()):
            if groups.consumer_count(name):
                self._expiring[name] = (expires_ms, now)
                if now - self._stored_use.get(name, 0.0) >= max(expires_ms / 3000, 0.5):
                    self._stored_use[name] = now
                    await self._write_use(name)
                continue
            if (now - last_used) * 1000 < expires_ms:
                continue
            record = await self.node.store.get_group(name)
            if record is None:
                self._expiring.pop(name, None)
                continue
            used_ms = record.attrs.get("used_ms")
            if isinstance(used_ms, int) and (idle_ms := int(clock.time() * 1000) - used_ms) < expires_ms:
                self._expiring[name] = (expires_ms, now - idle_ms / 1000)  # used on another node: look again then
                continue
            await self.delete(record)

    # --- expiry at the head and length limits, whether or not a consumer is attached ---------------------
    async def sweep(self) -> None:
        """Expired messages at the heads of the queues this node used go (dead-lettered if the queue says so);
        limited queues are trimmed (`Backlog.trim`). On the node's clock: the server calls it every
        `EXPIRY_CHECK_S`, a test calls it after moving its clock."""
        groups = self.node.groups
        for name in list(self._swept):
            record = groups.known(name)
            if record is None:
                self._swept.discard(name)
                continue
            await groups.expire_head(name)
            await self.backlog.trim(record)

    async def _write_use(self, name: str) -> None:
        record = await self.node.store.get_group(name)
        if record is not None:
            record.attrs["used_ms"] = int(self.node.clock.time() * 1000)
            await self.node.store.put_group(record)

    async def forget_owner(self, conn_id: str, names: set[str]) -> None:
        """A connection closed: its exclusive queues go."""
        for name in names:
            record = await self.node.store.get_group(name)
            if record is not None and record.attrs.get("exclusive") == conn_id:
                await self.delete(record)

    async def drop_orphans(self) -> None:
        """At start: exclusive queues of this node's previous life (their connections are gone), its consumers
        (no longer members) and the auto-delete queues they were the last consumers of."""
        node = self.node
        emptied = set(await node.store.release_members(node.node_id))
        marker = "-" + node.node_id + "-"
        for record in await node.store.list_groups():
            owner = record.attrs.get("exclusive")
            if record.name.startswith(GROUP_PREFIX) and (
                    (isinstance(owner, str) and marker in owner) or (
                    record.name in emptied and record.attrs.get("auto_delete"))):
                await node.groups.delete(record.name)


def _bindings(record: GroupRecord) -> list[list[str]]:
    return stored_bindings(record.attrs.get("bindings"))
