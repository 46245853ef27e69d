"""Leases on slot owners' answers: which nodes read a queue, cached by a publishing node for a bounded time.

A publisher that routes a queue's name through its slot owner gets the owner's answer back as a lease: for
`lease` seconds it notifies the readers' nodes directly, one hop instead of two. The owner remembers each
holder until its lease ends and sends it the new answer whenever the queue's readers change. A holder that
used a lease when a change arrives tells the nodes the change added, so a reader that joined between the
owner's change and the holder learning of it hears of the news. An update lost with a broken connection
leaves a holder wrong for at most the lease: the cost is a delayed message (sessions re-read their queues),
never a lost one. Both sides are bounded in entries and take their clock as an argument.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

Clock = Callable[[], float]

DEFAULT_LEASE = 5.0  # seconds a publisher may use an owner's answer
MAX_HELD = 100_000  # answers one publisher holds; the oldest goes first
MAX_GRANTED = 200_000  # (queue, holder) leases one owner tracks; beyond it, answers are not leased


class _Held:
    __slots__ = ("expires", "nodes", "used")

    def __init__(self, nodes: frozenset[str], expires: float) -> None:
        self.nodes = nodes
        self.expires = expires
        self.used = False


class HeldLeases:
    """The publisher side: queue -> (nodes with readers, until when), for one epoch."""

    def __init__(self, clock: Clock, max_entries: int = MAX_HELD) -> None:
        self.clock = clock
        self.max_entries = max_entries
        self.epoch = -1
        self._held: dict[str, _Held] = {}

    def __len__(self) -> int:
        return len(self._held)

    def nodes(self, queue: str, epoch: int) -> frozenset[str] | None:
        """The leased answer for `queue`, or None when there is none valid now (then route via the owner)."""
        if epoch != self.epoch:
            self.clear(epoch)
            return None
        held = self._held.get(queue)
        if held is None:
            return None
        if held.expires <= self.clock():
            del self._held[queue]
            return None
        held.used = True
        return held.nodes

    def take(self, epoch: int, duration: float, answers: Iterable[tuple[str, frozenset[str]]]) -> None:
        """Leases granted by an owner (for `epoch`, valid `duration` seconds from now)."""
        if epoch != self.epoch:
            self.clear(epoch)
        expires = self.clock() + duration
        held = self._held
        for queue, nodes in answers:
            held.pop(queue, None)  # re-inserted last: eviction takes the oldest grant first
            while len(held) >= self.max_entries:
                del held[next(iter(held))]
            held[queue] = _Held(nodes, expires)

    def update(self, epoch: int, queue: str, nodes: frozenset[str]) -> frozenset[str]:
        """An owner's new answer for a leased queue; returns the nodes to tell now (added since a use)."""
        held = self._held.get(queue) if epoch == self.epoch else None
        if held is None:
            return frozenset()
        added = nodes - held.nodes if held.used else frozenset()
        held.nodes = nodes
        return added

    def clear(self, epoch: int | None = None) -> None:
        self._held.clear()
        if epoch is not None:
            self.epoch = epoch


class GrantedLeases:
    """The owner side: queue -> {holder: until when}, for one epoch."""

    def __init__(self, clock: Clock, duration: float, max_entries: int = MAX_GRANTED) -> None:
        self.clock = clock
        self.duration = duration
        self.max_entries = max_entries
        self._granted: dict[str, dict[str, float]] = {}
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def grant(self, queue: str, holder: str) -> bool:
        """Remember that `holder` may use our answer for `queue`; False when full (then no lease is given)."""
        holders = self._granted.get(queue)
        if holders is None:
            if self._count >= self.max_entries:
                return False
            holders = self._granted[queue] = {}
        if holder not in holders:
            if self._count >= self.max_entries:
                return False
            self._count += 1
        holders[holder] = self.clock() + self.duration
        return True

    def holders(self, queue: str) -> list[str]:
        """Holders of a current lease on `queue` (expired ones are forgotten)."""
        if queue not in self._granted:
            return []
        return self._expire(queue, self.clock())

    def _expire(self, queue: str, now: float) -> list[str]:
        holders = self._granted[queue]
        expired = [h for h, until in holders.items() if until <= now]
        for h in expired:
            del holders[h]
        self._count -= len(expired)
        if not holders:
            del self._granted[queue]
        return list(holders)

    def all_holders(self) -> set[str]:
        now = self.clock()
        return {h for holders in self._granted.values() for h, until in holders.items() if until > now}

    def drop_holder(self, holder: str) -> None:
        for queue in [q for q, holders in self._granted.items() if holder in holders]:
            del self._granted[queue][holder]
            self._count -= 1
            if not self._granted[queue]:
                del self._granted[queue]

    def sweep(self) -> None:
        """Forget every expired lease (bounded memory for queues that never change)."""
        now = self.clock()
        for queue in list(self._granted):
            self._expire(queue, now)

    def clear(self) -> None:
        self._granted.clear()
        self._count = 0
