"""Who reads which queue on this node, and the subscriptions that decide it.

Local readers of a queue are sessions and shared-subscription groups; notify wakes them by queue name. A P2P
queue has one reader, its client's session, which notify finds through the client's location. Which queues a
topic is indexed into, and the wildcard set that decides it, are `gateway.core.wildcards`'s: subscriptions hold
and release their wildcard filters there.

A session is whatever satisfies `Subscriber` (MQTT sessions, `gateway.sessions.session.Session`) and a
subscription asked for whatever satisfies `FilterRequest` (MQTT's `SubscriptionRequest`); `subscribe` answers
with the granted QoS or a `Refusal`, `unsubscribe` with whether there was a subscription, and each protocol
answers its client with its own codes: the registry knows nothing of a protocol.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from enum import StrEnum
from typing import TYPE_CHECKING, Protocol

from tidewire.extensions.hooks import Authorizer, ClientInfo, SubscribeAccess
from tidewire.gateway.core.shared import GroupMember, SharedGroup, parse_shared, strategy_for
from tidewire.gateway.core.tenants import mount_point, reserved, unmount
from tidewire.gateway.core.topics import valid_topic_filter
from tidewire.gateway.core.wildcards import WILDCARD_WRITE, WildcardIndex, is_wildcard_queue
from tidewire.store.base import P2P_PREFIX, SHARED_PREFIX, SessionRecord, SubscriptionRecord, p2p_queue

if TYPE_CHECKING:
    from tidewire.cache.queue_cache import QueueCache
    from tidewire.gateway.config import MqttSettings
    from tidewire.gateway.core.consumers import ConsumerGroups
    from tidewire.gateway.core.topology import Topology
    from tidewire.gateway.core.writes import RecordWrites
    from tidewire.lookup.base import Lookup
    from tidewire.store.base import Store

log = logging.getLogger("tidewire.subscriptions")

SHARE_WRITE = "share:"  # the ordered writes (declare, delete) of a `$share` group's store group


class Puller(Protocol):
    def pull(self) -> None: ...


class Subscriber(GroupMember, Puller, Protocol):
    """What the registry needs of a session: it reads its queues (`pull`) and is a member of its groups."""

    @property
    def record(self) -> SessionRecord:
        """Its subscriptions are `record.subscriptions` (where they are added)."""
    # Filters the ACL grants only in part, and the check each delivery through them takes (set here).
    filtered: set[str] | None
    read_check: Callable[[str], bool] | None

    @property
    def subscriptions(self) -> dict[str, SubscriptionRecord]:
        """`record.subscriptions` to read: an idle session has no record and shares an empty table."""

    def subscriptions_changed(self) -> None:
        """Its subscriptions were added to or removed."""


class FilterRequest(Protocol):
    """A subscription asked for: a filter (`$share/<group>/<filter>` for a shared one) and its options."""

    @property
    def topic_filter(self) -> str: ...

    @property
    def qos(self) -> int: ...

    @property
    def no_local(self) -> bool: ...

    @property
    def retain_as_published(self) -> bool: ...

    @property
    def retain_handling(self) -> int: ...


class Refusal(StrEnum):
    """Why `subscribe` refuses a filter (in place of a granted QoS)."""

    FILTER_INVALID = "filter invalid"  # not a valid filter, or over the configured levels or length
    QUOTA_EXCEEDED = "quota exceeded"  # the session has max_subscriptions already
    NOT_AUTHORIZED = "not authorized"  # the ACL denies it


class GroupsOwner(Protocol):
    """Who holds the node's consumer groups, which its `$share` groups are (made after the registry)."""

    @property
    def groups(self) -> ConsumerGroups: ...


