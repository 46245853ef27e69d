"""The embedded store engine: commit log (with its queue indexes) + RocksDB metadata, with group-committed fsync.

Everything runs synchronously on the event loop except the fsync, which hops to a thread once per group of
concurrent `sync()` callers. The async signatures exist so a networked engine can implement the same `Store`.
The log as readers see it (`read_log`, holds) is the `store.embedded.log` mixin; sessions, retained messages
and wills are the `store.embedded.record_calls` mixin over `store.embedded.meta.store`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from array import array
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from tidewire.errors import StaleWildcards, StoreClosed
from tidewire.store.base import Message, Slice
from tidewire.store.embedded.files import fsync_dir
from tidewire.store.embedded.log import EmbeddedLog, lowest_hold
from tidewire.store.embedded.memory_registry import MemoryRegistry
from tidewire.store.embedded.meta.options import DEFAULT_LIMITS, MetaLimits
from tidewire.store.embedded.meta.store import MetaStore
from tidewire.store.embedded.record_calls import RecordCalls
from tidewire.store.embedded.segment_index import IndexWriter
from tidewire.store.embedded.segments import CommitLog
from tidewire.store.groups import GroupCalls, GroupTable, KVDeletes, KVSets
from tidewire.store.members import GroupMembers

log = logging.getLogger("tidewire.store")

FsyncPolicy = Literal["batch", "interval", "never"]
_datasync = getattr(os, "fdatasync", os.fsync)


def _fsync_all(fds: list[int], meta: MetaStore | None, dir_path: Path | None) -> None:
    """Runs in a worker thread: one hop for every file of the group."""
    for fd in fds:
        _datasync(fd)
    if meta is not None:
        meta.sync_work()
    if dir_path is not None:
        fsync_dir(dir_path)


class EmbeddedStore(RecordCalls, GroupCalls, EmbeddedLog):
    """The engine. `retention_ignores_holds`: retention deletes segments past the size or age limits even when
    a log reader's hold (`hold_log`) still needs them. `segment_max_queues`: a segment that has indexed this
    many distinct queues is sealed early (its queue index then leaves the heap for its index file; 0: no
    limit). `index_checkpoint_bytes`: the active segment's index is checkpointed each time it grew this much,
    which bounds what a restart after a crash scans (0: only at close). `meta_limits`: RocksDB's memory and
    threads for the records."""

    def __init__(
        self,
        data_dir: str | Path,
        *,
        fsync: FsyncPolicy = "batch",
        fsync_interval_ms: int = 50,
        segment_bytes: int = 64 * 2**20,
        retention_bytes: int = 0,
        retention_seconds: int = 0,
        recent_messages: int = 100_000,
        retention_ignores_holds: bool = False,
        segment_max_queues: int = 200_000,
        index_checkpoint_bytes: int = 16 * 2**20,
        meta_limits: MetaLimits = DEFAULT_LIMITS,
    ) -> None:
        if fsync not in ("batch", "interval", "never"):
            raise ValueError(f"fsync must be batch, interval or never, not {fsync!r}")
        self.data_dir = Path(data_dir)
        self.fsync_policy: FsyncPolicy = fsync
        self.fsync_interval = fsync_interval_ms / 1000
        self.retention_bytes = retention_bytes
        self.retention_seconds = retention_seconds
        self.retention_ignores_holds = retention_ignores_holds
        self._log = CommitLog(self.data_dir / "log", segment_bytes, segment_max_queues, index_checkpoint_bytes)
        # Index files of sealed segments are written in a worker thread as segments are sealed.
        self._indexer = IndexWriter(self._log.next_index_job, self._log.index_written)
        self._log.on_unindexed = self._indexer.kick
        self.meta_limits = meta_limits
        # Ring of the most recent messages, slot seq % size: the hot tail is read without I/O and the very
        # objects appended are returned (the gateway caches encoded packets on them).
        self._ring_size = max(0, recent_messages)
        self._ring: list[Message | None] = [None] * self._ring_size
        self._next_seq = 1
        self._registry = MemoryRegistry()
        self._members = GroupMembers()
        self._groups = GroupTable(self._group_write, self._group_written)
        # Group commit: every write bumps _write_gen; a sync round makes everything up to the gen it
        # captured durable.
        self._write_gen = 0
        self._synced_gen = 0
        self._sync_task: asyncio.Task[None] | None = None
        self._tick: asyncio.Future[None] | None = None  # interval mode: resolved after the next round
        self._interval_task: asyncio.Task[None] | None = None
        self.fsyncs = 0  # sync rounds that reached the disk (each one thread hop)
        self._open = False

    # --- lifecycle ----------------------------------------------------------------------------------------
    async def open(self) -> None:
        if self._open:
            return
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # A data directory of an older build has its records in `meta.kv`: imported once.
        self._meta = MetaStore.open(self.data_dir / "meta.rocks", legacy_kv=self.data_dir / "meta.kv",
                                    limits=self.meta_limits)
        self._meta.replay(self._groups.replay)
        self._groups.loaded()
        self._log.recover()
        self._indexer.kick()  # segments recovery had to scan get their index files
        fsync_dir(self.data_dir)
        # A key whose message a crash cut from the log's tail was never acknowledged: its sender sends it again.
        self._meta.drop_dedupe_above(self._log.last_seq)
        high = max(self._log.last_seq, self._groups.max_cursor(), self._meta.high_seq())
        # Subscribers may have seen seqs that were written but not synced before a crash: never reuse them.
        self._next_seq = high + 1
        self._open = True
        if self.fsync_policy == "interval":
            self._interval_task = asyncio.get_running_loop().create_task(self._interval_loop())
        log.info("store: opened %s: %d messages in %d segments (%d scanned), %d sessions, next seq %d",
                 self.data_dir, self._log.total_messages, len(self._log.segments), self._log.scans,
                 self._meta.counts().get("sessions", 0), self._next_seq)

    def _group_write(self, sets: KVSets, deletes: KVDeletes) -> None:
        self._meta.write(sets, deletes)

    def _group_written(self) -> None:
        self._write_gen += 1

    async def close(self) -> None:
        if not self._open:
            return
        if self._interval_task is not None:
            self._interval_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._interval_task
            self._interval_task = None
        await self._wait_inflight()
        try:
            await self._round()  # whatever the policy: close means durable
            self._log.request_checkpoint()  # so that the next open scans none of the log
        finally:
            await self._indexer.close()  # pending index files, then the thread stops
            if self._tick is not None and not self._tick.done():
                self._tick.set_result(None)
            self._log.close()
            self._meta.close()
            self._open = False

    # --- messages -----------------------------------------------------------------------------------------
    async def append(self, messages: Sequence[Message], wildcard_version: int = -1) -> int | None:
        if not self._open:
            raise StoreClosed("store is not open")
        if not messages:
            return None
        if wildcard_version not in (-1, self._registry.wildcard_version):
            raise StaleWildcards(wildcard_version)
        batch = messages
        keyed = [m for m in messages if m.dedupe is not None]
        if keyed:
            messages, keyed = self._new_only(messages, keyed)
            if not messages:
                return None
        now_ms = 0
        for m in messages:
            if not m.timestamp_ms:
                # retention by age needs a time; fill it once per batch
                now_ms = now_ms or int(time.time() * 1000)
                m.timestamp_ms = now_ms
        seq = self._next_seq
        seg = self._log.append(messages, seq)
        idx = seg.queues
        delta = seq - seg.first_seq  # the segment's queue index holds seq - first_seq
        ring, size = self._ring, self._ring_size
        for m in messages:
            m.seq = seq
            if size:
                ring[seq % size] = m
            for q in m.queues:
                arr = idx.get(q)
                if arr is None:
                    arr = idx[q] = array("I")
                arr.append(delta)
            seq += 1
            delta += 1
        after = self._next_seq - 1  # one writer, consecutive seqs: nothing else lies in the batch's range
        self._next_seq = seq
        if keyed:
            # Written after the log's append, in the same sync round: an ack waits for both. A crash that cuts
            # the message from the log's tail but keeps its key is undone at open (`drop_dedupe_above`).
            holders = {m.dedupe: m.seq for m in keyed if m.dedupe is not None}
            self._meta.hold_dedupe([(scope, key_id, seq) for (scope, key_id), seq in holders.items()])
            for m in batch:
                if m.duplicate and m.seq < 0 and m.dedupe is not None:
                    m.seq = holders[m.dedupe]  # its key was taken by an earlier message of the batch
        self._write_gen += 1
        return after

    def _new_only(self, messages: Sequence[Message], keyed: list[Message]) -> tuple[list[Message], list[Message]]:
        """The batch without its messages whose key is held (marked `duplicate`, with the holder's seq) or taken
        by an earlier message of the batch (marked too, their seq set once the holder has one), and the keyed
        messages to be stored."""
        held = self._meta.dedupe_seqs([m.dedupe for m in keyed if m.dedupe is not None])
        first: dict[tuple[str, str], Message] = {}
        for m, seq in zip(keyed, held, strict=True):
            assert m.dedupe is not None
            m.duplicate = seq is not None or m.dedupe in first
            if seq is not None:
                m.seq = seq
            elif not m.duplicate:
                first[m.dedupe] = m
        return [m for m in messages if not m.duplicate], list(first.values())

    async def read(self, queue: str, after_seq: int, limit: int, seal: int = 0) -> Slice:
        # One sequence and no await before the answer: everything appended so far is visible, so the answer
        # is complete up to the last seq.
        if not self._open:
            raise StoreClosed("store is not open")
        messages = self._read(queue, after_seq, limit)
        if limit > 0 and len(messages) >= limit:
            return Slice(messages, messages[-1].seq)
        if seal >= self._next_seq:
            self._next_seq = seal + 1  # seqs are gaps-tolerant: skipping ahead costs nothing
        return Slice(messages, max(self._next_seq - 1, after_seq))

    def _read(self, queue: str, after_seq: int, limit: int) -> list[Message]:
        seqs = self._log.queue_seqs(queue, after_seq, limit)
        return self._by_seqs(seqs) if seqs else []

    async def queue_tail(self, queue: str, after_seq: int, limit: int) -> tuple[int, list[int]]:
        if not self._open:
            raise StoreClosed("store is not open")
        return self._log.queue_tail(queue, after_seq, limit)

    def last_seq(self) -> int:
        return self._next_seq - 1

    # --- leases and the wildcard set (one node: in memory) -------------------------------------------------
    async def lease(self, key: str, owner: str, ttl_ms: int) -> int:
        return self._registry.lease(key, owner, ttl_ms)

    async def release(self, key: str, owner: str) -> None:
        self._registry.release(key, owner)

    async def add_wildcards(self, filters: Sequence[str], holder: str) -> int:
        return self._registry.add_wildcards(filters, holder)

    async def remove_wildcards(self, filters: Sequence[str], holder: str) -> int:
        return self._registry.remove_wildcards(filters, holder)

    async def release_wildcards(self, holder: str) -> int:
        return self._registry.release_wildcards(holder)

    async def wildcards(self) -> tuple[int, frozenset[str]]:
        return self._registry.wildcard_version, frozenset(self._registry.wildcard_holders)

    # --- group members (one node: in memory, they end with it) -----------------------------------------------
    async def join_group(self, group: str, member: str, node: str, process: str, exclusive: bool) -> int:
        return self._members.join(group, member, node, process, exclusive)

    async def leave_group(self, group: str, member: str) -> int:
        return self._members.leave(group, member)

    async def group_members(self, group: str) -> int:
        return self._members.count(group)

    async def release_members(self, node: str, process: str = "") -> list[str]:
        return self._members.release(node, process)

    async def delete_group(self, name: str) -> None:
        await super().delete_group(name)
        self._members.drop(name)

    # --- durability -----------------------------------------------------------------------------------------
    async def sync(self) -> None:
        if self.fsync_policy == "never":
            return
        target = self._write_gen
        while self._synced_gen < target:
            if self.fsync_policy == "batch":
                task = self._sync_task
                if task is None:
                    task = self._sync_task = asyncio.get_running_loop().create_task(self._round())
                await asyncio.shield(task)
            else:
                if self._interval_task is None:
                    raise StoreClosed("store is not open")
                if self._tick is None:
                    self._tick = asyncio.get_running_loop().create_future()
                await asyncio.shield(self._tick)

    async def _round(self) -> None:
        """One group-commit round: fdatasync every file written since the last round, in one thread hop."""
        gen = self._write_gen
        fds, dir_dirty = self._log.take_sync_work()
        meta = self._meta if self._meta.dirty else None
        self._meta.dirty = False
        try:
            if fds or dir_dirty or meta is not None:
                await asyncio.to_thread(_fsync_all, fds, meta, self._log.dir if dir_dirty else None)
                self.fsyncs += 1
            self._synced_gen = max(self._synced_gen, gen)
        except BaseException:
            self._log.requeue_sync_work(fds, dir_dirty)
            if meta is not None:
                self._meta.dirty = True
            raise
        finally:
            if self._sync_task is asyncio.current_task():
                self._sync_task = None

    async def _interval_loop(self) -> None:
        while True:
            await asyncio.sleep(self.fsync_interval)
            waiter, self._tick = self._tick, None
            if waiter is None and not (self._log.dirty or self._meta.dirty):
                continue
            try:
                await self._wait_inflight()
                task = self._sync_task = asyncio.get_running_loop().create_task(self._round())
                await asyncio.shield(task)
            except asyncio.CancelledError:
                if waiter is not None and not waiter.done():
                    waiter.set_result(None)  # close() syncs after cancelling the loop
                raise
            except Exception as exc:
                log.exception("store: interval fsync failed")
                if waiter is not None and not waiter.done():
                    waiter.set_exception(exc)
                continue
            if waiter is not None and not waiter.done():
                waiter.set_result(None)

    async def _wait_inflight(self) -> None:
        while self._sync_task is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._sync_task)

    # --- consumer groups (GroupCalls: one metadata record per change, durable with the next sync round) -----
    async def dedupe_ids(self, scope: str) -> list[str]:
        return self._meta.dedupe_ids(scope)

    async def release_dedupe(self, scope: str, ids: Sequence[str] | None = None) -> None:
        self._meta.release_dedupe(scope, ids)
        self._write_gen += 1

    async def fetch(self, seqs: Sequence[int]) -> list[Message]:
        first, end = self._log.first_seq, self._next_seq
        return self._by_seqs(sorted({s for s in seqs if first <= s < end}))

    # --- retention and stats ------------------------------------------------------------------------------
    async def enforce_retention(self) -> int:
        """Delete whole expired or oversize segments (never the active one, nor one holding a seq above the
        lowest log hold unless `retention_ignores_holds`); return how many."""
        if not (self.retention_bytes or self.retention_seconds):
            return 0
        await self._wait_inflight()  # a sync round may be fsyncing a segment about to be deleted
        hold = None if self.retention_ignores_holds else lowest_hold(self._holds_dir)
        deleted = self._log.enforce_retention(
            self.retention_bytes, self.retention_seconds, int(time.time() * 1000), hold
        )
        if deleted:
            self._write_gen += 1  # the directory changed
        return deleted

    def stats(self) -> dict[str, int]:
        """`queues` counts each queue once per segment it has records in (an upper bound of distinct queues);
        `index_queues_in_memory` the queues of segments indexed in memory (the active one, and sealed ones
        whose index file is pending); `index_pending` those segments, plus one while the writer is busy (e.g.
        checkpointing the active segment); `segments_scanned` how many segments were read whole since the
        store was made (recovery, or rebuilding a damaged index file)."""
        entries, in_memory, mapped = self._log.index_stats()
        return {
            "messages": self._log.total_messages,
            "segments": len(self._log.segments),
            "bytes": self._log.total_bytes,
            "queues": entries,
            "index_queues_in_memory": in_memory,
            "segments_indexed": mapped,
            "index_pending": len(self._log.unindexed) + self._indexer.busy,
            "segments_scanned": self._log.scans,
            "scan_bytes": self._log.scan_bytes,
            "last_seq": self._next_seq - 1,
            "fsyncs": self.fsyncs,
            **self._meta.stats(),
        }
