"""Recovery's scan of one commit-log segment: its framed records are read into the segment's in-memory queue
index, and a torn or corrupt tail (a crash mid-write) is cut off the file so that appends continue after the
last whole record."""

from __future__ import annotations

import logging
import os
from array import array

from tidewire.store.embedded.segment_index import U32_MAX, Segment
from tidewire.store.records import CorruptRecord, UnsupportedRecord, iter_frames, peek_message

log = logging.getLogger("tidewire.store")


def scan_segment(seg: Segment, start: int = 0) -> int:
    """Index the records of `seg` from offset `start` (0, or the end of records indexed already); returns the
    bytes read."""
    with open(seg.path, "rb") as f:
        f.seek(start)
        buf = f.read()
    # u64 offsets only in a segment of 4 GiB or more (an older build's): this build seals them before
    positions = seg.positions if start else array("I" if len(buf) <= U32_MAX else "q")
    assert isinstance(positions, array)
    seg.positions = positions
    index = seg.queues
    expected = seg.next_seq
    first = seg.first_seq
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
            positions.append(start + pos)
            for q in queues:
                arr = index.get(q)
                if arr is None:
                    arr = index[q] = array("I")
                arr.append(seq - first)
            seg.last_ts = ts
            expected += 1
            good_end = body_end
    except CorruptRecord as exc:
        reason, pos = exc.args
        log.warning("store: cutting %d bytes at offset %d of %s (%s); %d records kept",
                    len(buf) - pos, start + pos, seg.path.name, reason, len(positions))
        os.ftruncate(seg.fd, start + pos)
        os.fsync(seg.fd)
        good_end = pos
    seg.size = start + good_end
    if newer is not None:
        log.error("store: %s holds records of format version %d, newer than this build reads: kept in the "
                  "log but in no queue, and reading them fails (last one: seq %d)",
                  seg.path.name, newer.version, newer.seq)
    return len(buf)
