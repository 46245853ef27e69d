"""Notify dispatch: rounds that refresh the cache for notified queues and let their local readers pull.

One round runs at a time. The names of a small batch this node appended itself are dispatched by the flush
loop, in its own tick, right after the append (`run_inline`): the cache took the batch as appended
(`QueueCache.add_appended`) or the store answers reads without suspending (the embedded one), so the
subscribers' PUBLISH is written in the same loop tick as the append, with no task switch, Event or
`call_soon` in between. A round whose reads did suspend (a networked store, a cold read) hands the next
rounds that read to the dispatch task (`loop`), so that appends keep overlapping with reads; a round that
read and ran to the end at once hands them back. Names from elsewhere (other nodes, resyncs) and large
batches go through the task. A failed round is retried by the task with backoff; no name is dropped.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING, Protocol

from tidewire.gateway.core.awaiting import awaited
from tidewire.gateway.core.retry import Backoff, stop_if_cancelled
from tidewire.store.base import P2P_PREFIX

if TYPE_CHECKING:
    from tidewire.cache.queue_cache import QueueCache
    from tidewire.gateway.core.clock import Clock
    from tidewire.gateway.core.subscriptions import Puller

log = logging.getLogger("tidewire.node")

REFRESH_READS = 4  # store reads per queue per dispatch round before its readers pull
# Appended messages up to which the flush loop dispatches them itself. A larger batch means load: its round goes
# to the task, so that acks and sync completions are served between the append and the push (a tick of delay is
# nothing next to that batch's own time, while a longer step delays publishers' acks).
INLINE_MAX_MESSAGES = 64

class P2PReader(Protocol):
    """The one reader of a client's P2P queue (its session): told that the queue has news, then pulled."""

    def p2p_notified(self) -> None:
        """Its P2P queue has news: read it at the next pull."""

    def pull(self) -> None: ...


class Dispatcher:
    """The node's notify dispatch (see the module doc)."""

    __slots__ = ("_busy", "_cache", "_failure", "_fresh", "_p2p_reader", "_pending", "_readers", "_reads_inline",
                 "_retry", "_wanted")

    def __init__(self, readers: Mapping[str, Collection[Puller]], p2p_reader: Callable[[str], P2PReader | None],
                 cache: QueueCache, clock: Clock) -> None:
        """`readers`: queue -> its local readers (the subscription registry's, read live); `p2p_reader(client
        id)`: the session reading that client's P2P queue on this node, if any."""
        self._readers = readers
        self._p2p_reader = p2p_reader
        self._cache = cache
        self._pending: set[str] = set()  # notified, not yet dispatched
        # Of those, queues with news only from this node's appends: the highest seq appended to each. A round
        # reads such a queue only if the cache does not know it that far (`QueueCache.add_appended` took the
        # batches, at once or when a read under way ended).
        self._fresh: dict[str, int] = {}
        self._busy = False  # a round runs, or the task backs off after a failure: it takes `_pending` after
        self._reads_inline = True  # the last round that read the store did not suspend: the flush loop may read too
        self._failure: Exception | None = None  # an inline round's, for the task's backoff
        self._wanted = asyncio.Event()
        self._retry = Backoff("dispatch", clock)

    @property
    def inline(self) -> bool:
        """Whether the flush loop runs a round that reads the store itself (else the dispatch task does; a
        round that needs no read, every queue being taken from the append, is always the flush loop's)."""
        return self._reads_inline

    def notified(self, queues: set[str]) -> None:
        """Names from the notifier or a resync: the dispatch task takes them."""
        fresh = self._fresh
        if fresh:
            for queue in queues:
                fresh.pop(queue, None)  # news from elsewhere: read them
        self._pending |= queues
        self._wanted.set()

    def appended(self, queues: set[str], upto: int) -> None:
        """Names of batches this node just appended, the last of which ended at seq `upto`: `run_inline` takes
        them, unless rounds are the task's."""
        pending, fresh = self._pending, self._fresh
        for queue in queues:
            if queue not in pending or queue in fresh:
                fresh[queue] = upto  # else: waiting with news from elsewhere, and read for them
        pending |= queues

    def _known(self, queue: str, fresh: dict[str, int]) -> bool:
        seq = fresh.get(queue)
        return seq is not None and self._cache.known_upto(queue) >= seq

    async def run_inline(self, messages: int) -> None:
        """One round in the calling task (the flush loop, which appended `messages`), if names wait and no other
        round is under way."""
        if not self._pending or self._busy:
            return  # a round under way takes them when it ends
        if messages > INLINE_MAX_MESSAGES:
            self._wanted.set()
            return
        if not self._reads_inline:
            readers, fresh = self._readers, self._fresh
            if any(q in readers and not self._known(q, fresh) for q in self._pending):
                self._wanted.set()  # this round reads and reads suspend: the task's, not to hold up appends
                return
        self._busy = True
        try:
            failure = await self._round()
        finally:
            self._busy = False
        if failure is not None:
            self._failure = failure
            self._wanted.set()
        elif self._pending:  # notified while this round was suspended
            self._wanted.set()

    async def loop(self) -> None:
        """The dispatch task."""
        retry = self._retry
        while True:
            await self._wanted.wait()
            self._wanted.clear()
            if self._busy:
                continue  # an inline round is suspended: it hands over whatever is left when it ends
            self._busy = True
            try:
                failure, self._failure = self._failure, None
                while True:
                    if failure is not None:
                        await asyncio.sleep(retry.failed(failure))
                    if not self._pending:
                        break
                    failure = await self._round()
            finally:
                self._busy = False

    async def _round(self) -> Exception | None:
        queues, self._pending = self._pending, set()
        fresh, self._fresh = self._fresh, {}
        try:
            read, suspended = await awaited(self._dispatch(queues, fresh))
        except Exception as exc:
            # A read failed before any reader pulled: nothing was skipped. Notify the same queues again.
            self._pending |= queues
            stop_if_cancelled()
            return exc
        if read:  # a round without reads says nothing about the store
            self._reads_inline = not suspended
        self._retry.succeeded()
        return None

    async def _dispatch(self, queues: set[str], fresh: dict[str, int]) -> bool:
        """One round; whether it read the store (refreshed a queue)."""
        # P2P first, before any pull moves a cursor past a P2P message not yet seen
        p2p: list[P2PReader] = []
        for queue in queues:
            if queue.startswith(P2P_PREFIX):
                owner = self._p2p_reader(queue[len(P2P_PREFIX):])
                if owner is not None:
                    owner.p2p_notified()
                    p2p.append(owner)
        readers = self._readers
        live = [q for q in queues if q in readers]
        # Every refresh before any pull: a reader merging several queues must not pass a message of a queue
        # whose refresh failed.
        cache = self._cache
        read = False
        for queue in live:
            if self._known(queue, fresh):
                continue
            read = True
            if await cache.refresh(queue, max_reads=REFRESH_READS):
                # The rest in a round of the task, after these readers pulled: a busy queue starves no one.
                self._pending.add(queue)
                self._wanted.set()
        for queue in live:
            for reader in list(readers.get(queue, ())):
                try:
                    reader.pull()
                except Exception:  # one reader's bug must not stop delivery to every other one
                    log.exception("dispatch.pull_failed", extra={"queue": queue})
        for session in p2p:
            session.pull()
        return read
