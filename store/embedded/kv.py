"""Append-only KV file (`meta.kv`) of set/delete records in small namespaces, with compaction.

The file only persists; the owner keeps the decoded values in memory (one copy) and hands back the live
records when compacting. This module tracks just enough (size of each key's live record) to know when the
file has grown 4x past its live content.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from struct import Struct

from tidewire.store.embedded.files import fsync_dir, write_all
from tidewire.store.records import FRAME_SIZE, CorruptRecord, frame_parts, iter_frames

log = logging.getLogger("tidewire.store")

# Namespaces
SESSION = 1
OFFSET = 2
RETAINED = 3
WILL = 4
GROUP_DEF = 5  # consumer groups (store/groups.py): definition, cursor, one record per claim
GROUP_CURSOR = 6
GROUP_CLAIM = 7

_SET = 1
_DELETE = 2
# op, namespace, key length
_KV_HEADER = Struct("<BBH")
_KV_HEADER_SIZE = _KV_HEADER.size

COMPACT_MIN_BYTES = 2**20
COMPACT_RATIO = 4


class KVFile:
    def __init__(self, path: Path, *, compact_min_bytes: int = COMPACT_MIN_BYTES) -> None:
        self.path = path
        self.compact_min_bytes = compact_min_bytes
        self.fd = -1
        self.size = 0
        self.dirty = False
        self.compactions = 0
        # namespace -> key -> size of its live set record; deletes and superseded records are garbage
        self._live: dict[int, dict[str, int]] = {ns: {} for ns in (SESSION, OFFSET, RETAINED, WILL, GROUP_DEF,
                                                                   GROUP_CURSOR, GROUP_CLAIM)}
        self.live_bytes = 0

    def open(self, on_record: Callable[[int, str, bytes | None], None]) -> None:
        """Load the file, cut a torn tail, and replay each record as (namespace, key, value or None)."""
        tmp = self.path.with_suffix(".tmp")
        if tmp.exists():
            tmp.unlink()  # a compaction that did not reach its rename
        self.fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        with open(self.path, "rb") as f:
            buf = f.read()
        mv = memoryview(buf)
        end = 0
        try:
            for _pos, body_start, body_end in iter_frames(buf):
                op, ns, klen = _KV_HEADER.unpack_from(buf, body_start)
                k0 = body_start + _KV_HEADER_SIZE
                key = str(mv[k0 : k0 + klen], "utf-8")
                if op == _SET:
                    self._track(ns, key, body_end - body_start + FRAME_SIZE)
                    on_record(ns, key, bytes(mv[k0 + klen : body_end]))
                else:
                    self._untrack(ns, key)
                    on_record(ns, key, None)
                end = body_end
        except CorruptRecord as exc:
            reason, pos = exc.args
            log.warning("store: cutting %d bytes at offset %d of %s (%s)", len(buf) - pos, pos,
                        self.path.name, reason)
            os.ftruncate(self.fd, pos)
            os.fsync(self.fd)
            end = pos
        self.size = end

    def _track(self, ns: int, key: str, n: int) -> None:
        live = self._live[ns]
        self.live_bytes += n - live.get(key, 0)
        live[key] = n

    def _untrack(self, ns: int, key: str) -> None:
        n = self._live[ns].pop(key, 0)
        self.live_bytes -= n

    def forget(self, ns: int, key: str) -> None:
        """Count a key's record as garbage without writing (a later record of another key supersedes it)."""
        self._untrack(ns, key)

    def write(
        self, sets: Iterable[tuple[int, str, bytes]] = (), deletes: Iterable[tuple[int, str]] = ()
    ) -> None:
        """Append set and delete records with one os.write (sets first, then deletes)."""
        parts: list[bytes] = []
        added = 0
        for ns, key, value in sets:
            k = key.encode()
            head, body = frame_parts(b"".join((_KV_HEADER.pack(_SET, ns, len(k)), k, value)))
            parts.append(head)
            parts.append(body)
            n = FRAME_SIZE + len(body)
            added += n
            self._track(ns, key, n)
        for ns, key in deletes:
            k = key.encode()
            head, body = frame_parts(_KV_HEADER.pack(_DELETE, ns, len(k)) + k)
            parts.append(head)
            parts.append(body)
            added += FRAME_SIZE + len(body)
            self._untrack(ns, key)
        if not parts:
            return
        try:
            write_all(self.fd, b"".join(parts))
        except BaseException:
            try:
                os.ftruncate(self.fd, self.size)
            except OSError:
                log.exception("store: could not cut back a failed KV write")
            raise
        self.size += added
        self.dirty = True

    def needs_compaction(self) -> bool:
        return self.size > self.compact_min_bytes and self.size > COMPACT_RATIO * self.live_bytes

    def compact(self, live: Iterable[tuple[int, str, bytes]]) -> None:
        """Rewrite the file with only `live` records: temp file, fsync, rename, fsync the directory.

        The caller must not have an fsync of this file's fd in flight."""
        tmp = self.path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        old_size = self.size
        new_live: dict[int, dict[str, int]] = {ns: {} for ns in self._live}
        size = 0
        try:
            chunk: list[bytes] = []
            chunk_bytes = 0
            for ns, key, value in live:
                k = key.encode()
                head, body = frame_parts(b"".join((_KV_HEADER.pack(_SET, ns, len(k)), k, value)))
                chunk.append(head)
                chunk.append(body)
                n = FRAME_SIZE + len(body)
                new_live[ns][key] = n
                chunk_bytes += n
                if chunk_bytes >= 2**20:
                    write_all(fd, b"".join(chunk))
                    size += chunk_bytes
                    chunk, chunk_bytes = [], 0
            write_all(fd, b"".join(chunk))
            size += chunk_bytes
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        fsync_dir(self.path.parent)
        os.close(self.fd)
        self.fd = os.open(self.path, os.O_RDWR | os.O_APPEND)
        self.size = size
        self._live = new_live
        self.live_bytes = size
        self.dirty = False
        self.compactions += 1
        log.info("store: compacted %s from %d to %d bytes", self.path.name, old_size, size)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
