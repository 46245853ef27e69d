"""The aggregates stream and the batch reports against synthetic lakes with known numbers."""

from __future__ import annotations

import datetime as dt
import random
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import functions as F

from tests.pipeline.conftest import T0, event, message, write_events, write_messages
from tidewire.pipeline.jobs import aggregates, reports
from tidewire.pipeline.spark import read_events, read_messages

# Spark local jobs (a JVM per session, seconds per job): `make test-slow`, with the Spark cluster test, keeps
# `make test` under its 10 minutes.
pytestmark = pytest.mark.slow

T0_MS = int(T0.timestamp() * 1000)


# -- aggregates ----------------------------------------------------------------------------------------------

def _telemetry(first_position: int, n: int, seed: int) -> list[dict[str, Any]]:
    """n messages from 3 devices on 2 topics over ~4 minutes, some crossing midnight into the next day; numbers
    in nested fields, some messages not JSON, some JSON without numbers."""
    rnd = random.Random(seed)
    rows = []
    for i in range(n):
        pos = first_position + i
        seconds = rnd.uniform(0, 240) if i % 10 else 14 * 3600 - 30 + rnd.uniform(0, 60)  # 23:59:30 .. 00:00:30
        kind = i % 7
        numbers: dict[str, float] | None = {"temp": round(rnd.uniform(-20, 90), 3),
                                            "env.hum": float(rnd.randint(0, 100))}
        if kind == 0:
            numbers = None
        elif kind == 1:
            numbers = {}
        elif kind == 2:
            numbers = {"temp": round(rnd.uniform(-20, 90), 3)}
        rows.append(message(pos, seconds, f"dev{i % 3}", f"site/{i % 2}/telemetry", numbers, size=rnd.randint(1, 300)))
    return rows


