"""A per-node cache of the newest messages of each queue that has local subscribers.

A cached queue is complete for seqs in (head, tail]: everything the store holds for it in that range is here,
in seq order. `refresh` pulls (tail, store end] once per notify no matter how many subscribers wait on the
queue; a reader behind `head` gets None and reads the store itself, so a slow session never pins memory here.
"""

from __future__ import annotations

from bisect import bisect_right

from store.base import Message, Store


class _CachedQueue:
    __slots__ = ("head", "messages", "pulling", "refs", "seqs", "stale", "tail")

    def __init__(self, start_seq: int) -> None:
        self.head = start_seq
        self.tail = start_seq
        self.seqs: list[int] = []
        self.messages: list[Message] = []
        self.refs = 0
        self.pulling = False
        self.stale = False


class QueueCache:
    def __init__(self, store: Store, per_queue: int = 4096, pull_batch: int = 1024) -> None:
        self._store = store
        self._per_queue = per_queue
        self._pull_batch = pull_batch
        self._queues: dict[str, _CachedQueue] = {}

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

    async def refresh(self, queue: str) -> None:
        """Pull everything new for `queue`; concurrent callers share the pull in progress."""
        cached = self._queues.get(queue)
        if cached is None:
            return
        if cached.pulling:
            cached.stale = True  # the running pull loops once more instead of a second concurrent read
            return
        cached.pulling = True
        try:
            while True:
                cached.stale = False
                batch = await self._store.read(queue, cached.tail, self._pull_batch)
                if batch:
                    self._append(cached, batch)
                if len(batch) < self._pull_batch and not cached.stale:
                    return
        finally:
            cached.pulling = False

    def get(self, queue: str, after_seq: int, limit: int) -> list[Message] | None:
        """Up to `limit` cached messages with seq > after_seq; None if the cache can't answer completely."""
        cached = self._queues.get(queue)
        if cached is None or after_seq < cached.head:
            return None
        start = bisect_right(cached.seqs, after_seq)
        return cached.messages[start : start + limit]

    def _append(self, cached: _CachedQueue, batch: list[Message]) -> None:
        cached.seqs.extend(m.seq for m in batch)
        cached.messages.extend(batch)
        cached.tail = batch[-1].seq
        overflow = len(cached.seqs) - self._per_queue
        if overflow > 0:
            # Drop a quarter extra so trimming is amortised rather than per message.
            cut = overflow + self._per_queue // 4
            cached.head = cached.seqs[cut - 1]
            del cached.seqs[:cut]
            del cached.messages[:cut]
