"""A per-node cache of the newest messages of each queue that has local subscribers.

A cached queue is complete for seqs in (head, tail]: everything the store holds for it in that range is here,
in seq order, and `tail` is the `upto` of the store's last answer (not the last message seen), so a reader
merging several queues knows how far each one is known. `refresh` pulls (tail, store end] once per notify
no matter how many subscribers wait on the queue; `add_appended` takes a batch this node just appended
without reading it back when nothing else can lie in its range, and a batch appended while a read of the queue
is under way when that read ends (a networked store's reads overlap the next appends). A reader behind `head`
gets None and reads the store itself, so a slow session never pins memory here.
"""

from __future__ import annotations

import asyncio
from bisect import bisect_right
from collections.abc import Sequence

from tidewire.store.base import Message, Store


class _CachedQueue:
    __slots__ = ("head", "joined", "messages", "parked", "pulling", "refs", "seal", "seqs", "stale", "tail")

    def __init__(self, start_seq: int) -> None:
        self.head = start_seq
        self.tail = start_seq
        self.seqs: list[int] = []
        self.messages: list[Message] = []
        self.refs = 0
        self.pulling = False  # a store read is in progress, shared by every caller
        # What callers that joined it wait on; made only when one joins: a read that does not suspend has none.
        self.joined: asyncio.Future[None] | None = None
        self.stale = False
        self.seal = 0
        # Shares of batches appended during a read, (after, batch's last seq, share): taken when the read ends.
        self.parked: list[tuple[int, int, list[Message]]] | None = None


class QueueCache:
    """`hits`/`misses` count the reads `get` could / could not answer (kept only with `metrics`)."""

    def __init__(self, store: Store, per_queue: int = 4096, pull_batch: int = 1024, *, metrics: bool = True) -> None:
        self._store = store
        self._per_queue = per_queue
        self._pull_batch = pull_batch
        self._queues: dict[str, _CachedQueue] = {}
        self.metrics = metrics
        self.hits = 0
        self.misses = 0

    def track(self, queue: str) -> None:
        """Start caching `queue` from the store's current end (called per local subscriber)."""
        cached = self._queues.get(queue)
        if cached is None:
            cached = self._queues[queue] = _CachedQueue(self._store.last_seq())
        cached.refs += 1

    def untrack(self, queue: str) -> None:
        cached = self._queues.get(queue)
        if cached is not None:
            cached.refs -= 1
            if cached.refs <= 0:
                del self._queues[queue]

    def tracked(self, queue: str) -> bool:
        return queue in self._queues

    def tracked_queues(self) -> list[str]:
        return list(self._queues)

    async def refresh(self, queue: str, seal: int = 0, max_reads: int = 0) -> bool:
        """Pull what is new for `queue` (complete at least up to `seal`); concurrent callers share the pull
        in progress and return when it has covered their call too. At most `max_reads` store reads (0: until
        caught up), so readers are served while publishers keep a slow store busy; True if more is waiting."""
        cached = self._queues.get(queue)
        if cached is None:
            return False
        if seal > cached.seal:
            cached.seal = seal
        if cached.pulling:
            cached.stale = True  # the running pull loops once more instead of a second concurrent read
            if cached.joined is None:
                cached.joined = asyncio.get_running_loop().create_future()
            await asyncio.shield(cached.joined)
            return False  # the pull joined is its starter's: it reports what is left
        cached.pulling = True
        reads = 0
        more = False
        try:
            while True:
                cached.stale = False
                seal = cached.seal if cached.seal > cached.tail else 0
                messages, upto = await self._store.read(queue, cached.tail, self._pull_batch, seal)
                reads += 1
                if messages:
                    self._append(cached, messages)
                if upto > cached.tail:
                    cached.tail = upto
                if cached.parked is not None:
                    self._unpark(cached)
                if len(messages) < self._pull_batch and not cached.stale:
                    break
                if reads == max_reads:
                    more = True
                    break
        except Exception as exc:
            if (joined := self._finished(cached)) is not None:
                joined.set_exception(exc)
                joined.exception()  # marked retrieved: only callers that wait on it see it
            raise
        except BaseException:
            if (joined := self._finished(cached)) is not None:
                joined.cancel()
            raise
        if (joined := self._finished(cached)) is not None:
            joined.set_result(None)
        return more

    @staticmethod
    def _finished(cached: _CachedQueue) -> asyncio.Future[None] | None:
        joined, cached.joined = cached.joined, None
        cached.pulling = False
        cached.parked = None  # what the read did not connect to is read next time
        return joined

    def _unpark(self, cached: _CachedQueue) -> None:
        """After a read: take the parked shares that continue what is now known (the read may hold part)."""
        parked, cached.parked = cached.parked or [], None
        for after, last, share in parked:
            if last <= cached.tail:
                continue  # the read got all of it
            if after > cached.tail:
                break  # something between is unknown: left to a read, and so is every later share
            rest = share if share[0].seq > cached.tail else [m for m in share if m.seq > cached.tail]
            self._append(cached, rest)
            cached.tail = last

    def add_appended(self, messages: Sequence[Message], after: int | None) -> set[str]:
        """Messages the caller just appended, numbered by the store; returns the cached queues they completed.

        `after` is what the store's `append` returned: it holds nothing but this batch in (after, last seq].
        A cached queue complete up to at least `after` (and below the batch) takes its share from the batch with
        no store read and is complete up to the batch's last seq; one being read takes it when the read ends, if
        the read reached `after`. Any other queue is left to `refresh`."""
        queues = self._queues
        if not messages or not queues or after is None:
            return set()
        first = messages[0].seq
        last = after
        shares: dict[str, list[Message]] = {}
        for message in messages:
            if message.seq <= last:
                return set()  # not ascending: not a batch as `append` numbers one
            last = message.seq
            for queue in message.queues:
                if queue in queues:
                    share = shares.get(queue)
                    if share is None:
                        share = shares[queue] = []
                    share.append(message)
        completed: set[str] = set()
        for queue, share in shares.items():
            cached = queues[queue]
            if cached.pulling:
                if cached.parked is None:
                    cached.parked = []
                cached.parked.append((after, last, share))
            elif after <= cached.tail < first:
                self._append(cached, share)
                cached.tail = last
                completed.add(queue)
        return completed

    def known_upto(self, queue: str) -> int:
        """The seq up to which the cached queue is complete (-1: not cached)."""
        cached = self._queues.get(queue)
        return -1 if cached is None else cached.tail

    def get(self, queue: str, after_seq: int, limit: int) -> tuple[list[Message], int] | None:
        """Up to `limit` cached messages with seq > after_seq and the seq up to which that answer is complete;
        None if the cache can't answer completely."""
        cached = self._queues.get(queue)
        if cached is None or after_seq < cached.head:
            if self.metrics:
                self.misses += 1
            return None
        if self.metrics:
            self.hits += 1
        start = bisect_right(cached.seqs, after_seq)
        messages = cached.messages[start : start + limit]
        if len(messages) == limit and limit:
            return messages, messages[-1].seq
        return messages, cached.tail

    def _append(self, cached: _CachedQueue, batch: list[Message]) -> None:
        cached.seqs.extend(m.seq for m in batch)
        cached.messages.extend(batch)
        overflow = len(cached.seqs) - self._per_queue
        if overflow > 0:
            # Drop a quarter extra so trimming is amortised rather than per message.
            cut = overflow + self._per_queue // 4
            cached.head = cached.seqs[cut - 1]
            del cached.seqs[:cut]
            del cached.messages[:cut]
