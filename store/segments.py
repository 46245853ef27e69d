"""The commit log: segment files of framed message records, recovery scan, positional reads and retention.

Segments are named by their first seq (20 digits) and hold consecutive seqs, so a record is found by
`positions[seq - first_seq]` without a per-message seq index. Everything here is synchronous; the caller owns
the event loop and the fsync thread hop.
"""

from __future__ import annotations

import logging
import os
from array import array
from bisect import bisect_right
from collections.abc import Callable, Sequence
from pathlib import Path

from store.base import Message
from store.records import (
    FRAME_SIZE,
    CorruptRecord,
    UnsupportedRecord,
    check_frame,
    decode_message_body,
    encode_message_body,
    frame_parts,
    iter_frames,
    peek_message,
)

log = logging.getLogger("tidewire.store")

SUFFIX = ".log"
# Records of one read that lie within this span are fetched with a single pread.
_MAX_SPAN = 4 * 2**20


def write_all(fd: int, data: bytes | memoryview) -> None:
    """os.write until done: a regular-file write can in principle be short (e.g. near a quota)."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


class Segment:
    __slots__ = ("fd", "first_seq", "last_ts", "path", "positions", "size")

    def __init__(self, path: Path, first_seq: int, fd: int) -> None:
        self.path = path
        self.first_seq = first_seq
        self.fd = fd
        self.positions = array("q")  # file offset of each record; record i has seq first_seq + i
        self.size = 0
        self.last_ts = 0  # timestamp_ms of the last record (retention by age)

    @property
    def next_seq(self) -> int:
        return self.first_seq + len(self.positions)

    def record_end(self, i: int) -> int:
        return self.positions[i + 1] if i + 1 < len(self.positions) else self.size


class CommitLog:
    def __init__(self, directory: Path, segment_bytes: int) -> None:
        self.dir = directory
        self.segment_bytes = segment_bytes
        self.segments: list[Segment] = []
        self._firsts: list[int] = []  # first_seq of each segment, for bisect
        self.total_bytes = 0
        self.total_messages = 0
        # Sync bookkeeping: written-but-unsynced state, drained by take_sync_work().
        self._dirty: set[int] = set()  # fds of segments with unsynced writes
        self._dir_dirty = False

    # --- open / recovery -----------------------------------------------------------------------------
    def recover(self, on_record: Callable[[int, tuple[str, ...]], None]) -> None:
        """Scan every segment, cut a torn or corrupt tail, and report (seq, queues) of each live record."""
        self.dir.mkdir(parents=True, exist_ok=True)
        names = []
        for p in self.dir.iterdir():
            if p.suffix == SUFFIX and p.stem.isdigit():
                names.append((int(p.stem), p))
            elif p.suffix == ".tmp":
                p.unlink()
        names.sort()
        for first_seq, path in names:
            fd = os.open(path, os.O_RDWR | os.O_APPEND)
            seg = Segment(path, first_seq, fd)
            self._scan(seg, on_record)
            self._add(seg)

    def _scan(self, seg: Segment, on_record: Callable[[int, tuple[str, ...]], None]) -> None:
        with open(seg.path, "rb") as f:
            buf = f.read()
        positions = seg.positions
        expected = seg.first_seq
        good_end = 0
        newer: UnsupportedRecord | None = None
        try:
            for pos, body_start, body_end in iter_frames(buf):
                try:
                    seq, ts, queues = peek_message(buf, body_start)
                except UnsupportedRecord as exc:
                    # Written by a newer build: whole and in sequence, so it stays in the log (cutting it would
                    # lose it and everything after); without its queues it is indexed nowhere.
                    seq, ts, queues, newer = exc.seq, exc.timestamp_ms, (), exc
                if seq != expected:
                    raise CorruptRecord("unexpected seq", pos)
                positions.append(pos)
                on_record(seq, queues)
                seg.last_ts = ts
                expected += 1
                good_end = body_end
        except CorruptRecord as exc:
            reason, pos = exc.args
            log.warning("store: cutting %d bytes at offset %d of %s (%s); %d records kept",
                        len(buf) - pos, pos, seg.path.name, reason, len(positions))
            os.ftruncate(seg.fd, pos)
            os.fsync(seg.fd)
            good_end = pos
        seg.size = good_end
        if newer is not None:
            log.error("store: %s holds records of format version %d, newer than this build reads: kept in the "
                      "log but in no queue, and reading them fails (last one: seq %d)",
                      seg.path.name, newer.version, newer.seq)

    def _add(self, seg: Segment) -> None:
        self.segments.append(seg)
        self._firsts.append(seg.first_seq)
        self.total_bytes += seg.size
        self.total_messages += len(seg.positions)

    @property
    def last_seq(self) -> int:
        """Seq of the last record, or one below the first seq the (empty) last segment would get."""
        return self.segments[-1].next_seq - 1 if self.segments else 0

    @property
    def first_seq(self) -> int:
        """First seq still in the log (reads below it find nothing)."""
        return self.segments[0].first_seq if self.segments else 0

    # --- append ---------------------------------------------------------------------------------------
    def _active_for(self, seq: int) -> Segment:
        seg = self.segments[-1] if self.segments else None
        if seg is not None and seg.next_seq == seq and seg.size < self.segment_bytes:
            return seg
        if seg is not None and not seg.positions and seg.first_seq <= seq:
            # An empty segment (a fresh one, or a restart after offsets moved past the log) is renamed so
            # its name stays its first seq.
            self._drop_last_empty(seg)
        path = self.dir / f"{seq:020d}{SUFFIX}"
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        new = Segment(path, seq, fd)
        self._add(new)
        self._dir_dirty = True
        return new

    def _drop_last_empty(self, seg: Segment) -> None:
        self.segments.pop()
        self._firsts.pop()
        self._dirty.discard(seg.fd)
        os.close(seg.fd)
        seg.path.unlink()

    def append(self, messages: Sequence[Message], first_seq: int) -> None:
        """Write `messages` as seqs first_seq.. with one os.write; on error the file is cut back."""
        seg = self._active_for(first_seq)
        base = seg.size
        pos = base
        parts: list[bytes] = []
        new_pos = array("q")
        seq = first_seq
        for m in messages:
            head, body = frame_parts(encode_message_body(m, seq))
            parts.append(head)
            parts.append(body)
            new_pos.append(pos)
            pos += FRAME_SIZE + len(body)
            seq += 1
        try:
            write_all(seg.fd, b"".join(parts))
        except BaseException:
            try:
                os.ftruncate(seg.fd, base)
            except OSError:
                log.exception("store: could not cut back a failed append in %s", seg.path.name)
            raise
        seg.positions.extend(new_pos)
        seg.size = pos
        seg.last_ts = messages[-1].timestamp_ms
        self.total_bytes += pos - base
        self.total_messages += len(messages)
        self._dirty.add(seg.fd)

    # --- read -----------------------------------------------------------------------------------------
    def read(self, seqs: Sequence[int]) -> list[Message]:
        """Messages for ascending `seqs`, skipping any no longer in the log. One pread per nearby run."""
        out: list[Message] = []
        n = len(seqs)
        k = 0
        firsts = self._firsts
        while k < n:
            si = bisect_right(firsts, seqs[k]) - 1
            if si < 0:
                k += 1
                continue
            seg = self.segments[si]
            hi = seg.next_seq
            # the run of requested seqs inside this segment
            j = k
            while j < n and seqs[j] < hi:
                j += 1
            if j == k:
                k += 1
                continue
            self._read_run(seg, seqs[k:j], out)
            k = j
        return out

    def _read_run(self, seg: Segment, seqs: Sequence[int], out: list[Message]) -> None:
        first = seg.first_seq
        positions = seg.positions
        lo_i = seqs[0] - first
        hi_i = seqs[-1] - first
        start = positions[lo_i]
        end = seg.record_end(hi_i)
        if end - start <= _MAX_SPAN:
            buf = os.pread(seg.fd, end - start, start)
            for s in seqs:
                body_start, _ = check_frame(buf, positions[s - first] - start)
                out.append(decode_message_body(buf, body_start))
            return
        for s in seqs:
            i = s - first
            p = positions[i]
            buf = os.pread(seg.fd, seg.record_end(i) - p, p)
            body_start, _ = check_frame(buf, 0)
            out.append(decode_message_body(buf, body_start))

    def seqs_after(self, after_seq: int, limit: int) -> list[int]:
        """The first `limit` seqs in the log above `after_seq`, ascending (segments hold consecutive seqs)."""
        out: list[int] = []
        if limit <= 0:
            return out
        for seg in self.segments[max(0, bisect_right(self._firsts, after_seq + 1) - 1) :]:
            lo = max(seg.first_seq, after_seq + 1)
            take = min(seg.next_seq - lo, limit - len(out))
            if take > 0:
                out.extend(range(lo, lo + take))
                if len(out) >= limit:
                    break
        return out

    # --- retention ------------------------------------------------------------------------------------
    def enforce_retention(self, retention_bytes: int, retention_seconds: int, now_ms: int,
                          hold: int | None = None) -> int:
        """Delete whole segments, oldest first, never the last (active) one, nor one holding a seq above
        `hold` (the lowest reader hold; None: no hold); return how many."""
        deleted = 0
        cutoff = now_ms - retention_seconds * 1000
        while len(self.segments) > 1:
            seg = self.segments[0]
            if hold is not None and seg.next_seq - 1 > hold:
                break
            too_old = retention_seconds > 0 and seg.last_ts < cutoff
            too_big = retention_bytes > 0 and self.total_bytes > retention_bytes
            if not (too_old or too_big):
                break
            self.segments.pop(0)
            self._firsts.pop(0)
            self.total_bytes -= seg.size
            self.total_messages -= len(seg.positions)
            self._dirty.discard(seg.fd)
            os.close(seg.fd)
            seg.path.unlink()
            self._dir_dirty = True
            deleted += 1
        if deleted:
            log.info("store: retention deleted %d segments", deleted)
        return deleted

    # --- durability -----------------------------------------------------------------------------------
    def take_sync_work(self) -> tuple[list[int], bool]:
        """(segment fds to fdatasync, whether the directory needs an fsync); clears the pending state."""
        fds = list(self._dirty)
        self._dirty.clear()
        dir_dirty = self._dir_dirty
        self._dir_dirty = False
        return fds, dir_dirty

    def requeue_sync_work(self, fds: list[int], dir_dirty: bool) -> None:
        """After a failed fsync: the work is still pending (fds of deleted segments are ignored)."""
        live = {s.fd for s in self.segments}
        self._dirty.update(fd for fd in fds if fd in live)
        self._dir_dirty = self._dir_dirty or dir_dirty

    @property
    def dirty(self) -> bool:
        return bool(self._dirty) or self._dir_dirty

    def close(self) -> None:
        for seg in self.segments:
            os.close(seg.fd)
        self.segments.clear()
        self._firsts.clear()
        self._dirty.clear()
