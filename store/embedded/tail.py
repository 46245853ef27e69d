"""A read-only `LogSource` over an embedded data directory that another process (the gateway) is writing.

`EmbeddedLogTail` opens the segment files of `<data_dir>/log` read-only and follows them: new frames at the end
of the last segment, new segment files, old ones deleted by retention. It never writes a log file and never cuts
anything: a partial or not yet checked frame at the end of the last segment is "not yet", read again later. It
returns only complete frames whose crc checks and whose seq is the one expected there.

What it sees: the gateway appends (one `write` per batch) before it syncs, so a tail may return records that are
written but not yet fsynced. That is fine for a reader: the gateway hands out seqs only once, so a later
append never reuses them, and a record that a power loss takes away was lost to the gateway's subscribers too.
Two cases can replace records a tail already returned, both after a failure of the writer's disk: a write that
fails midway is cut back and its seqs are reused, and a segment found shorter than what was read is rescanned
(logged as a warning).

Segments other than the last are complete: the directory is listed before any file is read, and the writer
creates a segment only after its last write to the previous one. A bad frame in one of them (the writer will
cut it at its next start) ends that segment for the tail, with a warning. Holds are the same hold files the
store reads (`store.embedded.log`); leases are flock locks, one holder process at a time.

Reads are synchronous file I/O in bounded batches (at most `limit` records and about `max_batch_bytes`), done
on the event loop: a batch is one `pread` per segment touched, plus the scan of frames not seen yet. Memory:
the frame positions of the segment being read and those after it (segments the reader has passed are dropped).
"""

from __future__ import annotations

import asyncio
import logging
import os
from array import array
from bisect import bisect_right
from pathlib import Path
from struct import error as StructError
from zlib import crc32

from tidewire.errors import StoreClosed
from tidewire.store.base import LogSlice, Message
from tidewire.store.embedded.log import HOLDS_DIR, FileLeases, check_partition, hold_file_name, read_holds, write_hold
from tidewire.store.embedded.segments import SUFFIX
from tidewire.store.records import (
    FRAME,
    FRAME_SIZE,
    MAX_RECORD,
    UnsupportedRecord,
    check_frame,
    decode_message_body,
    peek_message,
)

log = logging.getLogger("tidewire.store.tail")

_SCAN_CHUNK = 1 << 20  # bytes read per pread while scanning for frames
DEFAULT_MAX_BATCH_BYTES = 4 << 20


class _Segment:
    __slots__ = ("dead", "fd", "first_seq", "ino", "name", "positions", "scanned")

    def __init__(self, name: str, first_seq: int, fd: int, ino: int) -> None:
        self.name = name
        self.first_seq = first_seq
        self.fd = fd
        self.ino = ino
        self.positions = array("q")  # offset of each complete, checked frame: record i has seq first_seq + i
        self.scanned = 0  # end of the last of them
        self.dead = False  # a bad frame in a complete segment: nothing after it is read

    @property
    def next_seq(self) -> int:
        return self.first_seq + len(self.positions)

    def forget(self) -> None:
        self.positions = array("q")
        self.scanned = 0
        self.dead = False


