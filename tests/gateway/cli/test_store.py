"""`tidewire store check|compact|dump` on a real embedded data directory: a clean one passes, a damaged record or
index file is reported (exit 1), compact rebuilds the indexes, dump lists what is stored, and nothing runs while
a store holds the directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from tidewire.gateway.cli import app
from tidewire.store.base import Message, SessionRecord, SubscriptionRecord
from tidewire.store.embedded.engine import EmbeddedStore

runner = CliRunner()


async def _fill(data_dir: Path) -> EmbeddedStore:
    s = EmbeddedStore(data_dir, segment_bytes=4096)
    await s.open()
    for i in range(60):
        await s.append([Message(f"dev/{i % 3}/t", b"x" * 100, qos=1, queues=(f"dev/{i % 3}/t", "dev/#"))])
    await s.put_session(SessionRecord("c1", protocol_level=5, expiry_interval=60, disconnected_at_ms=1,
                                      subscriptions={"dev/+/t": SubscriptionRecord("dev/+/t", 1)}))
    await s.set_retained("dev/0/t", Message("dev/0/t", b"last", retain=True))
    await s.sync()
    return s


def _run(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["store", *args])
    return result.exit_code, result.output


async def test_check_compact_and_dump(tmp_path: Path) -> None:
    data = tmp_path / "data"
    s = await _fill(data)
    code, out = _run("check", "-d", str(data))
    assert code == 2 and "is a node running on it?" in out  # the open store holds the directory
    await s.close()

    code, out = _run("check", "-d", str(data), "--json")
    report = json.loads(out)
    assert code == 0, out
    assert (report["records"], report["first_seq"], report["last_seq"], report["problems"]) == (60, 1, 60, 0)
    assert report["segments"] >= 3 and report["indexes_checked"] == report["segments"]
    assert report["records_by_kind"]["sessions"] == 1

    code, out = _run("dump", "-d", str(data), "--queues", "--sessions", "--retained", "--json")
    dump = json.loads(out)
    assert code == 0
    assert {q["queue"]: q["records"] for q in dump["queues"]} == {"dev/#": 60, "dev/0/t": 20, "dev/1/t": 20,
                                                                  "dev/2/t": 20}
    assert [(r["client_id"], r["subscriptions"]) for r in dump["sessions"]] == [("c1", ["dev/+/t"])]
    assert dump["retained"] == [{"topic": "dev/0/t", "bytes": 4, "qos": 0}]

    log = data / "log"
    sealed = sorted(log.glob("*.idx"))[1]
    raw = bytearray(sealed.read_bytes())
    raw[-1] ^= 0xFF  # the last byte of the queue names: only the body checksum can tell
    sealed.write_bytes(bytes(raw))
    code, out = _run("check", "-d", str(data))
    assert code == 1 and "PROBLEM" in out and sealed.name in out

    code, out = _run("compact", "-d", str(data))
    assert code == 0 and "index files removed" in out
    assert not list(log.glob("*.idx"))
    s = EmbeddedStore(data, segment_bytes=4096)
    await s.open()  # scans every segment and writes the index files again
    assert [m.seq for m in (await s.read("dev/1/t", 0, 100)).messages] == list(range(2, 61, 3))
    await s.close()
    code, out = _run("check", "-d", str(data))
    assert code == 0 and "0 problem(s)" in out

    segment = sorted(log.glob("*.log"))[1]
    raw = bytearray(segment.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # a payload byte of a sealed segment: its record's checksum fails
    segment.write_bytes(bytes(raw))
    code, out = _run("check", "-d", str(data))
    assert code == 1 and f"PROBLEM: {segment.name}: crc mismatch" in out


def test_the_command_line_runs_it(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    done = subprocess.run([sys.executable, "-m", "tidewire", "store", "check", "-d", str(tmp_path / "none")],
                          capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 2 and "no metadata database" in done.stderr
