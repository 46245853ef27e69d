"""Operators' checks of an embedded data directory (`tidewire store check|compact|dump`), on a stopped node.

`check_log` reads every segment whole: each record's checksum and seq, and each index file against what the
segment holds (positions and every queue's seqs). `rebuild_indexes` deletes the index files, so the next open
scans the segments and writes them anew. `queue_counts` lists the queues with their record counts from the index
files (a segment without one is scanned). The records (sessions, retained, wills) are checked by
`store.embedded.meta.maintenance.check`. A running node holds the metadata database's lock, so these tools
refuse to run beside it rather than read a directory that is changing.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tidewire.store.embedded.files import fsync_dir
from tidewire.store.embedded.segment_index import IDX_SUFFIX, BadIndex, SegmentIndex, index_path
from tidewire.store.records import CorruptRecord, UnsupportedRecord, iter_frames, peek_message

LOG_SUFFIX = ".log"
MAX_PROBLEMS = 100


@dataclass(slots=True)
class LogReport:
    segments: int = 0
    records: int = 0
    bytes: int = 0
    first_seq: int = 0
    last_seq: int = 0
    indexes_checked: int = 0
    indexes_missing: int = 0  # rebuilt by the next open: not a problem
    problems: list[str] = field(default_factory=list)
    problem_count: int = 0
    notes: list[str] = field(default_factory=list)

    def problem(self, text: str) -> None:
        self.problem_count += 1
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(text)


@dataclass(slots=True)
class _Scan:
    positions: list[int]
    queues: dict[str, list[int]]
    end: int  # bytes of whole records
    error: str | None  # the first bad frame: why and where


def segments(log_dir: Path) -> list[tuple[int, Path]]:
    """(first seq, path) of every segment, in order."""
    if not log_dir.is_dir():
        return []
    found = [(int(p.stem), p) for p in log_dir.iterdir() if p.suffix == LOG_SUFFIX and p.stem.isdigit()]
    return sorted(found)


def _scan(path: Path, first_seq: int, report: LogReport) -> _Scan:
    positions: list[int] = []
    queues: dict[str, list[int]] = {}
    end = 0
    error: str | None = None
    size = path.stat().st_size
    if size == 0:
        return _Scan(positions, queues, 0, None)
    with open(path, "rb") as f:
        buf = f.read()  # one segment at a time (segment_bytes, 64 MB by default)
    expected = first_seq
    try:
        for pos, body_start, body_end in iter_frames(buf):
            try:
                seq, _, names = peek_message(buf, body_start)
            except UnsupportedRecord as exc:
                seq, names = exc.seq, ()
                report.notes.append(f"{path.name}: seq {seq} is of format version {exc.version}, newer than "
                                    "this build reads")
            if seq != expected:
                error = f"seq {seq} where {expected} was due, at offset {pos}"
                break
            positions.append(pos)
            for name in names:
                queues.setdefault(name, []).append(seq)
            expected += 1
            end = body_end
    except CorruptRecord as exc:
        reason, pos = exc.args
        error = f"{reason} at offset {pos} ({size - pos} bytes from there)"
    return _Scan(positions, queues, end, error)


def check_log(log_dir: Path) -> LogReport:
    """Verify every record and index file of the log (one segment in memory at a time)."""
    report = LogReport()
    found = segments(log_dir)
    for i, (first_seq, path) in enumerate(found):
        last = i == len(found) - 1
        scan = _scan(path, first_seq, report)
        report.segments += 1
        report.records += len(scan.positions)
        report.bytes += path.stat().st_size
        if scan.positions:
            report.first_seq = report.first_seq or first_seq
            report.last_seq = first_seq + len(scan.positions) - 1
        if scan.error is not None:
            if last:  # a torn tail: the next open cuts it, as after any crash mid-write
                report.notes.append(f"{path.name}: torn tail, {scan.error}: cut at the next open")
            else:
                report.problem(f"{path.name}: {scan.error}")
        if i + 1 < len(found) and scan.positions and found[i + 1][0] != first_seq + len(scan.positions):
            report.problem(f"{path.name}: ends at seq {first_seq + len(scan.positions) - 1}, the next segment "
                           f"starts at {found[i + 1][0]}")
        _check_index(path, first_seq, scan, last, report)
    return report


def _check_index(path: Path, first_seq: int, scan: _Scan, last: bool, report: LogReport) -> None:
    idx_path = index_path(path)
    if not idx_path.exists():
        if not last:
            report.indexes_missing += 1
        return
    try:
        # The active segment's index is a checkpoint of its first bytes.
        idx = SegmentIndex(idx_path, first_seq, scan.end, prefix=last)
    except BadIndex as exc:
        report.problem(f"{idx_path.name}: {exc} (rebuilt from the segment at the next open)")
        return
    try:
        report.indexes_checked += 1
        if not idx.verify():
            report.problem(f"{idx_path.name}: body checksum mismatch (rebuilt at the next open)")
            return
        n = idx.records
        if list(idx.positions) != scan.positions[:n]:
            report.problem(f"{idx_path.name}: record positions differ from the segment's")
        want = {q: [s for s in seqs if s < first_seq + n] for q, seqs in scan.queues.items()}
        if idx.queues() != {q: seqs for q, seqs in want.items() if seqs}:
            report.problem(f"{idx_path.name}: queue entries differ from the segment's records")
    finally:
        idx.close()


def rebuild_indexes(log_dir: Path) -> int:
    """Delete every index file (the next open scans each segment and writes its index again); how many."""
    removed = 0
    for p in log_dir.iterdir() if log_dir.is_dir() else ():
        if p.name.endswith(IDX_SUFFIX) or p.name.endswith(IDX_SUFFIX + ".tmp"):
            p.unlink()
            removed += 1
    if removed:
        fsync_dir(log_dir)
    return removed


def queue_counts(log_dir: Path) -> Iterator[tuple[str, int]]:
    """(queue, records) over the whole log, from the index files (scanning a segment without one)."""
    counts: dict[str, int] = {}
    found = segments(log_dir)
    for i, (first_seq, path) in enumerate(found):
        queues: dict[str, list[int]] | None = None
        idx_path = index_path(path)
        if idx_path.exists() and i < len(found) - 1:
            try:
                idx = SegmentIndex(idx_path, first_seq, path.stat().st_size)
            except BadIndex:
                pass
            else:
                try:
                    queues = idx.queues() if idx.verify() else None
                finally:
                    idx.close()
        if queues is None:
            queues = _scan(path, first_seq, LogReport()).queues
        for name, seqs in queues.items():
            counts[name] = counts.get(name, 0) + len(seqs)
    yield from sorted(counts.items())
