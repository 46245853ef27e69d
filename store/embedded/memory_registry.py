"""The cluster-wide records of a store that only one node ever uses, kept in memory: the wildcard set and leases.

The embedded engine serves one node, so these are rebuilt at every start: the node registers the wildcard
filters of its sessions again, and takes the leases it needs.
"""

from __future__ import annotations

import time
from collections.abc import Sequence


class MemoryRegistry:
    def __init__(self) -> None:
        self.wildcard_holders: dict[str, set[str]] = {}  # filter -> the holders (node ids) that hold it
        self.wildcard_version = 0
        self._leases: dict[str, tuple[str, float, int]] = {}  # key -> (holder, until (monotonic), epoch)

    def add_wildcards(self, filters: Sequence[str], holder: str) -> int:
        for f in filters:
            holders = self.wildcard_holders.setdefault(f, set())
            if not holders:
                self.wildcard_version += 1
            holders.add(holder)
        return self.wildcard_version

    def remove_wildcards(self, filters: Sequence[str], holder: str) -> int:
        for f in filters:
            holders = self.wildcard_holders.get(f)
            if holders is not None and holder in holders:
                holders.discard(holder)
                if not holders:
                    del self.wildcard_holders[f]
                    self.wildcard_version += 1
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
