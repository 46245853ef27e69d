"""Crash simulation for the index files: a writer appends and syncs into small segments (an index file is
written every few batches, and the active segment is checkpointed every 2 KiB), dies by SIGKILL at random
moments, and restarts over the same data several times. Every acknowledged message must then be readable from
each of its queues, in order, exactly once, and the indexes must agree with a full scan of the segments."""

from __future__ import annotations

import asyncio
import os
import random
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tidewire.store.embedded.engine import EmbeddedStore
from tidewire.store.embedded.segment_index import SegmentIndex
from tidewire.store.records import iter_frames, peek_message

WRITER = textwrap.dedent(
    """
    import asyncio, sys
    from tidewire.store.base import Message
    from tidewire.store.embedded.engine import EmbeddedStore

    def queues(n):
        return ("all", f"m{n % 7}", f"u{n % 300}")

    async def main() -> None:
        s = EmbeddedStore(sys.argv[1], fsync="batch", segment_bytes=8192, segment_max_queues=60,
                          index_checkpoint_bytes=2048)
        await s.open()
        i = int(sys.argv[2])
        while True:
            batch = [Message(f"t/{i + k}", b"%010d" % (i + k), queues=queues(i + k)) for k in range(5)]
            await s.append(batch)
            await s.sync()
            print(i, batch[0].seq, flush=True)
            i += 5

    asyncio.run(main())
    """
)
ROOT = Path(__file__).resolve().parents[3]


def queues_of(n: int) -> tuple[str, ...]:
    return ("all", f"m{n % 7}", f"u{n % 300}")


def run_and_kill(data: Path, first_id: int, rng: random.Random) -> dict[int, int]:
    """One writer life: returns the acknowledged messages as id -> seq."""
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(data), str(first_id)], stdout=subprocess.PIPE,
                            bufsize=0, cwd=ROOT)
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    acked: dict[int, int] = {}
    pending = b""
    # mostly mid-run, sometimes while it is still opening (recovery rewrites missing index files then)
    early = rng.random() < 0.25
    deadline = time.monotonic() + (rng.uniform(0.05, 0.4) if early else 10)
    kill_at: float | None = None
    try:
        while True:
            now = time.monotonic()
            if now >= deadline or (kill_at is not None and now >= kill_at):
                break
            ready, _, _ = select.select([fd], [], [], 0.01)
            if not ready:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                ident, seq = map(int, line.split())
                acked.update((ident + k, seq + k) for k in range(5))
            if kill_at is None:
                kill_at = time.monotonic() + rng.uniform(0.05, 0.8)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
    return acked


def scan_model(log_dir: Path) -> dict[str, list[int]]:
    model: dict[str, list[int]] = {}
    for path in sorted(log_dir.glob("*.log")):
        buf = path.read_bytes()
        for _, body_start, _ in iter_frames(buf):
            seq, _, queues = peek_message(buf, body_start)
            for q in queues:
                model.setdefault(q, []).append(seq)
    return model


@pytest.mark.slow  # long: `make test-slow` (CI runs it after `make test`)
async def test_acknowledged_messages_survive_kills_during_index_writes(tmp_path: Path) -> None:
    data = tmp_path / "data"
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"kill timings: random.Random({seed})")  # shown on failure, to replay the same kills
    rng = random.Random(seed)
    acked: dict[int, int] = {}
    for life in range(6):
        acked.update(run_and_kill(data, life * 1_000_000, rng))
    assert len(acked) > 500, "the writer did not get far enough"
    log_dir = data / "log"
    assert len(list(log_dir.glob("*.idx"))) > 5

    s = EmbeddedStore(data, segment_bytes=8192, segment_max_queues=60, recent_messages=0)
    await s.open()
    assert not list(log_dir.glob("*.tmp"))
    # every acknowledged message, from each of its queues, in order, exactly once, with its own content
    by_seq = {seq: ident for ident, seq in acked.items()}
    assert len(by_seq) == len(acked)
    for q in {q for ident in acked for q in queues_of(ident)}:
        got = (await s.read(q, 0, 1_000_000)).messages
        seqs = [m.seq for m in got]
        assert seqs == sorted(set(seqs))
        for m in got:
            if m.seq in by_seq:
                assert m.payload == b"%010d" % by_seq[m.seq] and q in m.queues
        want = sorted(seq for ident, seq in acked.items() if q in queues_of(ident))
        assert set(want) <= set(seqs), f"{q}: acknowledged messages missing"
    # the index agrees with a full scan, before and after the index files of this start are written
    model = scan_model(log_dir)
    for q, seqs in model.items():
        assert [m.seq for m in (await s.read(q, 0, 1_000_000)).messages] == seqs
    await s.close()
    for idx_path in sorted(log_dir.glob("*.idx")):
        log_path = idx_path.with_suffix(".log")
        idx = SegmentIndex(idx_path, int(idx_path.stem), log_path.stat().st_size,
                           prefix=idx_path == max(log_dir.glob("*.idx")))
        assert idx.verify()
        buf = log_path.read_bytes()
        own: dict[str, list[int]] = {}
        positions = []
        for pos, body_start, _ in iter_frames(buf[: idx.segment_size]):
            seq, _, queues = peek_message(buf, body_start)
            positions.append(pos)
            for q in queues:
                own.setdefault(q, []).append(seq)
        assert list(idx.positions) == positions and idx.queues() == own
        idx.close()
    s2 = EmbeddedStore(data, segment_bytes=8192, segment_max_queues=60)
    await s2.open()
    assert s2.stats()["segments_scanned"] == 0
    for q, seqs in model.items():
        assert [m.seq for m in (await s2.read(q, 0, 1_000_000)).messages] == seqs
    await s2.close()
    await asyncio.sleep(0)  # one turn of the loop: callbacks the close scheduled run before the test ends