class EmbeddedLogTail:
    """`LogSource` of one embedded data directory, from another process (see the module)."""

    def __init__(self, data_dir: str | Path, *, max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES) -> None:
        self.data_dir = Path(data_dir)
        self.dir = self.data_dir / "log"
        self.max_batch_bytes = max_batch_bytes
        self._segments: list[_Segment] = []
        self._firsts: list[int] = []
        self._leases = FileLeases(self.dir / HOLDS_DIR)
        self._open = False

    async def open(self) -> None:
        self._open = True
        self._refresh()

    async def close(self) -> None:
        self._open = False
        for seg in self._segments:
            os.close(seg.fd)
        self._segments.clear()
        self._firsts.clear()
        self._leases.close()

    # --- LogSource ------------------------------------------------------------------------------------------
    def log_partitions(self) -> int:
        return 1

    async def read_log(self, partition: int, after_seq: int, limit: int) -> LogSlice:
        check_partition(partition)
        if not self._open:
            raise StoreClosed("the log tail is not open")
        self._refresh()
        segs = self._segments
        trimmed = max(0, segs[0].first_seq - 1) if segs else 0
        if limit <= 0 or not segs:
            return LogSlice([], after_seq, trimmed)
        si = max(0, bisect_right(self._firsts, after_seq + 1) - 1)
        for seg in segs[:si]:
            seg.forget()  # passed: rescanned only if a reader goes back
        out: list[Message] = []
        budget = self.max_batch_bytes
        for i in range(si, len(segs)):
            seg = segs[i]
            last = i == len(segs) - 1
            lo = max(seg.first_seq, after_seq + 1)
            self._extend(seg, lo + (limit - len(out)) - 1, complete=not last)
            take = min(seg.next_seq - lo, limit - len(out))
            if take > 0:
                budget = self._read_run(seg, lo, take, budget, out)
                if len(out) >= limit or budget <= 0:
                    return LogSlice(out, out[-1].seq, trimmed)
        return LogSlice(out, max(segs[-1].next_seq - 1, after_seq), trimmed)

    async def hold_log(self, partition: int, holder: str, seq: int) -> None:
        check_partition(partition)
        hold_file_name(holder)
        await asyncio.to_thread(write_hold, self.dir / HOLDS_DIR, holder, seq)

    async def log_holds(self, partition: int) -> dict[str, int]:
        check_partition(partition)
        return read_holds(self.dir / HOLDS_DIR)

    async def lease(self, key: str, owner: str, ttl_ms: int) -> int:
        return self._leases.lease(key, owner, ttl_ms)

    async def release(self, key: str, owner: str) -> None:
        self._leases.release(key, owner)

    # --- following the directory ----------------------------------------------------------------------------
    def _refresh(self) -> None:
        """Match the open segments to the directory: open new files, close deleted or replaced ones."""
        found: dict[int, tuple[str, int]] = {}
        try:
            with os.scandir(self.dir) as it:
                for entry in it:
                    stem, dot, suffix = entry.name.partition(".")
                    if dot and "." + suffix == SUFFIX and stem.isdigit():
                        found[int(stem)] = (entry.name, entry.inode())
        except FileNotFoundError:
            pass  # the writer has not created its log yet
        kept: list[_Segment] = []
        for seg in self._segments:
            now = found.get(seg.first_seq)
            if now is not None and now[1] == seg.ino:
                kept.append(seg)
                del found[seg.first_seq]
            else:
                os.close(seg.fd)
        for first_seq, (name, ino) in found.items():
            try:
                fd = os.open(self.dir / name, os.O_RDONLY)
            except FileNotFoundError:
                continue  # deleted since the listing
            kept.append(_Segment(name, first_seq, fd, ino))
        kept.sort(key=lambda s: s.first_seq)
        self._segments = kept
        self._firsts = [s.first_seq for s in kept]

    def _extend(self, seg: _Segment, want_seq: int, complete: bool) -> None:
        """Scan new frames of `seg` until it holds `want_seq` or its checked frames end."""
        if seg.dead or seg.next_seq > want_seq:
            return
        size = os.fstat(seg.fd).st_size
        if size < seg.scanned:
            log.warning("tail: %s shrank below what was read (the writer cut back a failed write): rescanning",
                        seg.name)
            seg.forget()
        pos = seg.scanned
        need = _SCAN_CHUNK
        positions = seg.positions
        while pos < size and seg.next_seq <= want_seq:
            buf = os.pread(seg.fd, min(need, size - pos), pos)
            need = _SCAN_CHUNK
            off = 0
            bad = ""
            while True:  # every whole frame of the chunk: the next call needs them anyway
                if len(buf) - off < FRAME_SIZE:
                    break
                length, crc = FRAME.unpack_from(buf, off)
                end = off + FRAME_SIZE + length
                if length > MAX_RECORD:
                    bad = "length out of range"
                    break
                if end > len(buf):
                    need = end - off  # read the whole frame next round (if the file holds it yet)
                    break
                if crc32(memoryview(buf)[off + FRAME_SIZE : end]) != crc:
                    bad = "crc mismatch"
                    break
                try:
                    seq = peek_message(buf, off + FRAME_SIZE)[0]
                except UnsupportedRecord as exc:
                    seq = exc.seq  # kept in place; reading it raises (as in the store)
                except (StructError, ValueError):  # an undecodable header is a bad frame here
                    seq = -1
                if seq != seg.next_seq:
                    bad = "unexpected seq"
                    break
                positions.append(pos + off)
                off = end
            pos += off
            seg.scanned = pos
            if bad or (off == 0 and pos + need > size):
                if complete:
                    # not the last segment: nothing more will be written to it
                    seg.dead = True
                    log.warning("tail: %s ends with a bad frame at offset %d (%s); reading on in the next "
                                "segment", seg.name, pos, bad or "incomplete frame")
                return  # the last segment: not yet written (or being written)

    def _read_run(self, seg: _Segment, lo: int, take: int, budget: int, out: list[Message]) -> int:
        """Append records lo..lo+take-1 of `seg` to `out` within about `budget` bytes (at least one record);
        return the budget left."""
        positions = seg.positions
        i0 = lo - seg.first_seq
        start = positions[i0]
        n = 1
        while n < take:
            end = positions[i0 + n + 1] if i0 + n + 1 < len(positions) else seg.scanned
            if end - start > budget:
                break
            n += 1
        end = positions[i0 + n] if i0 + n < len(positions) else seg.scanned
        buf = os.pread(seg.fd, end - start, start)
        for k in range(n):
            body_start, _ = check_frame(buf, positions[i0 + k] - start)
            out.append(decode_message_body(buf, body_start))
        return budget - (end - start) if n == take else 0
