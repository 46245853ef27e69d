"""The commit log: segment files of framed message records, their queue indexes, recovery, positional reads
and retention.

Segments are named by their first seq (20 digits) and hold consecutive seqs, so a record is found by
`positions[seq - first_seq]` without a per-message seq index. Each segment also indexes its records by queue:
the active segment (and a sealed one whose index file is not written yet) in memory, a sealed one through its
mapped index file (`store.embedded.segment_index`), so recovery scans only segments without a sound index file: the
active one, plus any whose file is missing or damaged. Everything here is synchronous; the caller owns the
event loop, the fsync thread hop and the index writer (`unindexed` is its work list).
"""

from __future__ import annotations

import contextlib
import logging
import os
from array import array
from bisect import bisect_right
from collections.abc import Callable, Sequence
from pathlib import Path

from tidewire.store.base import Message
from tidewire.store.embedded.files import write_all
from tidewire.store.embedded.recovery import scan_segment
from tidewire.store.embedded.segment_index import (
    IDX_SUFFIX,
    U32_MAX,
    BadIndex,
    IndexJob,
    Segment,
    SegmentIndex,
    index_path,
    queue_key,
)
from tidewire.store.records import (
    FRAME_SIZE,
    check_frame,
    decode_message_body,
    encode_message_body,
    frame_parts,
)

log = logging.getLogger("tidewire.store")

SUFFIX = ".log"
# Records of one read that lie within this span are fetched with a single pread.
_MAX_SPAN = 4 * 2**20
# Record offsets are u32 in index files, so a segment stops growing before it reaches 4 GiB.
MAX_SEGMENT_BYTES = U32_MAX


