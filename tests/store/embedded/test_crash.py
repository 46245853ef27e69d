"""Crash simulation: a writer appends and syncs, then dies by SIGKILL; everything it synced is there."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from tidewire.store.embedded.engine import EmbeddedStore

WRITER = textwrap.dedent(
    """
    import asyncio, sys
    from tidewire.store.base import Message, SessionRecord
    from tidewire.store.embedded.engine import EmbeddedStore

    async def main() -> None:
        s = EmbeddedStore(sys.argv[1], fsync="batch", segment_bytes=16384)
        await s.open()
        await s.put_session(SessionRecord("sub"))
        i = 0
        while True:
            batch = [Message(f"t/{i + k}", b"%010d" % (i + k), queues=("q",)) for k in range(10)]
            i += 10
            await s.append(batch)
            await s.set_offsets({"sub": (batch[0].seq, batch[-1].seq, 0)})
            await s.sync()
            print(batch[-1].seq, flush=True)

    asyncio.run(main())
    """
)


async def test_synced_writes_survive_sigkill(tmp_path: Path) -> None:
    data = tmp_path / "data"
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(data)], stdout=subprocess.PIPE, text=True,
        cwd=Path(__file__).resolve().parents[3],
    )
    assert proc.stdout is not None
    synced = 0
    deadline = time.monotonic() + 20
    while synced < 3000 and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        synced = int(line)
    os.kill(proc.pid, signal.SIGKILL)  # mid-flight: it is writing the next batches
    proc.wait()
    proc.stdout.close()
    assert synced >= 3000, "writer did not get far enough"

    s = EmbeddedStore(data)
    await s.open()
    got = (await s.read("q", 0, synced + 10_000)).messages
    assert len(got) >= synced
    assert [m.seq for m in got] == list(range(1, len(got) + 1))
    assert all(m.payload == b"%010d" % (m.seq - 1) and m.topic == f"t/{m.seq - 1}" for m in got)
    sub = await s.get_session("sub")
    assert sub is not None and sub.sent_upto >= synced
    assert s.last_seq() >= max(len(got), sub.sent_upto)
    # new appends never reuse a seq anyone may have seen
    nxt = s.last_seq() + 1
    await s.append([got[0]])
    assert got[0].seq == nxt
    assert s.stats()["segments"] > 1
    await s.close()
