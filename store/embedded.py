"""The embedded store engine: commit log + in-memory queue indexes + KV file, with group-committed fsync.

Everything runs synchronously on the event loop except the fsync, which hops to a thread once per group of
concurrent `sync()` callers. The async signatures exist so a networked engine can implement the same `Store`.
The log as readers see it (`read_log`, holds) is the `store.embedded_log` mixin.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Literal

from store.base import Message, SessionRecord, Slice, StaleWildcards, WillRecord
from store.embedded_log import EmbeddedLog, lowest_hold
from store.groups import GROUP_NAMESPACES, GroupCalls, GroupTable
from store.kv import OFFSET, RETAINED, SESSION, WILL, KVFile
from store.memory_registry import MemoryRegistry
from store.records import (
    OFFSETS,
    UnsupportedRecord,
    decode_message_body,
    decode_session,
    decode_will,
    encode_message_body,
    encode_session,
    encode_will,
)
from store.retained_index import RetainedIndex
from store.segments import CommitLog

log = logging.getLogger("tidewire.store")

FsyncPolicy = Literal["batch", "interval", "never"]
_datasync = getattr(os, "fdatasync", os.fsync)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_all(fds: list[int], kv_fd: int, dir_path: Path | None) -> None:
    """Runs in a worker thread: one hop for every file of the group."""
    for fd in fds:
        _datasync(fd)
    if kv_fd >= 0:
        _datasync(kv_fd)
    if dir_path is not None:
        _fsync_dir(dir_path)


def _copy_session(r: SessionRecord) -> SessionRecord:
    # Callers get their own copies, as from a networked engine: mutating one changes nothing stored.
    return replace(
        r,
        subscriptions={k: replace(v) for k, v in r.subscriptions.items()},
        inbound_qos2=list(r.inbound_qos2),
        outbound_pubrel=list(r.outbound_pubrel),
    )


class EmbeddedStore(GroupCalls, EmbeddedLog):
    """The engine. `retention_ignores_holds`: retention deletes segments past the size or age limits even when
    a log reader's hold (`hold_log`) still needs them."""

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
    ) -> None:
        if fsync not in ("batch", "interval", "never"):
            raise ValueError(f"fsync must be batch, interval or never, not {fsync!r}")
        self.data_dir = Path(data_dir)
        self.fsync_policy: FsyncPolicy = fsync
        self.fsync_interval = fsync_interval_ms / 1000
        self.retention_bytes = retention_bytes
        self.retention_seconds = retention_seconds
        self.retention_ignores_holds = retention_ignores_holds
        self._log = CommitLog(self.data_dir / "log", segment_bytes)
        self._kv = KVFile(self.data_dir / "meta.kv")
        self._queues: dict[str, array[int]] = {}
        # Ring of the most recent messages, slot seq % size: the hot tail is read without I/O and the very
        # objects appended are returned (the gateway caches encoded packets on them).
        self._ring_size = max(0, recent_messages)
        self._ring: list[Message | None] = [None] * self._ring_size
        self._next_seq = 1
        self._sessions: dict[str, SessionRecord] = {}
        self._retained = RetainedIndex()
        self._wills: dict[str, WillRecord] = {}
        # Claims take the next value of one counter: increasing per client with no state per client (one node
        # uses this engine, so a client without a record has no other writer to fence off).
        self._last_claim = 0
        self._registry = MemoryRegistry()
        self._groups = GroupTable(self._kv.write, self._kv_written)
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
        self._kv.open(self._replay_kv)
        self._groups.loaded()
        self._log.recover(self._index_record)
        _fsync_dir(self.data_dir)
        high = max(self._log.last_seq, self._groups.max_cursor())
        for s in self._sessions.values():
            high = max(high, s.offset, s.sent_upto)
        # Subscribers may have seen seqs that were written but not synced before a crash: never reuse them.
        self._next_seq = high + 1
        self._open = True
        if self.fsync_policy == "interval":
            self._interval_task = asyncio.get_running_loop().create_task(self._interval_loop())
        log.info("store: opened %s: %d messages in %d segments, %d queues, %d sessions, next seq %d",
                 self.data_dir, self._log.total_messages, len(self._log.segments), len(self._queues),
                 len(self._sessions), self._next_seq)

    def _index_record(self, seq: int, queues: tuple[str, ...]) -> None:
        idx = self._queues
        for q in queues:
            arr = idx.get(q)
            if arr is None:
                arr = idx[q] = array("q")
            arr.append(seq)

    def _replay_kv(self, ns: int, key: str, value: bytes | None) -> None:
        try:
            self._replay_kv_record(ns, key, value)
        except UnsupportedRecord as exc:
            # A retained message or will written by a newer build: skipped (dropped by the next compaction),
            # never a failed open.
            log.error("store: skipping a KV record (namespace %d) of a newer format: %s", ns, exc)

    def _replay_kv_record(self, ns: int, key: str, value: bytes | None) -> None:
        if ns == SESSION:
            if value is None:
                self._sessions.pop(key, None)
            else:
                self._sessions[key] = decode_session(value)
            self._kv.forget(OFFSET, key)  # the session record carries its offsets
        elif ns == OFFSET:
            rec = self._sessions.get(key)
            if value is not None and rec is not None:
                rec.offset, rec.sent_upto = OFFSETS.unpack(value)
            elif value is not None:
                self._kv.forget(OFFSET, key)
        elif ns == RETAINED:
            if value is None:
                self._retained.delete(key)
            else:
                self._retained.set(key, decode_message_body(value))
        elif ns == WILL:
            if value is None:
                self._wills.pop(key, None)
            else:
                self._wills[key] = decode_will(value)
        elif ns in GROUP_NAMESPACES and not self._groups.replay(ns, key, value):
            self._kv.forget(ns, key)

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
        finally:
            if self._tick is not None and not self._tick.done():
                self._tick.set_result(None)
            self._log.close()
            self._kv.close()
            self._open = False

    # --- messages -----------------------------------------------------------------------------------------
    async def append(self, messages: Sequence[Message], wildcard_version: int = -1) -> None:
        if not messages:
            return
        if wildcard_version not in (-1, self._registry.wildcard_version):
            raise StaleWildcards(wildcard_version)
        now_ms = 0
        for m in messages:
            if not m.timestamp_ms:
                # retention by age needs a time; fill it once per batch
                now_ms = now_ms or int(time.time() * 1000)
                m.timestamp_ms = now_ms
        seq = self._next_seq
        self._log.append(messages, seq)
        ring, size, idx = self._ring, self._ring_size, self._queues
        for m in messages:
            m.seq = seq
            if size:
                ring[seq % size] = m
            for q in m.queues:
                arr = idx.get(q)
                if arr is None:
                    arr = idx[q] = array("q")
                arr.append(seq)
            seq += 1
        self._next_seq = seq
        self._write_gen += 1

    async def read(self, queue: str, after_seq: int, limit: int, seal: int = 0) -> Slice:
        # One sequence and no await before the answer: everything appended so far is visible, so the answer
        # is complete up to the last seq.
        messages = self._read(queue, after_seq, limit)
        if limit > 0 and len(messages) >= limit:
            return Slice(messages, messages[-1].seq)
        if seal >= self._next_seq:
            self._next_seq = seal + 1  # seqs are gaps-tolerant: skipping ahead costs nothing
        return Slice(messages, max(self._next_seq - 1, after_seq))

    def _read(self, queue: str, after_seq: int, limit: int) -> list[Message]:
        arr = self._queues.get(queue)
        if not arr or limit <= 0:
            return []
        first_live = self._log.first_seq
        if arr[0] < first_live:
            # lazy trim after retention deleted the segments these seqs lived in
            del arr[: bisect_left(arr, first_live)]
            if not arr:
                del self._queues[queue]
                return []
        i = bisect_right(arr, after_seq)
        if i >= len(arr):
            return []
        return self._by_seqs(arr[i : i + limit])

    def last_seq(self) -> int:
        return self._next_seq - 1

    # --- leases and the wildcard set (one node: in memory) -------------------------------------------------
    async def lease(self, key: str, owner: str, ttl_ms: int) -> int:
        return self._registry.lease(key, owner, ttl_ms)

    async def release(self, key: str, owner: str) -> None:
        self._registry.release(key, owner)

    async def add_wildcards(self, filters: Sequence[str]) -> int:
        return self._registry.add_wildcards(filters)

    async def remove_wildcards(self, filters: Sequence[str]) -> int:
        return self._registry.remove_wildcards(filters)

    async def wildcards(self) -> tuple[int, frozenset[str]]:
        return self._registry.wildcard_version, frozenset(self._registry.wildcard_counts)

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
                    raise RuntimeError("store is not open")
                if self._tick is None:
                    self._tick = asyncio.get_running_loop().create_future()
                await asyncio.shield(self._tick)

    async def _round(self) -> None:
        """One group-commit round: fdatasync every file written since the last round, in one thread hop."""
        gen = self._write_gen
        fds, dir_dirty = self._log.take_sync_work()
        kv_fd = self._kv.fd if self._kv.dirty else -1
        self._kv.dirty = False
        try:
            if fds or dir_dirty or kv_fd >= 0:
                await asyncio.to_thread(_fsync_all, fds, kv_fd, self._log.dir if dir_dirty else None)
                self.fsyncs += 1
            self._synced_gen = max(self._synced_gen, gen)
        except BaseException:
            self._log.requeue_sync_work(fds, dir_dirty)
            if kv_fd >= 0:
                self._kv.dirty = True
            raise
        finally:
            if self._sync_task is asyncio.current_task():
                self._sync_task = None
        self._maybe_compact()

    async def _interval_loop(self) -> None:
        while True:
            await asyncio.sleep(self.fsync_interval)
            waiter, self._tick = self._tick, None
            if waiter is None and not (self._log.dirty or self._kv.dirty):
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

    # --- sessions and offsets -------------------------------------------------------------------------------
    async def get_session(self, client_id: str) -> SessionRecord | None:
        rec = self._sessions.get(client_id)
        return None if rec is None else _copy_session(rec)

    def _epoch(self, client_id: str) -> int:
        rec = self._sessions.get(client_id)
        return rec.epoch if rec is not None else 0

    async def claim_session(self, client_id: str, owner: str) -> tuple[SessionRecord | None, int]:
        epoch = self._last_claim = max(self._last_claim, self._epoch(client_id)) + 1
        rec = self._sessions.get(client_id)
        if rec is None:
            return None, epoch
        rec.owner, rec.epoch = owner, epoch  # in memory only: the next put carries them to the file
        return _copy_session(rec), epoch

    async def put_session(self, record: SessionRecord) -> bool:
        if record.epoch < self._epoch(record.client_id):
            return False
        self._kv.write(sets=((SESSION, record.client_id, encode_session(record)),))
        self._kv.forget(OFFSET, record.client_id)
        self._sessions[record.client_id] = _copy_session(record)
        self._kv_written()
        return True

    async def delete_session(self, client_id: str, epoch: int = -1) -> None:
        if epoch >= 0 and epoch < self._epoch(client_id):
            return
        if self._sessions.pop(client_id, None) is None:
            return
        self._kv.write(deletes=((SESSION, client_id), (OFFSET, client_id)))
        self._kv_written()

    async def list_sessions(self) -> list[SessionRecord]:
        return [_copy_session(r) for r in self._sessions.values()]

    async def set_offsets(self, offsets: dict[str, tuple[int, int, int]]) -> None:
        sessions = self._sessions
        sets: list[tuple[int, str, bytes]] = []
        pack = OFFSETS.pack
        for client_id, (offset, sent_upto, epoch) in offsets.items():
            rec = sessions.get(client_id)
            if rec is None or epoch < rec.epoch:
                continue
            rec.offset = offset
            rec.sent_upto = sent_upto
            sets.append((OFFSET, client_id, pack(offset, sent_upto)))
        if sets:
            self._kv.write(sets=sets)
            self._kv_written()

    # --- retained -------------------------------------------------------------------------------------------
    async def set_retained(self, topic: str, message: Message | None) -> None:
        if message is None:
            if self._retained.delete(topic):
                self._kv.write(deletes=((RETAINED, topic),))
                self._kv_written()
            return
        self._kv.write(sets=((RETAINED, topic, encode_message_body(message, message.seq)),))
        self._retained.set(topic, message)
        self._kv_written()

    async def match_retained(self, topic_filter: str) -> list[Message]:
        return self._retained.match(topic_filter)

    # --- wills ----------------------------------------------------------------------------------------------
    async def put_will(self, will: WillRecord) -> None:
        self._kv.write(sets=((WILL, will.client_id, encode_will(will)),))
        self._wills[will.client_id] = will
        self._kv_written()

    async def delete_will(self, client_id: str) -> None:
        if self._wills.pop(client_id, None) is None:
            return
        self._kv.write(deletes=((WILL, client_id),))
        self._kv_written()

    async def list_wills(self) -> list[WillRecord]:
        return list(self._wills.values())

    # --- consumer groups (GroupCalls: one KV record per change, durable with the next sync round) -----------
    async def fetch(self, seqs: Sequence[int]) -> list[Message]:
        first, end = self._log.first_seq, self._next_seq
        return self._by_seqs(sorted({s for s in seqs if first <= s < end}))

    # --- KV compaction --------------------------------------------------------------------------------------
    def _kv_written(self) -> None:
        self._write_gen += 1
        self._maybe_compact()

    def _maybe_compact(self) -> None:
        # Compaction swaps the KV fd, so never while a sync round may be fsyncing it.
        if self._sync_task is None and self._kv.needs_compaction():
            self._kv.compact(self._live_kv())

    def _live_kv(self) -> Iterator[tuple[int, str, bytes]]:
        # Sessions carry their current offsets, so offset records are not needed after a compaction.
        for cid, rec in self._sessions.items():
            yield SESSION, cid, encode_session(rec)
        for topic, msg in self._retained.items():
            yield RETAINED, topic, encode_message_body(msg, msg.seq)
        for cid, will in self._wills.items():
            yield WILL, cid, encode_will(will)
        yield from self._groups.live_records()

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
            first_live = self._log.first_seq
            dead = [q for q, arr in self._queues.items() if arr[-1] < first_live]
            for q in dead:
                del self._queues[q]
            self._write_gen += 1  # the directory changed
        return deleted

    def stats(self) -> dict[str, int]:
        return {
            "messages": self._log.total_messages,
            "segments": len(self._log.segments),
            "bytes": self._log.total_bytes,
            "queues": len(self._queues),
            "sessions": len(self._sessions),
            "retained": len(self._retained),
            "wills": len(self._wills),
            "last_seq": self._next_seq - 1,
            "fsyncs": self.fsyncs,
            "kv_bytes": self._kv.size,
            "kv_compactions": self._kv.compactions,
        }
