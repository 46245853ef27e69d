"""Compaction of closed hours: few files of the target size, every row once through `pipeline.lake.reading`, at
every step a crash can stop it, for a reader that listed before it committed, and for one reading while it
runs."""

from __future__ import annotations

import json
import os
import threading
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.pipeline.lake.support import H, record
from tidewire.pipeline.lake import compaction, reading
from tidewire.pipeline.lake.compact_command import main as compact_main
from tidewire.pipeline.lake.rows import events_table, messages_table
from tidewire.pipeline.lake.writer import MessagesWriter, hour_dir, write_split

HOUR0 = 1_700_000_000_000 // H * H  # the synthetic lake's first hour (2023-11-14 22:00 UTC)
NOW_S = (HOUR0 + 10 * H) / 1000  # the clock passed in: every hour of the lake closed long ago
PARTITIONS, HOURS, FLUSHES = 3, 2, 12  # flushes per partition per hour


def build_lake(lake: Path) -> int:
    """FLUSHES small files per partition per hour (the bridge's writer) and 4 events files per hour; returns the
    number of messages (positions 1..n in each partition, partition p's position = n * 10 + p)."""
    n = 0
    for p in range(PARTITIONS):
        w = MessagesWriter(lake, p)
        w.recover()
        seq = 0
        for h in range(HOURS):
            for f in range(FLUSHES):
                recs = [record((seq + i + 1) * 10 + p, partition=p, received_ms=HOUR0 + h * H + f * 1000 + i,
                               payload=b'{"t": %d}' % i) for i in range(5)]
                seq += 5
                w.flush(messages_table(recs), recs[-1].position)
        n += seq
    for h in range(HOURS):
        for k in range(4):
            rows = [("delivered", HOUR0 + h * H + k * 1000 + i, f"c{i}", "mqtt", "t", i, 1, False, None, None,
                     None, None) for i in range(3)]
            write_split(events_table(rows, "n1"), lake / "events", "time", lambda _h, _t, k=k: f"n1-{k}-3")
    return n


def positions(lake: Path) -> Counter[int]:
    return Counter(reading.dataset(lake, "messages").to_table(columns=["position"]).column("position").to_pylist())


def files_per_hour_partition(lake: Path) -> dict[tuple[str, str], int]:
    out: Counter[tuple[str, str]] = Counter()
    for f in reading.committed_files(lake, "messages"):
        out[(f.parent.name, compaction._group_key("messages", f.name))] += 1
    return dict(out)


def run(lake: Path, grace_s: float = 3600, now_s: float = NOW_S, target: int = 1 << 30) -> compaction.CompactStats:
    return compaction.compact_lake(lake, older_than_ms=0, target_bytes=target, grace_ms=int(grace_s * 1000),
                                   clock=lambda: now_s)


