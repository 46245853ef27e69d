"""The slot table: 4096 slots, each owned by one member, derived by every node alike from an epoch's members.

Rendezvous (highest-random-weight) hashing per slot: a slot goes to the member with the highest mixed hash
of (member, slot). Every node computes the same table from the same member set whatever order it lists them
in; a join moves only the slots the newcomer wins (about 1/n) and a leave only the leaver's slots.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Iterable

from tidewire.store.base import P2P_PREFIX

SLOTS = 4096
_MASK = (1 << 64) - 1


def slot_of(key: str) -> int:
    return zlib.crc32(key.encode()) % SLOTS


def route_key(queue: str) -> str:
    """The key whose slot holds what notify needs for `queue`: a P2P queue lives with its client's location."""
    return queue[len(P2P_PREFIX):] if queue.startswith(P2P_PREFIX) else queue


def _mix(x: int) -> int:
    """splitmix64's finaliser: a cheap, well-spread 64-bit mix."""
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & _MASK
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & _MASK
    return x ^ (x >> 31)


class SlotTable:
    """Owners of all slots for one epoch's member set. Immutable."""

    def __init__(self, epoch: int, members: Iterable[str]) -> None:
        self.epoch = epoch
        self.members: tuple[str, ...] = tuple(sorted(set(members)))
        seeds = [(int.from_bytes(hashlib.blake2b(m.encode(), digest_size=8).digest(), "big"), m)
                 for m in self.members]
        owners: list[str] = []
        for slot in range(SLOTS):
            salt = _mix(slot + 0x9E3779B97F4A7C15)
            owners.append(max(seeds, key=lambda s: (_mix(s[0] ^ salt), s[1]))[1] if seeds else "")
        self._owners = tuple(owners)

    def owner(self, slot: int) -> str | None:
        owner = self._owners[slot]
        return owner or None

    def owner_of(self, key: str) -> str | None:
        return self.owner(slot_of(key))

    def slots_of(self, node_id: str) -> list[int]:
        return [i for i, owner in enumerate(self._owners) if owner == node_id]
