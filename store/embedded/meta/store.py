"""The embedded store's metadata off the heap: sessions, offsets, retained messages, wills and consumer-group records
in RocksDB (`rocksdict`), with the indexes a node needs at start instead of every session.

Key layout and codecs: `store.embedded.meta.keys`; retained lookup: `store.embedded.meta.retained`. Every call is
one WriteBatch (record and derived index entries together, atomic in the WAL). Writes go to the WAL unsynced;
`sync_work()`, run in the engine's fsync thread once per group-commit round, makes everything written before it durable.
Memtable flushes and compactions run in RocksDB's own threads. Calls are synchronous and meant for one thread
(the event loop): read-modify-write sequences (fencing, index diffs, counters) rely on that.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import cast

from rocksdict import Rdict, ReadOptions, WriteBatch, WriteOptions

from tidewire.store.base import (
    EXACT_MARK,
    Ban,
    Message,
    SessionRecord,
    WillRecord,
    decode_ban,
    encode_ban,
    indexed_filter,
)
from tidewire.store.embedded.files import fsync_dir
from tidewire.store.embedded.meta import keys as K
from tidewire.store.embedded.meta.options import DEFAULT_LIMITS, MetaLimits, open_db
from tidewire.store.embedded.meta.retained import match_retained_values
from tidewire.store.records import UnsupportedRecord, decode_message_body, decode_will, encode_message_body, encode_will

log = logging.getLogger("tidewire.store")

GroupReplay = Callable[[int, str, bytes | None], bool | None]


class _Changes:
    """One WriteBatch in the making, with the counter and filter-count changes it implies."""

    __slots__ = ("batch", "counts", "filters", "high", "sessions", "with_offsets")

    def __init__(self) -> None:
        self.batch = WriteBatch(raw_mode=True)
        self.counts: dict[str, int] = {}
        self.filters: dict[str, int] = {}
        # sessions read or written by this batch, as get_session returns them (later reads see these)
        self.sessions: dict[str, SessionRecord | None] = {}
        self.with_offsets: set[str] = set()  # ... of which these have an offsets key to delete
        self.high = 0

    def count(self, name: str, delta: int) -> None:
        self.counts[name] = self.counts.get(name, 0) + delta


class MetaStore:
    """Sessions, retained messages, wills and group records of one data directory. Open with `MetaStore.open`."""

    def __init__(self, db: Rdict, path: Path, *, wal: bool = True) -> None:
        self._db = db
        self.path = path
        self._wopts = WriteOptions()
        # Only an import runs without a WAL (it flushes the memtables at the end). A property at run time; the
        # stub declares a method.
        self._wopts.disable_wal = not wal  # type: ignore[method-assign,assignment]
        # Writes since the last sync round (the engine clears it when it hands sync_work to its fsync thread).
        self.dirty = False
        self._counts = {name: self._read_count(name) for name in K.COUNTERS}
        # Claims take the next value of one counter: increasing per client without state per client.
        self._last_claim = 0

    # --- lifecycle ----------------------------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | Path, *, legacy_kv: Path | None = None,
             limits: MetaLimits = DEFAULT_LIMITS) -> MetaStore:
        """Open (or create) the database at `path`. A legacy `meta.kv` (`store.embedded.kv` format) is imported first
        when the database does not exist yet, then renamed to `<name>.imported`."""
        path = Path(path)
        if legacy_kv is not None and legacy_kv.exists():
            if not path.exists():
                cls._import(path, legacy_kv, limits)
            legacy_kv.rename(legacy_kv.with_name(legacy_kv.name + ".imported"))
            fsync_dir(legacy_kv.parent)
        return cls(open_db(path, limits), path)

    @classmethod
    def _import(cls, path: Path, legacy_kv: Path, limits: MetaLimits) -> None:
        # Built under a temporary name and renamed once durable: a crash mid-import leaves no half database.
        from tidewire.store.embedded.meta.maintenance import import_kv

        tmp = path.with_name(path.name + ".importing")
        shutil.rmtree(tmp, ignore_errors=True)
        meta = cls(open_db(tmp, limits), tmp, wal=False)
        try:
            import_kv(meta, legacy_kv)
            meta._db.flush(True)
        finally:
            meta._db.close()
        os.rename(tmp, path)
        fsync_dir(path.parent)
        log.info("store: imported %s into %s", legacy_kv.name, path.name)

    def close(self) -> None:
        """Sync the WAL and close (the memtables are flushed, so the next open replays no WAL)."""
        try:
            self._db.flush_wal(True)
        finally:
            self._db.close()

    def compact(self) -> None:
        """Compact the whole key range now (`tidewire store compact`; RocksDB compacts in the background anyway)."""
        self._db.compact_range(None, None)

    def sync_work(self) -> None:
        """Make every write so far durable. Blocking (fsync); releases the GIL: call it from a worker thread."""
        self._db.flush_wal(True)

    def _commit(self, ch: _Changes) -> None:
        counts = self._counts
        for name, delta in ch.counts.items():
            if delta:
                ch.batch.put(K.counter_key(name), K.COUNT.pack(counts[name] + delta))
        if ch.high > counts["high_seq"]:
            ch.batch.put(K.counter_key("high_seq"), K.COUNT.pack(ch.high))
        for topic_filter, delta in ch.filters.items():
            if delta:
                key = K.filter_key(topic_filter)
                n = self._int(key) + delta
                if n > 0:
                    ch.batch.put(key, K.COUNT.pack(n))
                else:
                    ch.batch.delete(key)
        if ch.batch.len() == 0:
            return
        self._db.write(ch.batch, self._wopts)
        # in memory only once written: a failed write changes nothing
        for name, delta in ch.counts.items():
            counts[name] += delta
        counts["high_seq"] = max(counts["high_seq"], ch.high)
        self.dirty = True

    def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        """Raw values of `keys` (one batched lookup; maintenance tools)."""
        # the stub types a list of keys as invariant list[str | ...] and the answer as Optional
        return cast("list[bytes | None]", self._db.get(cast("list[str | int | float | bytes | bool]", keys)))

    def _int(self, key: bytes) -> int:
        value = self._db.get(key)
        return 0 if value is None else int(K.COUNT.unpack(value)[0])

    def _read_count(self, name: str) -> int:
        return self._int(K.counter_key(name))

    def scan(self, prefix: bytes, start: bytes | None = None, fill_cache: bool = True) -> Iterator[tuple[bytes, bytes]]:
        """(key, value) of every key starting with `prefix` (from `start`), in key order: for maintenance tools
        (`store.embedded.meta.maintenance`) and the lookups below. Holds a RocksDB iterator until exhausted or
        dropped."""
        # `ro` lives in this frame as long as the iterator: the iterator borrows the upper bound it holds.
        ro = ReadOptions()
        ro.set_iterate_upper_bound(K.prefix_end(prefix))
        if not fill_cache:
            ro.fill_cache(False)  # type: ignore[call-arg]  # the stub lacks the argument
        it = self._db.iter(ro)
        it.seek(prefix if start is None else start)
        while it.valid():
            yield it.key(), it.value()
            it.next()

    # --- sessions -----------------------------------------------------------------------------------------
    def _load(self, ch: _Changes, ids: Sequence[str]) -> None:
        """Read the stored sessions `ids` (records and offsets, one batched lookup) into `ch`."""
        ids = [c for c in dict.fromkeys(ids) if c not in ch.sessions]
        if not ids:
            return
        values = self.get_many([K.session_key(c) for c in ids] + [K.offsets_key(c) for c in ids])
        for c, value, offsets in zip(ids, values[: len(ids)], values[len(ids) :], strict=True):
            rec = None if value is None else K.decode_session_value(c, value)
            if rec is not None and offsets is not None:
                rec.offset, rec.sent_upto = K.OFFSETS_VALUE.unpack(offsets)
            if offsets is not None:
                ch.with_offsets.add(c)
            ch.sessions[c] = rec

    def _write_session(self, ch: _Changes, old: SessionRecord | None, new: SessionRecord | None,
                       client_id: str) -> None:
        """Record, offsets, index entries and counts for one session going from `old` to `new` (None: absent)."""
        batch = ch.batch
        if new is not None:
            batch.put(K.session_key(client_id), K.encode_session(new))
            ch.high = max(ch.high, new.offset, new.sent_upto)
        else:
            batch.delete(K.session_key(client_id))
        if client_id in ch.with_offsets:  # the record carries its offsets (no tombstone when there were none)
            batch.delete(K.offsets_key(client_id))
            ch.with_offsets.discard(client_id)
        old_idx = K.index_keys(old) if old is not None else set()
        new_idx = K.index_keys(new) if new is not None else set()
        for key in old_idx - new_idx:
            batch.delete(key)
        for key in new_idx - old_idx:
            batch.put(key, b"")
        old_f, new_f = K.counted_filters(old), K.counted_filters(new)
        for f in old_f - new_f:
            ch.filters[f] = ch.filters.get(f, 0) - 1
        for f in new_f - old_f:
            ch.filters[f] = ch.filters.get(f, 0) + 1
        if (old is None) != (new is None):
            ch.count("sessions", 1 if old is None else -1)
        ch.sessions[client_id] = new

    def get_session(self, client_id: str) -> SessionRecord | None:
        value, offsets = self.get_many([K.session_key(client_id), K.offsets_key(client_id)])
        if value is None:
            return None
        rec = K.decode_session_value(client_id, value)
        if offsets is not None:
            rec.offset, rec.sent_upto = K.OFFSETS_VALUE.unpack(offsets)
        return rec

    def claim_session(self, client_id: str, owner: str) -> tuple[SessionRecord | None, int]:
        """Bump the client's epoch for `owner`; the stored record (with the new epoch) or None, and the epoch."""
        ch = _Changes()
        self._load(ch, [client_id])
        rec = ch.sessions[client_id]
        epoch = self._last_claim = max(self._last_claim, rec.epoch if rec is not None else 0) + 1
        if rec is None:
            return None, epoch
        rec.owner, rec.epoch = owner, epoch
        self._write_session(ch, rec, rec, client_id)  # no index changes: only owner, epoch (and offsets folded in)
        self._commit(ch)
        return rec, epoch

    def put_session(self, record: SessionRecord) -> bool:
        """Store the record unless the stored epoch is higher; False if fenced off."""
        return self.put_sessions([record])[0]

    def put_sessions(self, records: Sequence[SessionRecord], *, fenced: bool = True) -> list[bool]:
        """`put_session` of each, in one WriteBatch (a group commit's worth of dirty sessions). `fenced=False`
        stores them whatever the stored epochs (an import)."""
        ch = _Changes()
        self._load(ch, [r.client_id for r in records])
        done: list[bool] = []
        for record in records:
            old = ch.sessions[record.client_id]
            if fenced and old is not None and record.epoch < old.epoch:
                done.append(False)
                continue
            self._write_session(ch, old, record, record.client_id)
            done.append(True)
        self._commit(ch)
        return done

    def delete_session(self, client_id: str, epoch: int = -1) -> None:
        """Remove the session and its offsets (only if its epoch is not above `epoch`; -1: unconditionally)."""
        ch = _Changes()
        self._load(ch, [client_id])
        old = ch.sessions[client_id]
        if old is None or 0 <= epoch < old.epoch:
            return
        self._write_session(ch, old, None, client_id)
        self._commit(ch)

    def set_offsets(self, offsets: dict[str, tuple[int, int, int]]) -> None:
        """`(offset, sent_upto, epoch)` per client id: a no-op for unknown sessions and for an older epoch."""
        if not offsets:
            return
        ids = list(offsets)
        values = self.get_many([K.session_key(c) for c in ids])
        ch = _Changes()
        pack = K.OFFSETS_VALUE.pack
        for client_id, value in zip(ids, values, strict=True):
            offset, sent_upto, epoch = offsets[client_id]
            if value is None or epoch < K.session_epoch(value):
                continue
            ch.batch.put(K.offsets_key(client_id), pack(offset, sent_upto))
            ch.high = max(ch.high, offset, sent_upto)
        self._commit(ch)

    def iter_sessions(self, batch: int = 1000, prefix: str = "") -> Iterator[list[SessionRecord]]:
        """Every stored session whose client id starts with `prefix`, in batches of up to `batch`, in client-id
        order. Each batch is read afresh (no iterator is held between batches): a session written meanwhile may
        or may not appear, each stored one appears once."""
        start_prefix = K.SESSION + prefix.encode()
        start: bytes | None = None
        batch = max(1, batch)
        while True:
            items: list[tuple[bytes, bytes]] = []
            for key, value in self.scan(start_prefix, start, fill_cache=False):
                items.append((key, value))
                if len(items) >= batch:
                    break
            if not items:
                return
            offsets = self.get_many([K.OFFSETS + key[1:] for key, _ in items])
            out: list[SessionRecord] = []
            for (key, value), off in zip(items, offsets, strict=True):
                rec = K.decode_session_value(key[1:].decode(), value)
                if off is not None:
                    rec.offset, rec.sent_upto = K.OFFSETS_VALUE.unpack(off)
                out.append(rec)
            yield out
            if len(items) < batch:
                return
            start = items[-1][0] + b"\x00"

    def online_sessions(self) -> list[str]:
        """Client ids of stored sessions with disconnected_at_ms == 0 (shared-group records included)."""
        return [key[1:].decode() for key, _ in self.scan(K.ONLINE)]

    def due_sessions(self, now_ms: int, limit: int) -> list[str]:
        """Up to `limit` client ids of disconnected sessions whose expiry deadline is <= now_ms, soonest first."""
        out: list[str] = []
        if limit <= 0:
            return out
        end = K.expiry_key(now_ms + 1, "")
        for key, _ in self.scan(K.EXPIRY):
            if key >= end:
                break
            out.append(K.expiry_parts(key)[1])
            if len(out) >= limit:
                break
        return out

    def next_expiry(self) -> int | None:
        """The soonest expiry deadline (ms) of a stored session, None if none expires."""
        for key, _ in self.scan(K.EXPIRY):
            return K.expiry_parts(key)[0]
        return None

    def subscription_filters(self) -> dict[str, int]:
        """Stored sessions per counted filter (wildcards and `$share/...`; see `keys.counted_filter`)."""
        return {key[1:].decode(): K.COUNT.unpack(value)[0] for key, value in self.scan(K.FILTER)}

    def shared_members(self, group_key: str) -> list[str]:
        """Client ids of stored sessions subscribed to `group_key` (`$share/<group>/<filter>`)."""
        prefix = K.member_prefix(group_key)
        n = len(prefix)
        return [key[n:].decode() for key, _ in self.scan(prefix)]

    def subscribed(self, filters: Sequence[str]) -> bool:
        """Does a stored session hold one of `filters` (`Store.subscribed`)?"""
        for topic_filter in filters:
            name = indexed_filter(topic_filter)
            if name is None:
                continue
            if name.startswith(EXACT_MARK):
                if next(self.scan(K.member_prefix(name)), None) is not None:
                    return True
            elif self._int(K.filter_key(name)) > 0:
                return True
        return False

    def high_seq(self) -> int:
        """The highest offset or sent_upto ever stored: the engine's next seq must be above it."""
        return self._counts["high_seq"]

    # --- retained -----------------------------------------------------------------------------------------
    def set_retained(self, topic: str, message: Message | None) -> None:
        key = K.retained_key(topic)
        old = self._db.get(key) if self._db.key_may_exist(key) else None
        ch = _Changes()
        if message is None:
            if old is None:
                return
            ch.batch.delete(key)
            ch.count("retained", -1)
            ch.count("retained_bytes", -len(old))
        else:
            body = encode_message_body(message, message.seq)
            ch.batch.put(key, body)
            if old is None:
                ch.count("retained", 1)
            ch.count("retained_bytes", len(body) - (0 if old is None else len(old)))
        self._commit(ch)

    def retained_usage(self) -> tuple[int, int]:
        """(retained messages, bytes of their stored bodies): the counters, no scan. Bytes are counted from this
        build on: retained messages a data dir held before count 0 until replaced."""
        return self._counts["retained"], max(0, self._counts["retained_bytes"])

    def match_retained(self, topic_filter: str, limit: int = 0, after: str | None = None,
                       max_bytes: int = 0) -> list[Message]:
        """Retained messages whose topic matches the filter, in topic order, after topic `after`, up to `limit`
        (0: all) or `max_bytes` of stored values (`match_retained_values`). A message stored by a newer build
        (`UnsupportedRecord`) is left out and logged."""
        out: list[Message] = []
        for value in match_retained_values(self._db, topic_filter, limit, after, max_bytes):
            try:
                out.append(decode_message_body(value))
            except UnsupportedRecord as exc:
                log.error("store: skipping a retained message of a newer format: %s", exc)
        return out

    # --- wills ----------------------------------------------------------------------------------------------
    def put_will(self, will: WillRecord) -> None:
        key = K.will_key(will.client_id)
        ch = _Changes()
        if self._db.get(key) is None:
            ch.count("wills", 1)
        ch.batch.put(key, encode_will(will))
        self._commit(ch)

    def delete_will(self, client_id: str) -> None:
        key = K.will_key(client_id)
        if self._db.get(key) is None:
            return
        ch = _Changes()
        ch.batch.delete(key)
        ch.count("wills", -1)
        self._commit(ch)

    def list_wills(self) -> list[WillRecord]:
        out: list[WillRecord] = []
        for _key, value in self.scan(K.WILL):
            try:
                out.append(decode_will(value))
            except UnsupportedRecord as exc:
                log.error("store: skipping a will of a newer format: %s", exc)
        return out

    # --- bans -----------------------------------------------------------------------------------------------
    def put_ban(self, ban: Ban) -> None:
        ch = _Changes()
        ch.batch.put(K.ban_key(ban.kind, ban.who), encode_ban(ban))
        self._commit(ch)

    def delete_ban(self, kind: str, who: str, expired_before: float | None = None) -> bool:
        key = K.ban_key(kind, who)
        value = self._db.get(key)
        if value is None:
            return False
        if expired_before is not None:
            ban = decode_ban(value)
            if ban is None or ban.until is None or ban.until > expired_before:
                return False
        ch = _Changes()
        ch.batch.delete(key)
        self._commit(ch)
        return True

    def list_bans(self) -> list[Ban]:
        bans = [decode_ban(value) for _key, value in self.scan(K.BAN)]
        return [ban for ban in bans if ban is not None]

    # --- versioned documents ---------------------------------------------------------------------------------
    def get_document(self, name: str) -> tuple[int, bytes]:
        value = self._db.get(K.document_key(name))
        if value is None:
            return 0, b""
        return int(K.COUNT.unpack_from(value)[0]), bytes(value[K.COUNT.size:])

    def put_document(self, name: str, value: bytes, expected: int) -> int:
        version, stored = self.get_document(name)
        if version == expected + 1 and stored == value:
            return version  # a retry of a put that landed
        if version != expected:
            return 0
        ch = _Changes()
        ch.batch.put(K.document_key(name), K.COUNT.pack(expected + 1) + value)
        self._commit(ch)
        return expected + 1

    # --- de-duplication keys (`Message.dedupe`: the engine's `append` looks them up and records them) ----------
    def dedupe_seqs(self, keys: list[tuple[str, str]]) -> list[int | None]:
        """The seq each key holds (None: not held); one batched lookup."""
        values = self.get_many([K.dedupe_key(scope, key_id) for scope, key_id in keys])
        return [None if v is None else int(K.COUNT.unpack(v)[0]) for v in values]

    def hold_dedupe(self, held: list[tuple[str, str, int]]) -> None:
        ch = _Changes()
        for scope, key_id, seq in held:
            ch.batch.put(K.dedupe_key(scope, key_id), K.COUNT.pack(seq))
        self._commit(ch)

    def dedupe_ids(self, scope: str) -> list[str]:
        prefix = K.dedupe_prefix(scope)
        return [key[len(prefix):].decode() for key, _ in self.scan(prefix)]

    def release_dedupe(self, scope: str, ids: Sequence[str] | None) -> None:
        ch = _Changes()
        if ids is None:
            for key, _ in self.scan(K.dedupe_prefix(scope)):
                ch.batch.delete(key)
        else:
            for key_id in ids:
                ch.batch.delete(K.dedupe_key(scope, key_id))
        self._commit(ch)

    def drop_dedupe_above(self, seq: int) -> int:
        """Release every key held by a seq above `seq` (at open: messages a crash cut from the log's tail were
        never acknowledged, so their senders send them again). Returns how many."""
        ch = _Changes()
        dropped = 0
        for key, value in self.scan(K.DEDUPE):
            if K.COUNT.unpack(value)[0] > seq:
                ch.batch.delete(key)
                dropped += 1
        self._commit(ch)
        return dropped

    # --- consumer groups (store.groups.GroupTable's persistence) --------------------------------------------
    def write(self, sets: Iterable[tuple[int, str, bytes]] = (), deletes: Iterable[tuple[int, str]] = ()) -> None:
        """GroupTable's `persist`: set and delete records of the GROUP_NAMESPACES in one WriteBatch."""
        ch = _Changes()
        for ns, key, value in sets:
            ch.batch.put(K.group_key(ns, key), value)
        for ns, key in deletes:
            ch.batch.delete(K.group_key(ns, key))
        self._commit(ch)

    def replay(self, callback: GroupReplay) -> None:
        """Hand every group record to `callback(ns, key, value)` (GroupTable.replay), definitions first; a record
        the callback answers False for belongs to no group and is deleted."""
        dead: list[bytes] = []
        for key, value in self.scan(K.GROUP):
            if callback(key[1], key[2:].decode(), value) is False:
                dead.append(key)
        if dead:
            ch = _Changes()
            for key in dead:
                ch.batch.delete(key)
            self._commit(ch)

    # --- stats ----------------------------------------------------------------------------------------------
    def counts(self) -> dict[str, int]:
        """sessions, retained (and retained_bytes), wills (exact) and high_seq."""
        return dict(self._counts)

    def stats(self) -> dict[str, int]:
        """Counts plus RocksDB's own figures (bytes)."""
        props = {
            "meta_sst_bytes": "rocksdb.total-sst-files-size",
            "meta_memtable_bytes": "rocksdb.cur-size-all-mem-tables",
            "meta_block_cache_bytes": "rocksdb.block-cache-usage",
            "meta_block_cache_capacity": "rocksdb.block-cache-capacity",
            "meta_table_readers_bytes": "rocksdb.estimate-table-readers-mem",
            "meta_running_compactions": "rocksdb.num-running-compactions",
            "meta_pending_compaction_bytes": "rocksdb.estimate-pending-compaction-bytes",
        }
        out = self.counts()
        for name, prop in props.items():
            out[name] = self._db.property_int_value(prop) or 0
        return out