class CommitLog:
    """`max_queues`: a segment holding that many distinct queues is sealed early, which bounds the in-memory
    index when a flood of distinct topics arrives (0: no limit). `checkpoint_bytes`: the active segment's index
    is written again (a checkpoint) each time the segment grew this much and holds at most one queue per 8
    records written since the last one, so a restart after a crash scans at most about that much of it, or
    max_queues records (0: only when sealed and at close)."""

    def __init__(self, directory: Path, segment_bytes: int, max_queues: int = 0, checkpoint_bytes: int = 0) -> None:
        if not 0 < segment_bytes <= MAX_SEGMENT_BYTES:
            raise ValueError(f"segment_bytes must be 1..{MAX_SEGMENT_BYTES}, not {segment_bytes}")
        self.dir = directory
        self.segment_bytes = segment_bytes
        self.max_queues = max_queues if max_queues > 0 else 2**63
        self.checkpoint_bytes = checkpoint_bytes if checkpoint_bytes > 0 else 2**63
        self._checkpoint_due = False
        self.segments: list[Segment] = []
        self._firsts: list[int] = []  # first_seq of each segment, for bisect
        self.total_bytes = 0
        self.total_messages = 0
        # Sealed segments indexed only in memory, oldest first: the index writer's work.
        self.unindexed: list[Segment] = []
        self.on_unindexed: Callable[[], None] = lambda: None  # called when `unindexed` gains a segment
        self.scans = 0  # segments scanned by recovery or a rebuild (the restart cost), whole or in part
        self.scan_bytes = 0  # bytes they read
        # Sync bookkeeping: written-but-unsynced state, drained by take_sync_work().
        self._dirty: set[int] = set()  # fds of segments with unsynced writes
        self._dir_dirty = False

    # --- open / recovery -----------------------------------------------------------------------------
    def recover(self) -> None:
        """Open every segment: map a sealed one's index file when it is sound, else scan the segment (cutting
        a torn or corrupt tail) and index it in memory; the last (active) segment is indexed in memory, from
        its checkpoint (if sound) plus a scan of what follows it."""
        self.dir.mkdir(parents=True, exist_ok=True)
        logs: dict[int, Path] = {}
        indexes: dict[int, Path] = {}
        for p in self.dir.iterdir():
            if p.suffix == ".tmp":
                p.unlink()
            elif p.stem.isdigit() and p.suffix in (SUFFIX, IDX_SUFFIX):
                (logs if p.suffix == SUFFIX else indexes)[int(p.stem)] = p
        for first_seq, p in indexes.items():
            if first_seq not in logs:
                p.unlink()  # its segment went to retention just before a crash
        order = sorted(logs)
        for k, first_seq in enumerate(order):
            path = logs[first_seq]
            fd = os.open(path, os.O_RDWR | os.O_APPEND)
            seg = Segment(path, first_seq, fd)
            idx_path = indexes.get(first_seq)
            active = k == len(order) - 1
            if idx_path is not None:
                try:
                    self._open_index(seg, idx_path, active)
                except (BadIndex, OSError) as exc:
                    log.warning("store: not using %s (%s): scanning its segment", idx_path.name, exc)
                    with contextlib.suppress(FileNotFoundError):
                        idx_path.unlink()
            if seg.index is None:
                # the active segment from its checkpoint on (if any), any other whole
                self._scan(seg, seg.size)
                if not active:
                    self.unindexed.append(seg)
            self._add(seg)

    @staticmethod
    def _open_index(seg: Segment, path: Path, active: bool) -> None:
        """Map a sealed segment's index; load the active segment's checkpoint into memory, as it grows."""
        idx = SegmentIndex(path, seg.first_seq, os.fstat(seg.fd).st_size, prefix=active)
        if active:
            seg.load_checkpoint(idx)
        else:
            seg.attach(idx)

    def _scan(self, seg: Segment, start: int = 0) -> None:
        read = scan_segment(seg, start)
        self.scans += bool(read or not start)
        self.scan_bytes += read

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

    # --- index files ----------------------------------------------------------------------------------
    def request_checkpoint(self) -> None:
        """Have the index writer checkpoint the active segment next (at close; and every `checkpoint_bytes`)."""
        self._checkpoint_due = True
        self.on_unindexed()

    def next_index_job(self) -> IndexJob | None:
        """The oldest sealed segment still indexed only in memory, else a due checkpoint of the active segment,
        as a job for `segment_index.write_index`."""
        if self.unindexed:
            return self.unindexed[0].index_job()
        due, self._checkpoint_due = self._checkpoint_due, False
        act = self.segments[-1] if self.segments else None
        if not due or act is None or act.index is not None or act.size <= act.checkpointed:
            return None
        act.checkpointed = act.size
        act.checkpointed_records = len(act.positions)
        return act.index_job(checkpoint=True)

    def index_written(self, job: IndexJob, ok: bool) -> None:
        """A job is done: map the new file in place of the in-memory index (which goes), or keep the in-memory
        index when the write failed; a segment deleted meanwhile loses its new file."""
        seg = job.segment
        assert isinstance(seg, Segment)
        if job.checkpoint:
            return
        with contextlib.suppress(ValueError):
            self.unindexed.remove(seg)
        path = index_path(seg.path)
        if seg.deleted:
            if ok:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
            return
        if not ok:
            return
        try:
            idx = SegmentIndex(path, seg.first_seq, seg.size)
        except (BadIndex, OSError):
            log.exception("store: could not map the index just written for %s; keeping it in memory", seg.path.name)
            return
        idx.verified = True  # written from this memory a moment ago
        seg.attach(idx)

    def _checked(self, seg: Segment) -> SegmentIndex | None:
        """`seg`'s mapped index after its first-use checksum; None when the segment is indexed in memory (now
        also when its file was damaged: then the segment is scanned again and its index rewritten)."""
        idx = seg.index
        if idx is None or idx.verified or idx.verify():
            return idx
        log.error("store: %s is damaged (checksum mismatch): rebuilding it from %s", idx.path.name, seg.path.name)
        self.total_bytes -= seg.size
        self.total_messages -= len(seg.positions)
        seg.index = None
        seg.positions = array("I")
        idx.close()
        with contextlib.suppress(FileNotFoundError):
            idx.path.unlink()
        seg.queues = {}
        self._scan(seg)
        self.total_bytes += seg.size
        self.total_messages += len(seg.positions)
        self.unindexed.append(seg)
        self.unindexed.sort(key=lambda s: s.first_seq)
        self.on_unindexed()
        return None

    def verify_indexes(self) -> int:
        """Checksum every mapped index now instead of on first use, rebuilding damaged ones; return how many
        were rebuilt."""
        rebuilt = 0
        for seg in self.segments:
            if seg.index is not None and self._checked(seg) is None:
                rebuilt += 1
        return rebuilt

    def index_stats(self) -> tuple[int, int, int]:
        """(queue entries over all segments, queues indexed in memory, segments with a mapped index file)."""
        entries = memory = mapped = 0
        for seg in self.segments:
            if seg.index is not None:
                entries += seg.index.queue_count
                mapped += 1
            else:
                entries += len(seg.queues)
                memory += len(seg.queues)
        return entries, memory, mapped

    # --- append ---------------------------------------------------------------------------------------
    def _active_for(self, seq: int) -> Segment:
        seg = self.segments[-1] if self.segments else None
        if (seg is not None and seg.next_seq == seq and seg.size < self.segment_bytes
                and len(seg.queues) < self.max_queues):
            return seg
        return self._roll(seq)

    def _roll(self, seq: int) -> Segment:
        """Seal the last segment (its index file is then due) and start one at `seq`."""
        seg = self.segments[-1] if self.segments else None
        if seg is not None and not seg.positions and seg.first_seq <= seq:
            # An empty segment (a fresh one, or a restart after offsets moved past the log) is renamed so
            # its name stays its first seq.
            self._drop_last_empty(seg)
            seg = None
        path = self.dir / f"{seq:020d}{SUFFIX}"
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        new = Segment(path, seq, fd)
        self._add(new)
        self._dir_dirty = True
        if seg is not None and seg.index is None:
            self.unindexed.append(seg)
            self.on_unindexed()
        return new

    def _drop_last_empty(self, seg: Segment) -> None:
        self.segments.pop()
        self._firsts.pop()
        self._dirty.discard(seg.fd)
        os.close(seg.fd)
        seg.path.unlink()
        with contextlib.suppress(FileNotFoundError):
            index_path(seg.path).unlink()

    def append(self, messages: Sequence[Message], first_seq: int) -> Segment:
        """Write `messages` as seqs first_seq.. with one os.write; on error the file is cut back. Returns the
        segment written to (the caller indexes the messages into its `queues`)."""
        seg = self._active_for(first_seq)
        base = seg.size
        pos = base
        parts: list[bytes] = []
        new_pos: list[int] = []
        seq = first_seq
        for m in messages:
            head, body = frame_parts(encode_message_body(m, seq))
            parts.append(head)
            parts.append(body)
            new_pos.append(pos)
            pos += FRAME_SIZE + len(body)
            seq += 1
        if pos > MAX_SEGMENT_BYTES:
            if pos - base > MAX_SEGMENT_BYTES:
                raise ValueError(f"a batch of {pos - base} bytes is larger than a segment can be")
            seg = self._roll(first_seq)
            new_pos = [p - base for p in new_pos]
            pos -= base
            base = 0
        try:
            write_all(seg.fd, b"".join(parts))
        except BaseException:
            try:
                os.ftruncate(seg.fd, base)
            except OSError:
                log.exception("store: could not cut back a failed append in %s", seg.path.name)
            raise
        positions = seg.positions
        assert isinstance(positions, array)  # the active segment is indexed in memory
        positions.extend(new_pos)
        seg.size = pos
        seg.last_ts = messages[-1].timestamp_ms
        self.total_bytes += pos - base
        self.total_messages += len(messages)
        self._dirty.add(seg.fd)
        # A checkpoint rewrites the whole active index: worth it when its queues are few beside the records it
        # saves scanning. A flood of distinct queues is bounded by max_queues instead.
        if (pos - seg.checkpointed >= self.checkpoint_bytes and not self._checkpoint_due
                and len(seg.queues) * 8 <= len(positions) - seg.checkpointed_records):
            self.request_checkpoint()
        return seg

    # --- read -----------------------------------------------------------------------------------------
    def queue_seqs(self, queue: str, after_seq: int, limit: int) -> list[int]:
        """The first `limit` seqs of `queue` above `after_seq`, ascending: from the index of each segment
        holding seqs above it (a mapped file's table, or the in-memory index)."""
        segs = self.segments
        if limit <= 0 or not segs:
            return []
        act = segs[-1]
        first = act.first_seq
        if after_seq >= first - 1:
            # the common case, a reader near the end: only the active segment, indexed in memory
            arr = act.queues.get(queue)
            if not arr:
                return []
            lo = bisect_right(arr, after_seq - first) if after_seq >= first else 0
            return list(map(first.__add__, arr[lo : lo + limit]))
        out: list[int] = []
        key = queue_key(queue)
        for k in range(max(0, bisect_right(self._firsts, after_seq + 1) - 1), len(segs)):
            seg = segs[k]
            if seg.index is not None and not seg.index.verified:
                self._checked(seg)
            seg.take(queue, key, after_seq, limit - len(out), out)
            if len(out) >= limit:
                break
        return out

    def queue_tail(self, queue: str, after_seq: int, limit: int) -> tuple[int, list[int]]:
        """How many seqs of `queue` are above `after_seq`, and the newest `limit` of them, ascending: the
        segments from the newest back, each counted from its index's run ends (a bisection in the oldest)."""
        segs = self.segments
        key = queue_key(queue)
        count = 0
        out: list[int] = []
        for k in range(len(segs) - 1, max(0, bisect_right(self._firsts, after_seq + 1) - 1) - 1, -1):
            seg = segs[k]
            if seg.index is not None and not seg.index.verified:
                self._checked(seg)
            count += seg.tail(queue, key, after_seq, limit, out)
        return count, out

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
            if seg.index is not None and not seg.index.verified:
                self._checked(seg)
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
            self._forget(seg)
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

    def _forget(self, seg: Segment) -> None:
        """Drop a deleted segment's index (a write in flight sees `deleted` and removes its file)."""
        seg.deleted = True
        with contextlib.suppress(ValueError):
            self.unindexed.remove(seg)
        if seg.index is not None:
            seg.index.close()
            seg.index = None
        seg.positions = array("I")
        seg.queues = {}
        with contextlib.suppress(FileNotFoundError):
            index_path(seg.path).unlink()

    def close(self) -> None:
        for seg in self.segments:
            os.close(seg.fd)
            if seg.index is not None:
                seg.index.close()
        self.unindexed.clear()
        self.segments.clear()
        self._firsts.clear()
        self._dirty.clear()