@pytest.mark.slow  # seconds: 76 Parquet files written, compacted and read back three times
def test_closed_hours_become_target_sized_files_and_every_row_stays_once(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    n = build_lake(lake)
    before = files_per_hour_partition(lake)
    assert set(before.values()) == {FLUSHES}
    stats = run(lake)
    assert stats.outputs == PARTITIONS * HOURS + HOURS and stats.inputs == PARTITIONS * HOURS * FLUSHES + 4 * HOURS
    assert set(files_per_hour_partition(lake).values()) == {1}
    got = positions(lake)
    assert len(got) == n and set(got.values()) == {1}
    assert len(reading.dataset(lake, "events").to_table()) == HOURS * 4 * 3
    # The replaced files wait out the grace period (a reader that listed them may still read them) ...
    assert len(list((lake / "messages").rglob("*.parquet"))) == PARTITIONS * HOURS * (FLUSHES + 1)
    assert run(lake, now_s=NOW_S + 1800).deleted == 0
    # ... and go after it; then even a plain directory read (no manifest) sees every row once.
    assert run(lake, now_s=NOW_S + 3601).deleted == PARTITIONS * HOURS * FLUSHES + 4 * HOURS
    plain = pq.ParquetDataset(lake / "messages").read(columns=["position"]).column("position").to_pylist()
    assert sorted(plain) == sorted(got)
    run(lake, now_s=NOW_S + 7300)
    assert not list(lake.rglob(reading.MANIFEST))  # entries forgotten a grace period after the deletion


def test_a_target_smaller_than_an_hour_gives_files_bounded_by_size(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    n = build_lake(lake)
    one = max(f.stat().st_size for f in reading.committed_files(lake, "messages"))
    run(lake, target=one * 4)
    counts = files_per_hour_partition(lake)
    assert all(2 <= c <= FLUSHES // 2 for c in counts.values()), counts
    assert len(positions(lake)) == n
    stats = run(lake, target=one * 4)
    assert stats.outputs == 0  # a second pass finds nothing more to pack


def test_open_and_recent_hours_are_left_alone(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    build_lake(lake)
    # The second hour ended at HOUR0 + 2H: with older_than 1h at HOUR0 + 2.5H only the first is compacted.
    stats = compaction.compact_lake(lake, older_than_ms=H, target_bytes=1 << 30, grace_ms=0,
                                    clock=lambda: (HOUR0 + 2.5 * H) / 1000, tables=("messages",))
    assert stats.hours == 1 and stats.outputs == PARTITIONS


@pytest.mark.slow  # a lake built and compacted once per step
@pytest.mark.parametrize("crash_after", ["rewrite", "manifest", "rename"])
def test_a_crash_at_each_step_loses_and_doubles_nothing(tmp_path: Path, crash_after: str) -> None:
    """Each step of `compact_hour` done by hand, the rest left undone (a kill -9 there): readers see every row
    once at that moment, and the next pass finishes or undoes it."""
    lake = tmp_path / "lake"
    n = build_lake(lake)
    hour = lake / "messages" / hour_dir(HOUR0 // H)
    group = compaction.plan_hour(hour, "messages", 1 << 30)[0]
    name = compaction.output_name("messages", group, 1, 0)
    tmp = hour / ("." + name + ".tmp")
    compaction.rewrite(group, tmp)
    if crash_after in ("manifest", "rename"):
        path = hour / reading.MANIFEST
        path.write_text(json.dumps({"entries": [reading.Entry(name, [p.name for p in group], 1).to_json()]}))
    if crash_after == "rename":
        os.replace(tmp, hour / name)
    got = positions(lake)
    assert len(got) == n and set(got.values()) == {1}
    stats = run(lake, grace_s=0)
    assert stats.rolled_forward == (1 if crash_after == "manifest" else 0)
    run(lake, grace_s=0, now_s=NOW_S + 1)
    got = positions(lake)
    assert len(got) == n and set(got.values()) == {1}
    assert not [p for p in lake.rglob("*.tmp")]
    assert set(files_per_hour_partition(lake).values()) == {1}


def test_a_reader_that_listed_before_the_commit_reads_every_row_once(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    n = build_lake(lake)
    listed = reading.committed_files(lake, "messages")
    run(lake)
    old = pq.ParquetDataset([str(p) for p in listed]).read(columns=["position"]).column("position")
    assert len(old) == n and len(set(old.to_pylist())) == n  # its files are still there (the grace period)


@pytest.mark.slow  # readers in threads for the whole compaction
def test_readers_during_compaction_see_every_row_once(tmp_path: Path) -> None:
    """Readers list and read in a loop while compaction passes run and the writer adds late files to the closed
    hours between passes (each pass rewrites the last one's outputs with them): every read has every row once."""
    lake = tmp_path / "lake"
    n = build_lake(lake)
    base = set(positions(lake))
    bad: list[str] = []
    reads = 0
    done = threading.Event()

    def reader() -> None:
        nonlocal reads
        while not done.is_set():
            got = positions(lake)
            reads += 1
            if not base <= set(got) or set(got.values()) != {1}:
                bad.append(f"{len(base - set(got))} missing, {sum(got.values()) - len(got)} twice")

    t = threading.Thread(target=reader)
    t.start()
    try:
        w = MessagesWriter(lake, 0)
        w.recover()
        for r in range(4):
            recs = [record(1_000_000 + r * 10 + i, received_ms=HOUR0 + 100_000 + i) for i in range(3)]
            w.flush(messages_table(recs), recs[-1].position)
            run(lake, target=1 << 14 if r == 0 else 1 << 30)
    finally:
        done.set()
        t.join()
    assert reads > 0 and bad == []
    assert len(positions(lake)) == n + 12


def test_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lake = tmp_path / "lake"
    n = build_lake(lake)
    assert compact_main(["--lake", str(lake), "--older-than", "1h", "--log-level", "WARNING"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["outputs"] == PARTITIONS * HOURS + HOURS and len(positions(lake)) == n
    with compaction.compaction_lock(lake) as held:
        assert held
        assert compact_main(["--lake", str(lake), "--log-level", "WARNING"]) == 3  # another compactor runs
    assert compact_main(["--lake", str(tmp_path / "none")]) == 2


def test_duckdb_reads_the_committed_files_once(tmp_path: Path) -> None:
    """DuckDB is not a dependency: the test runs where it is installed."""
    duckdb = pytest.importorskip("duckdb")
    lake = tmp_path / "lake"
    n = build_lake(lake)
    run(lake)  # the replaced files stay for the grace period: a glob of the directory would count them twice
    files = [str(p) for p in reading.committed_files(lake, "messages")]
    got = duckdb.sql(f"select count(*), count(distinct position) from read_parquet({files}, hive_partitioning=true)")
    assert got.fetchall() == [(n, n)]


def test_files_written_before_and_after_a_column_was_added_keep_every_column(tmp_path: Path) -> None:
    """An hour holding events files from before `consumer_group` existed and after: the compacted file has the
    column, null for the old rows, whichever file comes first."""
    old, new = tmp_path / "1.parquet", tmp_path / "2.parquet"
    pq.write_table(pa.table({"seq": [1, 2]}), old)
    pq.write_table(pa.table({"seq": [3], "consumer_group": ["q"]}), new)
    for order in ([old, new], [new, old]):
        out = tmp_path / "out.tmp"
        assert compaction.rewrite(order, out) == 3
        rows = {r["seq"]: r["consumer_group"] for r in pq.read_table(out).to_pylist()}
        assert rows == {1: None, 2: None, 3: "q"}
