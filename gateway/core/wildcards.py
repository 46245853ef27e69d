"""The wildcard set this node indexes appends with, and which queues a topic is indexed into.

Queues of a topic: the full topic, its first level (`a/#`), every filter of the cluster-wide wildcard set that
matches it, and `p2p#<clientId>` for P2P topics. The wildcard set lives in the store: this node adds a filter when
its first local holder appears (an online session, a `$share` group, another protocol's consumer group, or a
stored session parked here) and removes it when its last one goes. An append carries the version of the set its
queues were computed with, and the store refuses a stale one, so a message is never indexed without a wildcard
some node registered before it was appended.

A stored (offline) session's filters are held without its id (`_stored`): a node does not track its offline
sessions one by one, so their memory follows what is online. Which stored filters are still needed is asked of
the store's counts now and then (`prune_stored`): a filter whose stored sessions all expired or were evicted
stops being held, and indexed, within two checks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from typing import TYPE_CHECKING

from tidewire.gateway.core.topics import FilterTrie, first_level_queue, is_wildcard
from tidewire.store.base import P2P_PREFIX, SHARED_PREFIX, p2p_queue

if TYPE_CHECKING:
    from tidewire.gateway.core.topology import Topology
    from tidewire.gateway.core.writes import RecordWrites
    from tidewire.store.base import Store

_TOPIC_CACHE = 65536
WILDCARD_WRITE = "wildcard:"  # the ordered writes (add, remove) of one filter's registration in the store


def p2p_target(topic: str) -> str | None:
    """`<first>/p2p/<clientId>` → clientId."""
    parts = topic.split("/", 2)
    return parts[2] if len(parts) == 3 and parts[1] == "p2p" and parts[2] else None


def is_first_level_queue(topic_filter: str) -> bool:
    """`a/#` is the first-level queue every message of `a/...` is indexed into anyway."""
    head = topic_filter[:-2]
    return topic_filter.endswith("/#") and "/" not in head and "+" not in head and "#" not in head


def is_wildcard_queue(topic_filter: str) -> bool:
    """Does `topic_filter` need an index of its own (a wildcard that is not a first-level or P2P queue)?"""
    return is_wildcard(topic_filter) and not is_first_level_queue(topic_filter) and not topic_filter.startswith(
        P2P_PREFIX)


class WildcardIndex:
    """The wildcard filters this node holds (and why), the cluster-wide set as last read, and the topic → queues
    computation appends use (`queues_for`, `wildcard_version`, `refresh_wildcards`: `gateway.core.appends`)."""

    def __init__(self, store: Store, writes: RecordWrites, topology: Topology) -> None:
        self.store = store
        self.writes = writes
        self.topology = topology
        self._holders: dict[str, set[str]] = {}  # wildcard filter → ids of local sessions/groups that need it
        # Wildcard filters of stored (offline) sessions: from the store's counts at start, from sessions parked
        # since and from a dead node's; `prune_stored` lets go of those no stored session holds any more.
        self._stored: set[str] = set()
        # Stored filters held since the last prune began: the next prune does not let go of them (the count it
        # reads may predate the session record that holds them).
        self._touched: set[str] = set()
        # What appends are indexed with: the store's set and what is held here.
        self._trie: FilterTrie[str] = FilterTrie()
        self._indexed: set[str] = set()  # the filters in `_trie`
        self.wildcard_version = -1  # of the store's set as last read; -1: none read yet (appends unchecked)
        self._topic_queues: dict[str, tuple[str, ...]] = {}  # cleared whenever the wildcard set changes
        self._refreshing: asyncio.Task[None] | None = None  # the read of the set that registrations wait for
        self._refresh_again = False  # a registration landed after that read started: read once more

    def __len__(self) -> int:
        return len(self._trie)

    # --- topics → queues --------------------------------------------------------------------------------
    def queues_for(self, topic: str) -> tuple[str, ...]:
        queues = self._topic_queues.get(topic)
        if queues is None:
            if len(self._topic_queues) >= _TOPIC_CACHE:
                self._topic_queues.clear()  # bounded; hot topics come back on their next publish
            queues = self._topic_queues[topic] = self._compute_queues(topic)
        return queues

    def peek_queues(self, topic: str) -> tuple[str, ...]:
        """`queues_for` without caching: a topic asked about once (a client's $SYS event) must not fill it."""
        return self._topic_queues.get(topic) or self._compute_queues(topic)

    def matches(self, topic: str) -> bool:
        """Does a filter of the wildcard set match `topic`?"""
        return bool(len(self._trie) and self._trie.match(topic))

    def _compute_queues(self, topic: str) -> tuple[str, ...]:
        target = p2p_target(topic)
        if target is not None:
            return (p2p_queue(target),)  # reaches only that client: no topic, level or wildcard queue
        first = first_level_queue(topic)
        queues = [topic, first]
        if len(self._trie):
            queues += [f for f, _ in self._trie.match(topic)]
        return tuple(queues)

    # --- holding ----------------------------------------------------------------------------------------
    def held(self, topic_filter: str) -> bool:
        return topic_filter in self._holders or topic_filter in self._stored

    def hold(self, topic_filter: str, owner: str | None) -> None:
        """`owner` holds the filter from now on (None: a stored session, counted in `_stored`); a no-op unless
        it is a wildcard queue."""
        if not is_wildcard_queue(topic_filter):
            return
        if not self.held(topic_filter):
            self._index(topic_filter)
            store = self.store
            self.writes.write(WILDCARD_WRITE + topic_filter, lambda: self._registered(
                store.add_wildcards([topic_filter], self.topology.holder)))
        if owner is None:
            self._stored.add(topic_filter)
            self._touched.add(topic_filter)
        else:
            self._holders.setdefault(topic_filter, set()).add(owner)

    def release(self, topic_filter: str, owner: str) -> None:
        holders = self._holders.get(topic_filter)
        if holders is None or owner not in holders:
            return
        holders.discard(owner)
        if not holders:
            del self._holders[topic_filter]
            if topic_filter not in self._stored:
                self._unregister([topic_filter])

    def park(self, topic_filter: str, owner: str) -> None:
        """`owner`'s session went offline, stored: its hold of `topic_filter` becomes a stored session's."""
        holders = self._holders.get(topic_filter)
        if holders is not None and owner in holders:
            self._stored.add(topic_filter)
            self._touched.add(topic_filter)
            holders.discard(owner)
            if not holders:
                del self._holders[topic_filter]

    def _index(self, topic_filter: str) -> None:
        if topic_filter not in self._indexed:
            self._indexed.add(topic_filter)
            self._trie.add(topic_filter, "")
            self._topic_queues.clear()  # indexed from now on by this node's appends

    def _unregister(self, filters: list[str]) -> None:
        for topic_filter in filters:
            self._write_removal(topic_filter)

    def _write_removal(self, topic_filter: str) -> None:
        store = self.store
        self.writes.write(WILDCARD_WRITE + topic_filter, lambda: self._registered(
            store.remove_wildcards([topic_filter], self.topology.holder)))

    async def load_stored(self, filters: Iterable[str]) -> None:
        """At start: hold the wildcards of the stored sessions (from the store's counts), registered in one call,
        not one call (and one read of the whole set) each. The node reads the set once it is loaded."""
        fresh: list[str] = []
        for topic_filter in filters:
            if is_wildcard_queue(topic_filter) and not topic_filter.startswith(SHARED_PREFIX):
                if not self.held(topic_filter):
                    fresh.append(topic_filter)
                self._stored.add(topic_filter)
                self._touched.add(topic_filter)
        if fresh:
            for topic_filter in fresh:
                self._index(topic_filter)
            await self.store.add_wildcards(fresh, self.topology.holder)

    async def hold_stored(self, filters: Iterable[str]) -> None:
        """Hold stored sessions' wildcard `filters` here (shared ones are skipped) and return once the store has
        them: a survivor takes over what a dead node held for the sessions it parked."""
        wanted = [f for f in filters if not f.startswith(SHARED_PREFIX)]
        for topic_filter in wanted:
            self.hold(topic_filter, None)
        for topic_filter in wanted:
            await self.writes.settled(WILDCARD_WRITE + topic_filter)

    async def hold_again(self) -> None:
        """Register every wildcard filter held here again, under `topology.holder` as it is now (a node that
        rejoined the cluster holds under a new name, and its old name's holds were released)."""
        held = list(self._holders.keys() | self._stored)
        if held:
            await self.store.add_wildcards(held, self.topology.holder)
            await self.refresh_wildcards()

    async def prune_stored(self) -> int:
        """Let go of the stored filters no stored session holds any more (their sessions expired, were evicted
        or deleted) and no local holder needs; returns how many. Filters held since the previous prune began are
        kept until the next: the store's counts may not have them yet."""
        recent, self._touched = self._touched, set()
        if not self._stored:
            return 0
        counts = await self.store.subscription_filters()
        gone = [f for f in self._stored if not counts.get(f) and f not in recent and f not in self._touched]
        if not gone:
            return 0
        self._stored.difference_update(gone)
        self._stored = set(self._stored)  # a set does not shrink as it empties: the memory goes with a copy
        self._unregister([f for f in gone if f not in self._holders])
        return len(gone)

    # --- the store's set ----------------------------------------------------------------------------------
    async def _registered(self, change: Awaitable[int]) -> None:
        await change
        # One read of the whole set serves every registration that landed before it started (a flood of
        # subscribes to new wildcards reads the set once per round, not once per subscribe).
        if self._refreshing is None:
            self._refreshing = asyncio.get_running_loop().create_task(self._refresh_rounds())
        else:
            self._refresh_again = True
        await asyncio.shield(self._refreshing)

    async def _refresh_rounds(self) -> None:
        try:
            while True:
                self._refresh_again = False
                await self.refresh_wildcards()
                if not self._refresh_again:
                    return
        finally:
            self._refreshing = None

    async def refresh_wildcards(self) -> None:
        """Read the store's wildcard set and index with it (plus what local holders are registering)."""
        version, filters = await self.store.wildcards()
        if version < self.wildcard_version:
            return  # an older answer overtaken by a newer one
        wanted = filters | self._holders.keys() | self._stored
        indexed = self._indexed
        if wanted != indexed:
            for topic_filter in indexed - wanted:
                self._trie.remove(topic_filter, "")
            for topic_filter in wanted - indexed:
                self._trie.add(topic_filter, "")
            self._indexed = set(wanted)
            self._topic_queues.clear()
        self.wildcard_version = version
