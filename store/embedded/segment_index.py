"""Index files of sealed log segments: the format, writing one from a segment's in-memory index (in a worker
thread), reading one through mmap, and the writer task that checkpoints each sealed segment into its file.

A sealed segment `<first_seq:020d>.log` gets `<first_seq:020d>.idx` next to it: the file offset of each record
and, for each queue, the seqs of its records in the segment. Recovery maps a valid index instead of scanning
the segment, so a restart scans only the active segment; a sealed segment's index costs page cache, not heap.
A missing, stale or corrupt index is never trusted: its segment is scanned and the index written again.

File layout, little-endian (read through `memoryview.cast`, so this module requires a little-endian host);
every section starts 8-byte aligned (zero padding):

    offset  size          field
    0       7             magic  54 57 49 44 58 00 FF  ("TWIDX\\0" then 0xFF)
    7       1             u8  version = 1
    8       4             u32 flags: bit 0 positions are u64 (a segment of 4 GiB or more), else u32
    12      8             i64 first_seq (must match the file name)
    20      8             u64 records in the segment (record i has seq first_seq + i)
    28      8             u64 segment size in bytes (must match the .log file: else the index is stale)
    36      8             i64 timestamp_ms of the last record (retention by age)
    44      8             u64 queues Q in the table
    52      8             u64 entries E (sum over queues of their records in the segment)
    60      8             u64 bytes of queue names
    68      4             u32 crc32 of every byte after the header area (offset 80 to the end)
    72      4             u32 crc32 of bytes 0..71
    80      4|8 x records positions: file offset of each record
    ..      8 x Q         u64 name hashes, ascending (`name_hash`: blake2b-64 of the utf-8 name, big-endian)
    ..      4 x Q         u32 the queue number of each hash (queues are numbered in no particular order)
    ..      8 x (Q+1)     u64 start of queue j's run in the entries (the last is E)
    ..      8 x (Q+1)     u64 start of queue j's name in the names (the last is the names' size)
    ..      4 x E         u32 seq - first_seq of each record of each queue, ascending within a queue's run
    ..      names         utf-8 queue names, concatenated in queue number order

A lookup hashes the name, bisects the hashes and compares the names of the queues with an equal hash. Queues
are numbered in the in-memory index's order, so writing a file sorts only the hashes.

The header checksum is checked when a file is opened; the body checksum on first use of the segment (a
restart does not read every index). The file is written as `.idx.tmp`, fsynced and renamed after the
segment's log is fdatasynced, so a crash leaves either no index or a complete one for data on disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import mmap
import os
import sys
import zlib
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from hashlib import blake2b
from itertools import accumulate
from pathlib import Path
from struct import Struct
from struct import error as StructError
from typing import Literal

from tidewire.errors import CorruptData
from tidewire.store.embedded.files import fsync_dir, write_all
from tidewire.store.records import CorruptRecord, check_frame

log = logging.getLogger("tidewire.store")

IDX_SUFFIX = ".idx"
MAGIC = b"TWIDX\x00\xff"
VERSION = 1
_WIDE = 1  # flags bit 0: u64 positions
_HEADER = Struct("<7sBIqQQqQQQII")
_HEADER_AREA = 80
U32_MAX = 2**32 - 1

if sys.byteorder != "little" or array("I").itemsize != 4 or array("Q").itemsize != 8:
    raise ImportError("store.embedded.segment_index reads its files as native arrays: it needs a little-endian host")


class BadIndex(CorruptData):
    """An index file that cannot be used (damaged, stale, or of another format); the reason is the message."""


def name_digest(raw: bytes) -> bytes:
    """8 bytes whose big-endian value is the hash of a queue's utf-8 name in the index tables (sorting the
    digests as bytes sorts the hashes)."""
    return blake2b(raw, digest_size=8).digest()


def name_hash(raw: bytes) -> int:
    return int.from_bytes(name_digest(raw), "big")


def queue_key(queue: str) -> tuple[bytes, int]:
    """(utf-8 name, hash) of a queue, as a lookup takes it."""
    raw = queue.encode()
    return raw, name_hash(raw)


def index_path(log_path: Path) -> Path:
    return log_path.with_suffix(IDX_SUFFIX)


def _pad8(n: int) -> int:
    return (n + 7) & ~7


def _layout(records: int, wide: bool, queues: int, entries: int, names: int) -> list[int]:
    """Start offsets of positions, hashes, queue numbers, starts, name offsets, entries, names; and the file's
    size."""
    offs = [_HEADER_AREA]
    sizes = (records * (8 if wide else 4), 8 * queues, 4 * queues, 8 * (queues + 1), 8 * (queues + 1), 4 * entries)
    for size in sizes:
        offs.append(offs[-1] + _pad8(size))
    offs.append(offs[-1] + names)
    return offs


def take(deltas: Sequence[int], lo: int, hi: int, first: int, after_seq: int, limit: int, out: list[int]) -> None:
    """Append to `out` up to `limit` seqs above `after_seq` from the ascending run deltas[lo:hi] of
    seq - `first`."""
    if after_seq >= first:
        lo = bisect_right(deltas, after_seq - first, lo, hi)
    end = min(hi, lo + limit)
    if lo < end:
        out.extend(map(first.__add__, deltas[lo:end]))


def tail(deltas: Sequence[int], lo: int, hi: int, first: int, after_seq: int, limit: int,
         out: list[int]) -> int:
    """How many seqs above `after_seq` the ascending run deltas[lo:hi] of seq - `first` holds; prepends the
    newest of them to `out` until it holds `limit` (random access: the run is read from its end)."""
    if after_seq >= first:
        lo = bisect_right(deltas, after_seq - first, lo, hi)
    want = limit - len(out)
    if want > 0 and lo < hi:
        out[:0] = map(first.__add__, deltas[max(lo, hi - want) : hi])
    return hi - lo


# --- writing ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class IndexJob:
    """What a worker thread needs to write the index of a segment's first `records` records (`segment_size`
    bytes). `positions` and `queues` (queue -> u32 seq - first_seq, ascending) may still grow (a checkpoint of
    the active segment): only their entries below record `records` are written, copied one C call at a time,
    each atomic under the GIL, while the event loop keeps appending. `segment` is the log's own handle,
    returned to it when the job is done."""

    segment: object
    log_path: Path
    first_seq: int
    records: int
    segment_size: int
    last_ts: int
    positions: Sequence[int]
    queues: Mapping[str, array[int]]
    checkpoint: bool = False  # of the active segment: the file is a prefix of a segment still growing


def _items(queues: Mapping[str, array[int]]) -> list[tuple[str, array[int]]]:
    # One C call, atomic under the GIL, unless a garbage collection in it runs Python code and the loop adds a
    # queue meanwhile: then try again.
    for _ in range(9):
        with contextlib.suppress(RuntimeError):
            return list(queues.items())
    return list(queues.items())


def encode_index(first_seq: int, records: int, segment_size: int, last_ts: int, positions: Sequence[int],
                 queues: Mapping[str, array[int]], snapshot: bool = False) -> list[bytes]:
    """The parts of an index file, header first. `snapshot`: the arrays may grow meanwhile (a checkpoint)."""
    positions = positions[:records]
    wide = records > 0 and positions[-1] > U32_MAX
    pos = positions if isinstance(positions, array) and positions.typecode == "I" else \
        array("Q" if wide else "I", positions)
    # Per queue only its hash and a copy of its run; the rest in whole-table passes of one C call each.
    if snapshot:
        items = _items(queues)
        # copies: an array the loop appends to meanwhile only grows past the bound
        runs = [seqs[: bisect_left(seqs, records)] for _, seqs in items]
        raws = [q.encode() for q, _ in items]
    else:
        runs = list(queues.values())
        raws = list(map(str.encode, queues))
    if snapshot and not all(runs):
        kept = [i for i, run in enumerate(runs) if run]  # queues whose records all came after the snapshot
        runs = [runs[i] for i in kept]
        raws = [raws[i] for i in kept]
    digests = list(map(name_digest, raws))
    order = array("I", sorted(range(len(digests)), key=digests.__getitem__))
    hashes = array("Q")
    hashes.frombytes(b"".join(map(digests.__getitem__, order)))
    hashes.byteswap()  # the digests' big-endian values, as native (little-endian) u64
    name_offs = array("Q", accumulate(map(len, raws), initial=0))
    starts = array("Q", accumulate(map(len, runs), initial=0))
    entries = starts[-1]
    names = b"".join(raws)
    body: list[bytes] = []
    for part in (pos.tobytes(), hashes.tobytes(), order.tobytes(), starts.tobytes(), name_offs.tobytes(),
                 b"".join(runs)):
        body.append(part)
        body.append(bytes(_pad8(len(part)) - len(part)))
    body.append(names)
    crc = 0
    for part in body:
        crc = zlib.crc32(part, crc)
    head = _HEADER.pack(MAGIC, VERSION, _WIDE if wide else 0, first_seq, records, segment_size, last_ts,
                        len(raws), entries, len(names), crc, 0)
    head = head[:-4] + zlib.crc32(head[:-4]).to_bytes(4, "little")
    return [head + bytes(_HEADER_AREA - len(head)), *body]


def write_index(job: IndexJob) -> bool:
    """Write the job's index file durably. Blocking: runs in a worker thread. False when the segment's log is
    gone (retention deleted it meanwhile)."""
    try:
        fd = os.open(job.log_path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        # The index must never describe data the disk does not hold yet.
        os.fdatasync(fd)
    finally:
        os.close(fd)
    parts = encode_index(job.first_seq, job.records, job.segment_size, job.last_ts, job.positions, job.queues,
                         job.checkpoint)
    path = index_path(job.log_path)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for part in parts:
            write_all(fd, part)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)
    return True


# --- reading ----------------------------------------------------------------------------------------------


class SegmentIndex:
    """A mapped index file. Opening checks the header; `verify()` checks the body (call it before first use)."""

    __slots__ = ("_hashes", "_mm", "_name_offs", "_names", "_order", "_seqs", "_starts", "_views", "body_crc",
                 "first_seq", "last_ts", "path", "positions", "queue_count", "records", "segment_size",
                 "verified")

    def __init__(self, path: Path, first_seq: int, segment_size: int, prefix: bool = False) -> None:
        """Map `path` as the index of the segment starting at `first_seq` whose log is `segment_size` bytes
        (`prefix`: of its first bytes, a checkpoint of the active segment); `BadIndex` if it is not a sound
        index of exactly that."""
        self.path = path
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < _HEADER_AREA:
                raise BadIndex(f"{size} bytes: shorter than a header")
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self._views: list[memoryview] = []
        try:
            self._open(mm, size, first_seq, segment_size, prefix)
        except BaseException:
            for view in reversed(self._views):
                view.release()
            mm.close()
            raise
        self._mm = mm
        self.verified = False

    def _open(self, mm: mmap.mmap, size: int, first_seq: int, segment_size: int, prefix: bool) -> None:
        fields = _HEADER.unpack_from(mm, 0)
        magic, version, flags, first, records, seg_size, last_ts, queues, entries, names, body_crc, head_crc = fields
        if magic != MAGIC:
            raise BadIndex("not an index file")
        if zlib.crc32(mm[: _HEADER.size - 4]) != head_crc:
            raise BadIndex("header checksum mismatch")
        if version != VERSION:
            raise BadIndex(f"format version {version}, this build reads {VERSION}")
        if first != first_seq:
            raise BadIndex(f"indexes first seq {first}, the file name says {first_seq}")
        if seg_size != segment_size and not (prefix and seg_size < segment_size):
            raise BadIndex(f"indexes {seg_size} bytes of a {segment_size}-byte segment")
        wide = bool(flags & _WIDE)
        offs = _layout(records, wide, queues, entries, names)
        if offs[-1] != size:
            raise BadIndex(f"{size} bytes where its header says {offs[-1]}")
        mv = memoryview(mm)
        self._views.append(mv)
        self.positions = self._view(mv, offs[0], records, "Q" if wide else "I")
        self._hashes = self._view(mv, offs[1], queues, "Q")
        self._order = self._view(mv, offs[2], queues, "I")
        self._starts = self._view(mv, offs[3], queues + 1, "Q")
        self._name_offs = self._view(mv, offs[4], queues + 1, "Q")
        self._seqs = self._view(mv, offs[5], entries, "I")
        self._names = mv[offs[6] : offs[7]]
        self._views.append(self._names)
        self.first_seq = first
        self.records = records
        self.segment_size = seg_size
        self.last_ts = last_ts
        self.queue_count = queues
        self.body_crc = body_crc

    def _view(self, mv: memoryview, start: int, count: int, fmt: Literal["I", "Q"]) -> memoryview[int]:
        size = 8 if fmt == "Q" else 4
        view = mv[start : start + count * size].cast(fmt)
        self._views.append(view)
        return view

    def verify(self) -> bool:
        """Check the body checksum (once); False: the file is damaged and must not be used."""
        if not self.verified:
            self.verified = zlib.crc32(self._views[0][_HEADER_AREA:]) == self.body_crc
        return self.verified

    def _run(self, key: tuple[bytes, int]) -> tuple[int, int] | None:
        """Where the seqs of the queue `key` (from `queue_key`) lie in `_seqs`: [start, end); None if absent."""
        raw, h = key
        hashes = self._hashes
        i = bisect_left(hashes, h)
        n = self.queue_count
        while i < n and hashes[i] == h:
            j = self._order[i]
            if self._names[self._name_offs[j] : self._name_offs[j + 1]] == raw:
                return self._starts[j], self._starts[j + 1]
            i += 1
        return None

    def take(self, key: tuple[bytes, int], after_seq: int, limit: int, out: list[int]) -> None:
        """Append to `out` up to `limit` seqs of the queue `key` (from `queue_key`) above `after_seq`."""
        run = self._run(key)
        if run is not None:
            take(self._seqs, run[0], run[1], self.first_seq, after_seq, limit, out)

    def tail(self, key: tuple[bytes, int], after_seq: int, limit: int, out: list[int]) -> int:
        """As `tail` (the module function) over the run of the queue `key` (from `queue_key`); 0 if none."""
        run = self._run(key)
        return 0 if run is None else tail(self._seqs, run[0], run[1], self.first_seq, after_seq, limit, out)

    def load(self) -> tuple[array[int], dict[str, array[int]]]:
        """Positions and queues (seq - first_seq) as in-memory arrays: a checkpoint of the active segment, which
        keeps growing in memory."""
        names, name_offs, starts, seqs = self._names, self._name_offs, self._starts, self._seqs
        queues: dict[str, array[int]] = {}
        for i in range(self.queue_count):
            arr = queues[str(names[name_offs[i] : name_offs[i + 1]], "utf-8")] = array("I")
            arr.frombytes(seqs[starts[i] : starts[i + 1]].cast("B"))
        positions = array(self.positions.format)
        positions.frombytes(self.positions.cast("B"))
        return positions, queues

    def queues(self) -> dict[str, list[int]]:
        """Every queue with its seqs (tests and the `store check` tool; reads the whole table)."""
        out: dict[str, list[int]] = {}
        for i in range(self.queue_count):
            name = str(self._names[self._name_offs[i] : self._name_offs[i + 1]], "utf-8")
            seqs = self._seqs[self._starts[i] : self._starts[i + 1]]
            out[name] = [self.first_seq + d for d in seqs]
        return out

    def close(self) -> None:
        for view in reversed(self._views):
            view.release()
        self._views = []
        with contextlib.suppress(BufferError):  # a slice still alive elsewhere: unmapped when it goes
            self._mm.close()


# --- a segment and its index ------------------------------------------------------------------------------


class Segment:
    """One segment file of the commit log (`store.embedded.segments`) with its queue index: in memory while it is
    active or its index file is pending, else its mapped index file."""

    __slots__ = ("checkpointed", "checkpointed_records", "deleted", "fd", "first_seq", "index", "last_ts", "path",
                 "positions", "queues", "size")

    def __init__(self, path: Path, first_seq: int, fd: int) -> None:
        self.path = path
        self.first_seq = first_seq
        self.fd = fd
        # file offset of each record (record i has seq first_seq + i): in memory, or the mapped index's
        self.positions: array[int] | memoryview = array("I")
        # queue -> seq - first_seq of each of its records here, ascending (u32 as in the index file, so that
        # writing one is a copy); empty once the index file is mapped (`index`)
        self.queues: dict[str, array[int]] = {}
        self.index: SegmentIndex | None = None
        self.size = 0
        self.last_ts = 0  # timestamp_ms of the last record (retention by age)
        self.deleted = False  # by retention (an index write in flight learns it when done)
        self.checkpointed = 0  # bytes covered by the index file of this (active) segment
        self.checkpointed_records = 0

    @property
    def next_seq(self) -> int:
        return self.first_seq + len(self.positions)

    def record_end(self, i: int) -> int:
        return self.positions[i + 1] if i + 1 < len(self.positions) else self.size

    def take(self, queue: str, key: tuple[bytes, int], after_seq: int, limit: int, out: list[int]) -> None:
        """Append to `out` up to `limit` seqs of `queue` (`key`: its `queue_key`) above `after_seq`."""
        if self.index is not None:
            self.index.take(key, after_seq, limit, out)
            return
        arr = self.queues.get(queue)
        if arr:
            take(arr, 0, len(arr), self.first_seq, after_seq, limit, out)

    def tail(self, queue: str, key: tuple[bytes, int], after_seq: int, limit: int, out: list[int]) -> int:
        """How many seqs of `queue` above `after_seq` this segment holds; prepends its newest to `out` until it
        holds `limit`."""
        if self.index is not None:
            return self.index.tail(key, after_seq, limit, out)
        arr = self.queues.get(queue)
        return tail(arr, 0, len(arr), self.first_seq, after_seq, limit, out) if arr else 0

    def attach(self, idx: SegmentIndex) -> None:
        """Use a mapped index file (of the whole segment) instead of the in-memory index."""
        self.index = idx
        self.positions = idx.positions
        self.size = idx.segment_size
        self.last_ts = idx.last_ts
        self.queues = {}

    def load_checkpoint(self, idx: SegmentIndex) -> None:
        """Take the active segment's index up to its checkpoint into memory (`BadIndex` if unsound); records
        after it are the caller's to scan."""
        try:
            if not idx.verify():
                raise BadIndex("checksum mismatch")
            if idx.records:
                # the checkpoint's last record is where a damaged tail would show: check it as a scan would
                last = idx.positions[-1]
                try:
                    check_frame(os.pread(self.fd, idx.segment_size - last, last), 0)
                except (CorruptRecord, StructError) as exc:
                    raise BadIndex("its last record does not check") from exc
            self.positions, self.queues = idx.load()
            self.size = self.checkpointed = idx.segment_size
            self.checkpointed_records = idx.records
            self.last_ts = idx.last_ts
        finally:
            idx.close()

    def index_job(self, checkpoint: bool = False) -> IndexJob:
        return IndexJob(self, self.path, self.first_seq, len(self.positions), self.size, self.last_ts,
                        self.positions, self.queues, checkpoint)