class SubscriptionRegistry:
    """Which local readers read which queues, the wildcard set appends are indexed with, and the node's `$share`
    groups. It gets the few parts it uses, not the node."""

    def __init__(self, node_id: str, settings: MqttSettings, store: Store, writes: RecordWrites, lookup: Lookup,
                 cache: QueueCache, authorizer: Authorizer, topology: Topology, group_owner: GroupsOwner) -> None:
        self.node_id = node_id
        self.settings = settings
        self.store = store
        self.writes = writes
        self.lookup = lookup
        self.cache = cache
        self.authorizer = authorizer
        self.topology = topology
        self.group_owner = group_owner  # whose consumer groups the `$share` groups are
        self.readers: dict[str, set[Puller]] = {}
        self.groups: dict[str, SharedGroup] = {}
        self.wildcards = WildcardIndex(store, writes, topology)

    # --- readers ------------------------------------------------------------------------------------------
    def _register(self, reader: Puller, queue: str) -> None:
        readers = self.readers.get(queue)
        if readers is None:
            readers = self.readers[queue] = set()
        if reader not in readers:
            readers.add(reader)
            self.cache.track(queue)
            self.lookup.add_queue_subscriber(queue, self.node_id)

    def _unregister(self, reader: Puller, queue: str) -> None:
        readers = self.readers.get(queue)
        if readers is not None and reader in readers:
            readers.discard(reader)
            if not readers:
                del self.readers[queue]
            self.cache.untrack(queue)
            self.lookup.remove_queue_subscriber(queue, self.node_id)

    # --- for other readers (consumer groups of other protocols: `gateway.core.consumers`) --------------------------
    def add_reader(self, reader: Puller, queue: str) -> None:
        self._register(reader, queue)

    def remove_reader(self, reader: Puller, queue: str) -> None:
        self._unregister(reader, queue)

    async def wildcards_registered(self, filters: list[str]) -> None:
        """Wait until the store has every wildcard among `filters`, and every `$share` group among them (before
        SUBACK: a message published after it must be indexed into the new subscription's queue on every node,
        and be the group's)."""
        for topic_filter in filters:
            prefix = SHARE_WRITE if topic_filter.startswith(SHARED_PREFIX) else WILDCARD_WRITE
            await self.writes.settled(prefix + topic_filter)

    def routed(self, topic: str) -> bool:
        """Does a reader on this node, a wildcard of the cluster-wide set, or a node the lookup names for one of
        its queues take messages of `topic`? (An offline session's exact-topic subscription is not seen.)"""
        readers = self.readers
        # Not through `queues_for`: a topic asked about once (a client's $SYS event) must not fill its cache.
        queues = self.wildcards.peek_queues(topic)
        for queue in queues:
            if queue in readers:
                return True
        if self.wildcards.matches(topic):
            return True
        if not self.topology.shared and not queues[0].startswith(P2P_PREFIX):
            return False  # one node: its lookup knows of no reader of these queues that `readers` does not
        lookup = self.lookup
        for queue in queues:  # subscribers on other nodes; a lookup that can't tell (None) counts as routed
            nodes = lookup.nodes_for_queue(queue)
            if nodes is None or nodes:
                return True
        return False

    # --- shared groups --------------------------------------------------------------------------------------
    def group(self, key: str) -> SharedGroup:
        """This node's part of `$share` group `key`; made (and its store group declared) when first needed."""
        group = self.groups.get(key)
        if group is None:
            parsed = parse_shared(key)
            assert parsed is not None
            settings = self.settings
            group = self.groups[key] = SharedGroup(
                self.group_owner.groups, key, strategy_for(parsed[0], settings.shared_strategy,
                                                           settings.shared_strategies), settings.pull_batch)
            self.writes.write(SHARE_WRITE + key, group.open)
        return group

    def _release_group(self, key: str, client_id: str) -> None:
        group = self.groups.get(key)
        if group is None:
            return
        group.refs.discard(client_id)
        if not group.refs:
            del self.groups[key]
            group.leave_all()
            self.writes.write(SHARE_WRITE + key, lambda: self._drop_group(key, group.queue))

    async def _drop_group(self, key: str, queue: str) -> None:
        """No session here holds `$share` group `key`: delete its store group unless a stored session or
        another node's reader of its queue may still be a member (an unused group costs its wildcard's index)."""
        if key in self.groups or await self.store.shared_members(key):
            return
        if self.topology.shared:
            nodes = self.lookup.nodes_for_queue(queue)
            if nodes is None or set(nodes) - {self.node_id}:
                return
        await self.group_owner.groups.delete(key)

    # --- sessions ---------------------------------------------------------------------------------------------
    async def load(self, store: Store) -> None:
        """At startup: the wildcard set and shared groups of the stored sessions, from the store's counts (not
        every session: memory and time follow what is online)."""
        filters = await store.subscription_filters()
        for topic_filter in filters:
            if topic_filter.startswith(SHARED_PREFIX) and parse_shared(topic_filter) is not None:
                self.group(topic_filter).refs.update(await store.shared_members(topic_filter))
        await self.wildcards.load_stored(filters)
        if not self.topology.shared:  # alone, this node knows every member: a group without one is gone
            for record in await store.list_groups():
                if record.name.startswith(SHARED_PREFIX) and record.name not in self.groups:
                    await store.delete_group(record.name)

    def park(self, record: SessionRecord) -> None:
        """A persistent session went offline: its wildcards stay indexed, held as a stored session's."""
        for topic_filter in record.subscriptions:
            self.wildcards.park(topic_filter, record.client_id)

    def attach(self, session: Subscriber, client: ClientInfo, *, own_queue: bool = True) -> None:
        """An online session starts reading its queues (and joins its groups). `own_queue` False: a session just
        started clean, which makes its P2P subscription itself when first needed (most clients are never sent a
        P2P message, and an idle connection should not hold a record, a queue name and a dict entry for it)."""
        if own_queue:
            record = session.record
            own_p2p = p2p_queue(session.client_id)
            if own_p2p not in record.subscriptions:
                record.subscriptions[own_p2p] = SubscriptionRecord(own_p2p, 2, since_seq=self.store.last_seq())
        for topic_filter, sub in session.subscriptions.items():
            if topic_filter.startswith(SHARED_PREFIX):
                self.group(topic_filter).join(session, sub)
            elif not topic_filter.startswith(P2P_PREFIX):  # the P2P queue is read by the session on notice
                self._register(session, topic_filter)
                # the ACL may have changed while the client was away
                self._set_access(session, client, topic_filter,
                                 self.authorizer.subscribe_access(client, topic_filter))
        session.subscriptions_changed()
        if getattr(client.acl, "revokes_subscriptions", False):  # grants that remove what they no longer allow
            self.recheck(session, client)

    def resume_groups(self, session: Subscriber) -> None:
        """The session's connection is bound now: its groups may deliver to it (a group that tried while the
        session was being restored found no connection and stopped)."""
        for key in session.subscriptions:
            if key.startswith(SHARED_PREFIX) and (group := self.groups.get(key)) is not None:
                group.schedule_pull()

    def detach(self, session: Subscriber) -> None:
        for topic_filter in session.subscriptions:
            if topic_filter.startswith(SHARED_PREFIX):
                group = self.groups.get(topic_filter)
                if group is not None:
                    group.leave(session)
            elif not topic_filter.startswith(P2P_PREFIX):
                self._unregister(session, topic_filter)

    def forget(self, record: SessionRecord) -> None:
        """The session is gone for good: its wildcard references and group memberships go too."""
        for topic_filter in record.subscriptions:
            if topic_filter.startswith(SHARED_PREFIX):
                self._release_group(topic_filter, record.client_id)
            else:
                self.wildcards.release(topic_filter, record.client_id)

    # --- SUBSCRIBE / UNSUBSCRIBE ---------------------------------------------------------------------
    def subscribe(self, session: Subscriber, client: ClientInfo, requests: Sequence[FilterRequest],
                  sub_id: int) -> tuple[list[int | Refusal], list[tuple[str, int, int]], list[str]]:
        """Returns per request the granted QoS or why it is refused, the (filter, qos, subscription id) whose
        retained messages to send, and what the answer to the client waits for: the wildcard filters being added
        to the store's set and the `$share` groups being declared (`registered`)."""
        authorizer: Authorizer = self.authorizer
        settings = self.settings
        codes: list[int | Refusal] = []
        retained: list[tuple[str, int, int]] = []
        registering: list[str] = []
        for request in requests:
            key = request.topic_filter
            shared = parse_shared(key) if key.startswith(SHARED_PREFIX) else None
            topic_filter = shared[1] if shared is not None else key
            if (key.startswith(SHARED_PREFIX) and shared is None) or not valid_topic_filter(topic_filter) or (
                    topic_filter.count("/") >= settings.max_topic_levels) or (
                    len(key.encode()) > settings.max_topic_length):
                codes.append(Refusal.FILTER_INVALID)
                continue
            if settings.max_subscriptions and key not in session.subscriptions and (
                    sum(1 for k in session.subscriptions if not k.startswith(P2P_PREFIX))
                    >= settings.max_subscriptions):
                codes.append(Refusal.QUOTA_EXCEEDED)
                continue
            if client.tenant is None and not client.superuser and reserved(topic_filter):
                codes.append(Refusal.NOT_AUTHORIZED)  # the tenants' space: only a default-tenant superuser's
                continue
            # The ACL reads a tenant client's filters as the client wrote them, without its mount point.
            access = authorizer.subscribe_access(client, topic_filter if client.tenant is None else
                                                 unmount(mount_point(client.tenant), topic_filter))
            if access == SubscribeAccess.DENIED:
                log.info("acl.denied", extra={"client_id": session.client_id, "filter": key, "access": "subscribe"})
                codes.append(Refusal.NOT_AUTHORIZED)
                continue
            qos = min(request.qos, 2)
            existing = session.subscriptions.get(key)
            since = existing.since_seq if existing is not None else self.store.last_seq()
            sub = session.record.subscriptions[key] = SubscriptionRecord(
                key, qos, request.no_local, request.retain_as_published, request.retain_handling, sub_id, since)
            if shared is not None:
                if key not in self.groups:
                    registering.append(key)  # its store group's filter is held as a wildcard when declared
                self.group(key).join(session, sub)  # retained messages are not sent to shared subscriptions
            else:
                self._set_access(session, client, key, access)
                if existing is None:
                    self._register(session, key)
                    if is_wildcard_queue(key) and not self.wildcards.held(key):
                        registering.append(key)
                    self.wildcards.hold(key, session.client_id)
                if request.retain_handling == 0 or (request.retain_handling == 1 and existing is None):
                    retained.append((key, qos, sub_id))
            codes.append(qos)
        session.subscriptions_changed()
        return codes, retained, registering

    def unsubscribe(self, session: Subscriber, filters: list[str]) -> list[bool]:
        """Per filter: was there a subscription to it (now removed)?"""
        removed: list[bool] = []
        for key in filters:
            if key.startswith(P2P_PREFIX) or session.subscriptions.pop(key, None) is None:
                removed.append(False)
                continue
            if key.startswith(SHARED_PREFIX):
                group = self.groups.get(key)
                if group is not None:
                    group.leave(session)
                self._release_group(key, session.client_id)
            else:
                if session.filtered:
                    session.filtered.discard(key)
                self._unregister(session, key)
                self.wildcards.release(key, session.client_id)
            removed.append(True)
        session.subscriptions_changed()
        return removed

    def recheck(self, session: Subscriber, client: ClientInfo) -> list[str]:
        """The client's grants changed while it is connected (dynamic security): each subscription is asked again;
        those no longer allowed are removed (returned), the others are checked per message or not as now granted."""
        authorizer = self.authorizer
        revoked: list[str] = []
        for key in list(session.subscriptions):
            if key.startswith(P2P_PREFIX):
                continue
            shared = parse_shared(key) if key.startswith(SHARED_PREFIX) else None
            topic_filter = shared[1] if shared is not None else key
            access = authorizer.subscribe_access(client, topic_filter)
            if access == SubscribeAccess.DENIED:
                revoked.append(key)
            elif shared is None:
                self._set_access(session, client, key, access)
        if revoked:
            self.unsubscribe(session, revoked)
        return revoked

    def _set_access(self, session: Subscriber, client: ClientInfo, topic_filter: str, access: SubscribeAccess) -> None:
        if access == SubscribeAccess.GRANTED:
            if session.filtered:
                session.filtered.discard(topic_filter)
            return
        if session.filtered is None:
            session.filtered = set()
        session.filtered.add(topic_filter)
        if session.read_check is None:
            authorizer = self.authorizer
            if client.tenant is None:
                session.read_check = lambda topic: authorizer.allow_read(client, topic)
            else:
                mount = mount_point(client.tenant)
                session.read_check = lambda topic: authorizer.allow_read(client, unmount(mount, topic))
