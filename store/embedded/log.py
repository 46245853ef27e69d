"""The embedded engine's log as readers see it: `read_log`, holds kept as files, and per-process file leases.

Holds live in `<data_dir>/log/holds/`, one small file per holder (its name encoded by `hold_file_name`; the
content is the held seq in ASCII), so a separate reader process (`store.embedded.tail`) sets them as well as
the store's own `hold_log`, and both the store and its retention read them from the directory. A hold file is
replaced atomically: written to a dot-named temporary file, fsynced, renamed over the old one, then the directory
is fsynced. One writer per holder is assumed (a reader sets its own hold).

Leases of a read-only tail are `fcntl.flock` locks on `holds/.lease-<key>`: exclusive across processes while the
holding process lives (the kernel drops them when it dies), shared by the owners of one process as
`MemoryRegistry` shares its leases (ttl applies between them). The file keeps the last epoch, so epochs keep
increasing across processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import secrets
import time
from collections.abc import Sequence
from pathlib import Path

from tidewire.store.base import LogSlice, Message
from tidewire.store.embedded.files import fsync_dir
from tidewire.store.embedded.segments import CommitLog

log = logging.getLogger("tidewire.store")

HOLDS_DIR = "holds"
MAX_HOLDER_BYTES = 64  # utf-8 bytes of a holder or lease key name (encoded, at most 3x: within NAME_MAX)
_TMP_PREFIX = ".tmp-"
_LEASE_PREFIX = ".lease-"
_STALE_TMP_S = 600  # a temporary hold file older than this was left by a crashed writer
_PLAIN = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_")


def check_partition(partition: int) -> None:
    if partition != 0:
        raise ValueError(f"the embedded log has one partition (0), not {partition!r}")


def hold_file_name(holder: str) -> str:
    """A file name for `holder`: letters, digits, '-' and '_' as they are, every other utf-8 byte as %XX (so no
    name starts with '.', holds '/', or clashes with another holder's)."""
    raw = holder.encode()
    if not 0 < len(raw) <= MAX_HOLDER_BYTES:
        raise ValueError(f"a holder name must be 1 to {MAX_HOLDER_BYTES} utf-8 bytes")
    return "".join(chr(b) if b in _PLAIN else f"%{b:02X}" for b in raw)


def holder_from_file_name(name: str) -> str | None:
    """The holder a hold file stands for; None for a name `hold_file_name` never makes."""
    out = bytearray()
    i = 0
    try:
        while i < len(name):
            if name[i] == "%":
                out.append(int(name[i + 1 : i + 3], 16))
                i += 3
            else:
                out.append(ord(name[i]))
                i += 1
        holder = out.decode()
    except (ValueError, UnicodeError):
        return None
    try:
        return holder if hold_file_name(holder) == name else None
    except ValueError:
        return None


def write_hold(holds_dir: Path, holder: str, seq: int) -> None:
    """Set (seq >= 0) or drop (seq < 0) `holder`'s hold, durably. Blocking: callers run it in a thread."""
    name = hold_file_name(holder)
    holds_dir.mkdir(parents=True, exist_ok=True)
    path = holds_dir / name
    if seq < 0:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            fsync_dir(holds_dir)
        return
    tmp = holds_dir / f"{_TMP_PREFIX}{name}-{os.getpid()}-{secrets.token_hex(4)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, b"%d\n" % seq)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        tmp.unlink()
        raise
    os.close(fd)
    os.replace(tmp, path)
    fsync_dir(holds_dir)
    _drop_stale_tmp(holds_dir)


def _drop_stale_tmp(holds_dir: Path) -> None:
    cutoff = time.time() - _STALE_TMP_S
    with os.scandir(holds_dir) as it:
        for entry in it:
            if entry.name.startswith(_TMP_PREFIX):
                with contextlib.suppress(OSError):
                    if entry.stat().st_mtime < cutoff:
                        os.unlink(entry.path)


def read_holds(holds_dir: Path) -> dict[str, int]:
    """Every hold in the directory. An unreadable hold file counts as a hold at 0 (keep everything): a damaged
    checkpoint must not let retention delete what its reader has not exported."""
    holds: dict[str, int] = {}
    try:
        it = os.scandir(holds_dir)
    except FileNotFoundError:
        return holds
    with it:
        for entry in it:
            holder = None if entry.name.startswith(".") else holder_from_file_name(entry.name)
            if holder is None:
                continue
            try:
                with open(entry.path, "rb") as f:
                    holds[holder] = int(f.read(32))
            except FileNotFoundError:
                continue  # dropped meanwhile
            except (OSError, ValueError):
                log.warning("store: unreadable hold file %s: holding everything for it", entry.name)
                holds[holder] = 0
    return holds


def lowest_hold(holds_dir: Path) -> int | None:
    holds = read_holds(holds_dir)
    return min(holds.values()) if holds else None


class FileLeases:
    """`lease`/`release` as `Store.lease`, as flock locks on files in the holds directory (see the module)."""

    def __init__(self, holds_dir: Path) -> None:
        self.dir = holds_dir
        self._held: dict[str, tuple[str, float, int, int]] = {}  # key -> (owner, until (monotonic), epoch, fd)

    def lease(self, key: str, owner: str, ttl_ms: int) -> int:
        now = time.monotonic()
        held = self._held.get(key)
        if held is not None:
            holder, until, epoch, fd = held
            if holder != owner and until > now:
                return 0
            if holder != owner or until <= now:
                epoch = self._bump(fd)  # taken anew within this process: a former holder is fenced off
            self._held[key] = (owner, now + ttl_ms / 1000, epoch, fd)
            return epoch
        self.dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.dir / f"{_LEASE_PREFIX}{hold_file_name(key)}", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return 0  # another process holds it
        except BaseException:
            os.close(fd)
            raise
        try:
            epoch = self._bump(fd)
        except BaseException:
            os.close(fd)  # closing drops the lock
            raise
        self._held[key] = (owner, now + ttl_ms / 1000, epoch, fd)
        return epoch

    @staticmethod
    def _bump(fd: int) -> int:
        try:
            epoch = int(os.pread(fd, 32, 0) or b"0") + 1
        except ValueError:
            epoch = 1
        data = b"%d\n" % epoch
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
        os.fsync(fd)
        return epoch

    def release(self, key: str, owner: str) -> None:
        held = self._held.get(key)
        if held is not None and held[0] == owner:
            del self._held[key]
            os.close(held[3])

    def close(self) -> None:
        for _, _, _, fd in self._held.values():
            os.close(fd)
        self._held.clear()


class EmbeddedLog:
    """`EmbeddedStore`'s mixin: the `LogSource` calls and reads by seq (the recent-message ring, then disk)."""

    _log: CommitLog
    _next_seq: int
    _ring: list[Message | None]
    _ring_size: int

    @property
    def _holds_dir(self) -> Path:
        return self._log.dir / HOLDS_DIR

    def log_partitions(self) -> int:
        return 1

    async def read_log(self, partition: int, after_seq: int, limit: int) -> LogSlice:
        check_partition(partition)
        trimmed = max(0, self._log.first_seq - 1)
        if limit <= 0:
            return LogSlice([], after_seq, trimmed)
        seqs = self._log.seqs_after(after_seq, limit)
        messages = self._by_seqs(seqs) if seqs else []
        if len(seqs) >= limit:
            return LogSlice(messages, seqs[-1], trimmed)
        # One sequence, no await: every append so far is in the answer, and later ones get seqs >= _next_seq.
        return LogSlice(messages, max(self._next_seq - 1, after_seq), trimmed)

    async def hold_log(self, partition: int, holder: str, seq: int) -> None:
        check_partition(partition)
        hold_file_name(holder)  # a bad name fails here, before the thread hop
        await asyncio.to_thread(write_hold, self._holds_dir, holder, seq)

    async def log_holds(self, partition: int) -> dict[str, int]:
        check_partition(partition)
        return read_holds(self._holds_dir)

    def _by_seqs(self, seqs: Sequence[int]) -> list[Message]:
        """Messages of ascending seqs still in the log: the ring first, the rest with one log read."""
        size = self._ring_size
        if not size:
            return self._log.read(seqs)
        ring = self._ring
        out: list[Message | None] = []
        misses: list[int] = []
        for s in seqs:
            m = ring[s % size]
            if m is not None and m.seq == s:
                out.append(m)
            else:
                out.append(None)
                misses.append(s)
        if not misses:
            return out  # type: ignore[return-value]
        return self._merge(seqs, out, self._log.read(misses))

    @staticmethod
    def _merge(seqs: Sequence[int], cached: list[Message | None], disk: list[Message]) -> list[Message]:
        result: list[Message] = []
        it = iter(disk)
        d = next(it, None)
        for s, m in zip(seqs, cached, strict=True):
            if m is not None:
                result.append(m)
            elif d is not None and d.seq == s:
                result.append(d)
                d = next(it, None)
        return result