def _expected(rows: list[dict[str, Any]], key: str) -> dict[tuple[str, int], dict[str, Any]]:
    out: dict[tuple[str, int], dict[str, Any]] = {}
    values: dict[tuple[str, int], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        minute = int(r["received_at"].timestamp()) // 60 * 60_000
        k = (r[key], minute)
        agg = out.setdefault(k, {"messages": 0, "bytes": 0})
        agg["messages"] += 1
        agg["bytes"] += r["payload_size"]
        for f, v in r["json_numbers"] or []:
            values[k][f].append(v)
    for k, agg in out.items():
        agg["fields"] = {f: (len(vs), min(vs), max(vs), sum(vs) / len(vs)) for f, vs in values[k].items()}
    return out


def _actual(spark: Any, lake: Path, by: aggregates.By) -> dict[tuple[str, int], dict[str, Any]]:
    df = aggregates.minute_aggregates(spark, str(lake), by)
    key = aggregates.KEYS[by]
    out = {}
    for r in df.select(key, F.unix_millis("minute").alias("ms"), "dt", "messages", "bytes", "fields").collect():
        assert str(r["dt"]) == str(aggregates_dt(r["ms"]))
        out[(r[key], r["ms"])] = {"messages": r["messages"], "bytes": r["bytes"],
                                  "fields": {f: (s["count"], s["min"], s["max"], s["avg"])
                                             for f, s in r["fields"].items()}}
    return out


def aggregates_dt(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).date().isoformat()


Aggregates = dict[tuple[str, int], dict[str, Any]]


def _assert_same(actual: Aggregates, expected: Aggregates) -> None:
    assert actual.keys() == expected.keys()
    for k, want in expected.items():
        got = actual[k]
        assert (got["messages"], got["bytes"]) == (want["messages"], want["bytes"]), k
        assert got["fields"].keys() == want["fields"].keys(), k
        for f, (count, lo, hi, avg) in want["fields"].items():
            g = got["fields"][f]
            assert (g[0], g[1], g[2]) == (count, lo, hi), (k, f)
            assert g[3] == pytest.approx(avg, rel=1e-12), (k, f)


def test_aggregates_exact_across_runs_and_replays(spark: Any, tmp_path: Path) -> None:
    # Folding off: the replay below is made by deleting a commit the stream wrote, which a fold (only ever of
    # committed batches) would already have folded; a real crash before the commit never gets that far.
    lake = tmp_path / "lake"
    nofold = aggregates.Folding(days=0)
    rows = _telemetry(1, 400, seed=1)
    write_messages(lake, rows[:150], name="0-a")
    write_messages(lake, rows[150:200], name="0-b")
    first = aggregates.run(spark, str(lake), folding=nofold)
    assert (first.rows, first.batches) == (200, 1)
    # the newest minute is there at once (no watermark holding it back)
    by: aggregates.By
    for by in ("device", "topic"):
        _assert_same(_actual(spark, lake, by), _expected(rows[:200], aggregates.KEYS[by]))

    # more files, some for minutes already aggregated (late data), one micro-batch per file
    files = write_messages(lake, rows[200:300], name="0-c") + write_messages(lake, rows[300:], name="0-d")
    assert len(files) == 6  # a file per dt/hour: 10:00, 23:00, 00:00 (next day) per write
    second = aggregates.run(spark, str(lake), max_files=3, folding=nofold)
    assert (second.rows, second.batches) == (200, 2)
    for by in ("device", "topic"):
        _assert_same(_actual(spark, lake, by), _expected(rows, aggregates.KEYS[by]))

    # a crash after the last batch wrote its partials but before its commit: Spark re-runs it under the same id
    checkpoint = lake / "_spark" / "checkpoints" / "aggregates"
    last = second.batch_ids[-1]
    (checkpoint / "commits" / str(last)).unlink()
    (checkpoint / "commits" / f".{last}.crc").unlink(missing_ok=True)
    replay = aggregates.run(spark, str(lake), folding=nofold)
    assert replay.batch_ids == [last] and replay.rows > 0
    nothing = aggregates.run(spark, str(lake), folding=nofold)
    assert nothing.rows == 0
    for by in ("device", "topic"):
        _assert_same(_actual(spark, lake, by), _expected(rows, aggregates.KEYS[by]))
    days = sorted(p.name for p in (lake / "aggregates" / "device_minute").iterdir() if p.name.startswith("dt="))
    assert days == ["dt=2024-05-01", "dt=2024-05-02"]


def test_empty_lake_reads_empty(spark: Any, tmp_path: Path) -> None:
    lake = str(tmp_path / "nothing")
    unfinished = tmp_path / "nothing" / "messages" / "dt=2024-05-01" / "hour=10" / ".0-1-9.parquet"
    unfinished.parent.mkdir(parents=True)
    unfinished.write_bytes(b"PAR1 not yet complete")  # a file the bridge is still writing: never read
    assert read_messages(spark, lake).count() == 0
    assert read_events(spark, lake).count() == 0
    assert aggregates.minute_aggregates(spark, lake, "topic").count() == 0
    assert reports.online(spark, lake).count() == 0


# -- reports -------------------------------------------------------------------------------------------------

def _report_lake(lake: Path) -> None:
    msgs, evs = [], []
    # topic r/a: 100 messages from p1, first delivery after i ms, ack after 2i ms; 10 resends; 5 drops
    for i in range(1, 101):
        msgs.append(message(i, i, "p1", "r/a", {"v": i}, size=10))
        evs.append(event("delivered", i + i / 1000, "s1", "r/a", i))
        evs.append(event("acked", i + 2 * i / 1000, "s1", "r/a", i))
        if i <= 10:
            evs.append(event("delivered", i + 5, "s1", "r/a", i, dup=True))  # a resend: not a first delivery
            evs.append(event("acked", i + 6, "s1", "r/a", i))  # a later ack: not the first
    for i in range(101, 106):
        evs.append(event("dropped", i, "s2", "r/a", i, reason="expired"))
    # topic r/b: 10 messages from p2 (500 bytes each) delivered after 1 s, acked after 1.5 s
    for i in range(201, 211):
        msgs.append(message(i, i - 100, "p2", "r/b", None, size=500))
        evs.append(event("delivered", i - 100 + 1.0, "s1", "r/b", i))
        evs.append(event("acked", i - 100 + 1.5, "s1", "r/b", i))
    for i in range(301, 306):
        msgs.append(message(i, i - 200, "p3", "r/c", None, size=1))
    evs.append(event("delivered", 50, "s1", "r/a", 999_999))  # a position not in the lake: ignored
    # sessions (minute = 60 s from T0): expected online per minute [2, 2, 3, 2, 2, 1]
    evs += [event("connected", 0, "d1"), event("disconnected", 150, "d1", reason="normal"),
            event("connected", 70, "d2"),  # never disconnects: online until the last event (300 s)
            event("disconnected", 30, "d3", reason="keepalive"),  # connected before the lake began
            event("connected", 130, "d5"), event("disconnected", 140, "d5", reason="normal"),
            event("connected", 200, "d4"), event("connected", 205, "d4"),  # taken over by a new connection
            event("disconnected", 206, "d4", reason="session taken over"),
            event("disconnected", 250, "d4", reason="normal"),
            event("subscribed", 300, "d2", "x/#")]
    write_messages(lake, msgs)
    write_events(lake, evs[: len(evs) // 2], name="n1-0-0")
    write_events(lake, evs[len(evs) // 2:], name="n2-0-0")


def test_reports(spark: Any, tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    _report_lake(lake)
    out = reports.run(spark, str(lake), top=1)
    for name in reports.NAMES:
        assert (lake / "reports" / name).is_dir()

    lat = {r["topic"]: r for r in out["latency"].collect()}
    assert set(lat) == {"r/a", "r/b"}
    a, b = lat["r/a"], lat["r/b"]
    # nearest-rank percentiles of 1..100 ms: p50 = 50, p99 = 99 (numpy's interpolated 50.5 and 99.01 within 1)
    assert (a["delivered"], a["delivery_p50_ms"], a["delivery_p99_ms"], a["delivery_max_ms"]) == (100, 50, 99, 100)
    assert (a["acked"], a["ack_p50_ms"], a["ack_p99_ms"], a["ack_max_ms"]) == (100, 100, 198, 200)
    assert (b["delivered"], b["delivery_p50_ms"], b["delivery_p99_ms"]) == (10, 1000, 1000)
    assert (b["acked"], b["ack_p50_ms"], b["ack_max_ms"]) == (10, 1500, 1500)

    online = [(r["minute"], r["online"]) for r in
              out["online"].select(F.unix_millis("minute").alias("minute"), "online").orderBy("minute").collect()]
    assert online == [(T0_MS + m * 60_000, n) for m, n in enumerate([2, 2, 3, 2, 2, 1])]

    top = [(r["client_id"], r["messages"], r["bytes"], r["messages_rank"], r["bytes_rank"])
           for r in out["top_talkers"].collect()]
    assert top == [("p1", 100, 1000, 1, 2), ("p2", 10, 5000, 2, 1)]

    rates = {r["topic"]: r for r in out["rates"].collect()}
    assert set(rates) == {"r/a", "r/b", "#"}
    ra, rb, total = rates["r/a"], rates["r/b"], rates["#"]
    assert (ra["delivered"], ra["first_deliveries"], ra["retries"], ra["dropped"]) == (111, 101, 10, 5)
    assert ra["drop_rate"] == 5 / 106 and ra["retry_rate"] == 10 / 111
    assert (rb["drop_rate"], rb["retry_rate"]) == (0.0, 0.0)
    assert (total["delivered"], total["dropped"]) == (121, 5)
    assert total["drop_rate"] == 5 / 116 and total["retry_rate"] == 10 / 121
