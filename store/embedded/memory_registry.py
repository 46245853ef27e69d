"""The cluster-wide records of a store that only one node ever uses, kept in memory: the wildcard set and leases.

The embedded engine serves one node, so these are rebuilt at every start: the node registers the wildcard
filters of its sessions again, and takes the leases it needs.
"""

from __future__ import annotations

import time
from collections.abc import Sequence


class MemoryRegistry:
    def __init__(self) -> None:
        # filter -> the holders that hold it. Every filter of a node has the same holders, so the sets are
        # shared (one per distinct set, in _holder_sets): a set of its own would cost each of 100,000 stored
        # wildcard filters ~240 B.
        self.wildcard_holders: dict[str, frozenset[str]] = {}
        self.wildcard_version = 0
        self._holder_sets: dict[frozenset[str], frozenset[str]] = {}
        self._leases: dict[str, tuple[str, float, int]] = {}  # key -> (holder, until (monotonic), epoch)

    def _shared(self, holders: frozenset[str]) -> frozenset[str]:
        return self._holder_sets.setdefault(holders, holders)

    def add_wildcards(self, filters: Sequence[str], holder: str) -> int:
        for f in filters:
            holders = self.wildcard_holders.get(f)
            if holders is None:
                self.wildcard_version += 1
                self.wildcard_holders[f] = self._shared(frozenset((holder,)))
            elif holder not in holders:
                self.wildcard_holders[f] = self._shared(holders | {holder})
        return self.wildcard_version

    def remove_wildcards(self, filters: Sequence[str], holder: str) -> int:
        for f in filters:
            holders = self.wildcard_holders.get(f)
            if holders is not None and holder in holders:
                if len(holders) == 1:
                    del self.wildcard_holders[f]
                    self.wildcard_version += 1
                else:
                    self.wildcard_holders[f] = self._shared(holders - {holder})
        return self.wildcard_version

    def release_wildcards(self, holder: str) -> int:
        return self.remove_wildcards([f for f, h in self.wildcard_holders.items() if holder in h], holder)

    def lease(self, key: str, owner: str, ttl_ms: int) -> int:
        now = time.monotonic()
        holder, until, epoch = self._leases.get(key, ("", 0.0, 0))
        if holder and holder != owner and until > now:
            return 0
        if holder != owner or until <= now:
            epoch += 1  # taken anew: a former holder's epoch is now stale
        self._leases[key] = (owner, now + ttl_ms / 1000, epoch)
        return epoch

    def release(self, key: str, owner: str) -> None:
        holder, _, epoch = self._leases.get(key, ("", 0.0, 0))
        if holder == owner:
            self._leases[key] = ("", 0.0, epoch)
