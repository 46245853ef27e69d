"""Incremental reports and alerts: a window's partitions only (a day outside it is unreadable, and never read),
exact counts for the window, the checkpoint a run without --since continues from, and islands across windows
alerted once."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.pipeline.conftest import T0, event, message, write_events, write_messages
from tidewire.pipeline import window
from tidewire.pipeline.cli import build_parser
from tidewire.pipeline.jobs import alerts, reports
from tidewire.pipeline.jobs.alerts import parse_rule
from tidewire.pipeline.window import TimeWindow

pytestmark = pytest.mark.slow

DAY_S = 86_400
T0_MS = int(T0.timestamp() * 1000)
D1 = T0_MS + 14 * 3_600_000  # 2024-05-02T00:00Z: the window is day 1
D2 = D1 + DAY_S * 1000


def _lake(tmp_path: Path) -> Path:
    lake = tmp_path / "lake"
    base = 14 * 3600  # seconds from T0 to day 1
    msgs, evs = [], []
    for i in range(30):  # day 0 (before the window) and day 2 (after): 30 messages each from "old"/"new"
        msgs.append(message(1 + i, 60 * i, "old", "t/a", {"temp": 90}))
        msgs.append(message(1000 + i, base + DAY_S + 60 * i, "new", "t/a", {"temp": 90}))
    for i in range(10):  # day 1: 10 messages from "mid", delivered after 100 ms
        msgs.append(message(100 + i, base + 3600 + i, "mid", "t/b", {"temp": 10}, size=7))
        evs.append(event("delivered", base + 3600 + i + 0.1, "s", "t/b", 100 + i))
    # a message received just before the window, delivered 300 ms later inside it: latency reads back
    msgs.append(message(99, base - 0.2, "early", "t/b", None))
    evs.append(event("delivered", base + 0.1, "s", "t/b", 99))
    # alert series: "edge" holds from 30 s before the window's end into day 2; "long" holds all of day 1
    msgs += [message(200, base + DAY_S - 2400, "edge", "s", {"temp": 10}),
             message(201, base + DAY_S - 30, "edge", "s", {"temp": 95}),
             message(202, base + DAY_S + 60, "edge", "s", {"temp": 96})]
    msgs += [message(300 + h, base + h * 3600, "long", "s", {"temp": 99}) for h in range(30)]
    msgs.append(message(299, base - 600, "long", "s", {"temp": 10}))
    write_messages(lake, msgs)
    write_events(lake, evs)
    return lake


def test_reports_read_only_the_window(spark: Any, tmp_path: Path) -> None:
    lake = _lake(tmp_path)
    # day 0's hour 10 unreadable: a job that reads it fails (hour 23 is read: latency looks back an hour)
    bad = list((lake / "messages" / "dt=2024-05-01" / "hour=10").glob("*.parquet"))
    assert bad
    for f in bad:
        f.write_bytes(b"PAR1 not parquet")
    w = TimeWindow(D1, D2)
    out = reports.run(spark, str(lake), w=w)
    top = {r["client_id"]: (r["messages"], r["bytes"]) for r in out["top_talkers"].collect()}
    assert top == {"mid": (10, 70), "long": (24, 240), "edge": (2, 20)}
    lat = {r["topic"]: r for r in out["latency"].collect()}
    assert lat["t/b"]["delivered"] == 11 and lat["t/b"]["delivery_max_ms"] == 300  # the early one, read back


def test_checkpoint_continues_and_islands_across_windows_alert_once(spark: Any, tmp_path: Path) -> None:
    lake = _lake(tmp_path)
    parser = build_parser()
    args = parser.parse_args(["run", "reports", "--lake", str(lake), "--since", "2024-05-02T00:00:00Z",
                              "--until", "2024-05-03T00:00:00Z", "--only", "top_talkers", "--rows", "1"])
    assert reports.main_job(spark, str(lake), args) == 0
    assert window.last_until(window.checkpoint_path(str(lake), "reports")) == D2
    before = int(time.time() * 1000)
    nxt = window.resolve(str(lake), "reports", None, None, before)
    assert nxt == TimeWindow(D2, before)  # the next run without --since starts where this one stopped

    rule = parse_rule("temp > 80 for 1 minute")
    first = alerts.new_alerts(spark, str(lake), rule, [], 100, TimeWindow(D1, D2))
    assert [(a.client_id, a.start_ms - D1) for a in first] == [("long", 0)]  # "edge" lasted 30 s so far
    published = {a.key for a in first}
    second = alerts.new_alerts(spark, str(lake), rule, published, 100, TimeWindow(D2, D2 + DAY_S * 1000))
    # "edge" seen whole (its start is 30 s before the window); "long" still holds: not alerted again
    assert [(a.client_id, a.start_ms - D2, a.count) for a in second] == [("edge", -30_000, 2)]