# --- the writer task --------------------------------------------------------------------------------------


class IndexWriter:
    """Writes index files one at a time in its own worker thread, asking the log for the next job and handing
    each back when done (`done(job, ok)`: ok False when the segment went meanwhile or the write failed)."""

    def __init__(self, next_job: Callable[[], IndexJob | None], done: Callable[[IndexJob, bool], None]) -> None:
        self._next_job = next_job
        self._done = done
        self._executor: ThreadPoolExecutor | None = None
        self._task: asyncio.Task[None] | None = None
        self.written = 0  # index files written since open
        self.failed = 0

    @property
    def busy(self) -> bool:
        return self._task is not None

    def kick(self) -> None:
        """Start writing if there is work and no write is running (called when a segment is sealed)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        try:
            while (job := self._next_job()) is not None:
                if self._executor is None:
                    self._executor = ThreadPoolExecutor(1, thread_name_prefix="tidewire-index")
                try:
                    ok = await asyncio.get_running_loop().run_in_executor(self._executor, write_index, job)
                except Exception:
                    log.exception("store: could not write the index of %s; the next start scans that segment "
                                  "instead", job.log_path.name)
                    ok = False
                    self.failed += 1
                else:
                    self.written += ok
                self._done(job, ok)
        finally:
            self._task = None

    async def drain(self) -> None:
        """Wait until every pending index is written."""
        while self._task is not None:
            await asyncio.shield(self._task)

    async def close(self) -> None:
        """Finish pending writes and stop the thread."""
        await self.drain()
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
