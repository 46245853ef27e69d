"""Smoke runs of the store-at-scale benchmark with tiny data sets: real store files, real gateways, real CONNACKs."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadtest import store_data, store_scale
from loadtest.store_data import MessageMaker, count_label, parse_count
from tidewire.gateway.core.topics import first_level_queue, matches

pytestmark = pytest.mark.timeout(120)

MESSAGES = 20_000
QUEUES = 5_000
SESSIONS = 3_000


@pytest.fixture(scope="module")
def cfg(tmp_path_factory: pytest.TempPathFactory) -> store_scale.Config:
    return store_scale.Config(root=tmp_path_factory.mktemp("store_scale"), messages=[MESSAGES], queues=QUEUES,
                              sessions=SESSIONS, runs=1, core=None, warmup=False, gateway_timeout=60.0)


@pytest.fixture(scope="module")
def report() -> Iterator[store_scale.Report]:
    yield store_scale.Report()  # shared: the empty gateway is measured once


def values(report: store_scale.Report, prefix: str) -> list[str]:
    return [r.value for r in report.rows if r.case.startswith(prefix)]


def test_counts_parse_and_print() -> None:
    assert [parse_count(t) for t in ("20k", "5M", "1.5M", "1000", "50m")] == [
        20_000, 5_000_000, 1_500_000, 1000, 50_000_000]
    assert [count_label(n) for n in (20_000, 5_000_000, 1234)] == ["20k", "5M", "1234"]
    for bad in ("0", "-3", "1.5", "x"):
        with pytest.raises(ValueError):
            parse_count(bad)
    cases, cfg, _ = store_scale.parse_args(["all", "--messages", "5M,50M", "--sessions", "10M", "--no-pin"])
    assert cases == ["restart", "queues", "sessions"]
    assert cfg.messages == [5_000_000, 50_000_000] and cfg.sessions == 10_000_000 and cfg.core is None


def test_messages_are_indexed_as_the_gateway_indexes_them() -> None:
    batch = MessageMaker(1000).batch(0, 2000, 1_700_000_000_000)
    assert len({m.topic for m in batch}) == 1000
    for m in batch:
        assert m.qos == 1 and 50 <= len(m.payload) <= 80
        json.loads(m.payload)
        assert m.queues[:2] == (m.topic, first_level_queue(m.topic))
        wildcards = m.queues[2:]
        assert all(matches(w, m.topic) for w in wildcards)
    assert sum(1 for m in batch[:1000] if len(m.queues) == 3) == 1000 // store_data.WILDCARD_EVERY


def test_restart(cfg: store_scale.Config, report: store_scale.Report) -> None:
    store_scale.run_restart(cfg, report)
    assert report.empty is not None and report.empty["ready_s"] > 0 and report.empty["rss_kb"] > 10_000
    raw = report.raw[f"restart-{MESSAGES}"]
    (opened,) = raw["opens"]
    assert opened["read_ok"] and opened["first_read"] == 10
    assert opened["newest_seq"] == MESSAGES  # every message appended is there after the restart
    assert opened["last_seq"] >= MESSAGES
    assert 0 < opened["open_s"] < 30
    (gw,) = raw["gateways"]
    assert 0 < gw["ready_s"] < 60 and gw["rss_kb"] > 10_000 and gw["hwm_kb"] >= gw["rss_kb"]
    build = report.raw["builds"][f"log-{MESSAGES}-t1000"]
    assert MESSAGES * 100 < build["bytes"] < MESSAGES * 400 and build["append_s"] > 0
    assert len(values(report, f"restart {count_label(MESSAGES)} msgs")) >= 5


def test_a_built_data_set_is_reused(cfg: store_scale.Config) -> None:
    dataset = store_data.data_set_dir(cfg.root, "log", MESSAGES, 1000)
    first = json.loads((dataset / "build.json").read_text())
    again = store_data.ensure(dataset, "log", MESSAGES, 1000)
    assert again["cached"] and again["built_at"] == first["built_at"]
    # a data set written by other store code is built anew
    (dataset / "build.json").write_text(json.dumps(dict(first, fingerprint="other")))
    assert store_data.cached_build(dataset) is None
    assert store_data.cached_build(dataset, reuse_stale=True) is not None
    (dataset / "build.json").write_text(json.dumps(first))


def test_queues(cfg: store_scale.Config, report: store_scale.Report) -> None:
    store_scale.run_queues(cfg, report)
    raw = report.raw[f"queues-{QUEUES}"]
    (opened,) = raw["opens"]
    assert opened["read_ok"] and opened["first_read"] == 1 and opened["newest_seq"] == QUEUES
    (gw,) = raw["gateways"]
    assert gw["ready_s"] > 0 and gw["rss_kb"] > 10_000
    assert report.raw["builds"][f"log-{QUEUES}-t{QUEUES}"]["builder_rss_kb"] > 10_000
    assert values(report, f"queues {count_label(QUEUES)} (1 msg per topic): gateway RSS at CONNACK")


def test_sessions(cfg: store_scale.Config, report: store_scale.Report) -> None:
    store_scale.run_sessions(cfg, report)
    raw = report.raw[f"sessions-{SESSIONS}"]
    (opened,) = raw["opens"]
    assert opened["session_ok"]
    stats = opened.get("stats", {})
    if "sessions" in stats:
        assert stats["sessions"] == SESSIONS
    (gw,) = raw["gateways"]
    assert gw["ready_s"] > 0 and gw["rss_kb"] > 10_000
    build = report.raw["builds"][f"sessions-{SESSIONS}"]
    assert build["put_s"] > 0 and build["bytes"] > SESSIONS * 20
    assert values(report, "10M sessions (extrapolated")  # below 10M the 10M figures are extrapolated
    assert "| case | value | aim |" in store_scale.table(report.rows)


def test_cached_sessions_expire_from_the_cache(cfg: store_scale.Config, tmp_path: Path) -> None:
    dataset = tmp_path / "sessions-1"
    dataset.mkdir()
    info = {"kind": "sessions", "fingerprint": store_data.store_fingerprint(), "built_at": 0}
    (dataset / "build.json").write_text(json.dumps(info))
    assert store_data.cached_build(dataset) is None  # the gateway would expire them at start
