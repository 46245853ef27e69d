"""Acknowledgements that wait for Redis replicas (`store_replicas` > 0; one Redis, usually behind Sentinel).

`sync()` returns once `replicas` replicas hold every write the primary had replied to (`RedisConn.wait_replicas`:
INCR of a counter key + WAIT on one connection), or raises `RedisUnavailable` when fewer answer within
`timeout`: the caller retries and acknowledges nothing meanwhile.

Batches appended since the last confirmed sync are kept (at most `backlog` messages; `check_room` refuses an
append beyond it until a sync succeeds), each with `RedisConn.primary_changes` when it began: how many primaries
the sentinels had named, so a batch begun at count n went to the n-th primary or a later one. A promoted replica
has a new replication id: when `sync()` finds one, the kept batches begun before the current primary was named
may have died with the old one, so they are appended again (copies with new seqs, after whatever the node
appended on the new primary meanwhile; the ones the replica had are then stored twice: at-least-once) before it
waits again; with no change of address seen, every kept batch is. Only messages are kept: an offset or session
written just before a failover may still be lost (offsets: redelivery).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable

from tidewire.store.base import Message
from tidewire.store.redis.conn import RedisConn, RedisUnavailable

log = logging.getLogger("tidewire.store")

BACKLOG = 100_000  # messages appended and not yet confirmed on the replicas


class ReplicaWaits:
    def __init__(self, conn: RedisConn, key: str, replicas: int, timeout: float, backlog: int = BACKLOG) -> None:
        if replicas < 1 or backlog < 1 or timeout <= 0:
            raise ValueError("replicas and replica_backlog must be >= 1, replica_timeout over 0")
        self._conn = conn
        self._key = key  # INCR'd before each WAIT
        self.replicas = replicas
        self.timeout = timeout
        self.backlog = backlog
        self._kept: list[tuple[int, list[Message]]] = []  # (primary_changes at its start, batch)
        self._kept_count = 0
        self._replid = ""  # the primary's replication id at the last confirmed sync
        self._replid_changes = 0  # `primary_changes` when that id was learnt
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        """Learn the primary's replication id (WAIT 0: no wait)."""
        _, self._replid = await self._conn.wait_replicas(self._key, 0, 1)
        self._replid_changes = self._conn.primary_changes

    def check_room(self) -> int:
        """Before an append: raises `RedisUnavailable` when the backlog is full; else the count to pass to
        `appended`."""
        if self._kept_count >= self.backlog:
            raise RedisUnavailable(f"redis unavailable: {self._kept_count} messages appended are not yet "
                                   f"confirmed by {self.replicas} replicas (replica_backlog {self.backlog})")
        return self._conn.primary_changes

    def appended(self, began: int, batch: list[Message]) -> None:
        self._kept.append((began, batch))
        self._kept_count += len(batch)

    async def sync(self, append: Callable[[list[Message]], Awaitable[object]]) -> None:
        """Until the replicas confirm every write so far; `append` stores a batch again on a new primary."""
        async with self._lock:
            await self._sync(append)

    async def _sync(self, append: Callable[[list[Message]], Awaitable[object]]) -> None:
        covered = len(self._kept)  # appended before this call: what its acknowledgement may cover
        timeout_ms = max(1, round(self.timeout * 1000))
        while True:
            acked, replid = await self._conn.wait_replicas(self._key, self.replicas, timeout_ms)
            changes = self._conn.primary_changes  # the WAIT talked to this primary or an earlier one
            if replid != self._replid:
                # A new primary: what the old one took since the last confirmed sync may be gone (appends that
                # returned before now and began under a former primary went to it), so those are sent again.
                covered = len(self._kept)
                since = changes if changes > self._replid_changes else None  # None: no new address seen
                lost = [batch for began, batch in self._kept[:covered] if since is None or began < since]
                log.warning("store: the Redis primary changed (replication id %s -> %s): appending the %d "
                            "messages not yet confirmed by replicas again", self._replid, replid,
                            sum(len(b) for b in lost))
                for batch in lost:
                    await append([dataclasses.replace(m, seq=-1, encoded=None) for m in batch])
                # Only now: a failure above sends them all again on the retry.
                self._replid, self._replid_changes = replid, changes
                continue  # WAIT again, now past the copies
            if acked < self.replicas:
                raise RedisUnavailable(f"redis unavailable: {acked} of {self.replicas} replicas confirmed the "
                                       f"writes within {self.timeout} s")
            break
        self._kept_count -= sum(len(b) for _, b in self._kept[:covered])
        del self._kept[:covered]
