"""Smoke runs of every benchmark scenario with tiny parameters against a real broker, and the CLI."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator

import pytest

from loadtest import bench, servers
from loadtest.scenarios import SCENARIOS, Params, Result, percentiles

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def server() -> Iterator[servers.Server]:
    # Mosquitto is the reference; without it the smoke test runs against Tidewire itself.
    name = "mosquitto" if servers.mosquitto_path() else "tidewire"
    with servers.start(name, core=None) as s:
        yield s


def tiny(**kw: float) -> Params:
    p = Params(seconds=0.7, subscribers=20, rate=2_000, publishers=3, pairs=5, connections=100,
               concurrency=4, drain=1.0, open_concurrency=50)
    for k, v in kw.items():
        setattr(p, k, v)
    return p


def check_common(r: Result, scenario: str, server: servers.Server) -> None:
    assert r.scenario == scenario
    assert r.server == server.label
    assert r.rate > 0 and math.isfinite(r.rate)
    assert r.duration_s > 0


@pytest.mark.parametrize("scenario", ["fanin", "pairs", "latency"])
async def test_qos1_scenarios_lose_nothing(scenario: str, server: servers.Server) -> None:
    r = await SCENARIOS[scenario](server, tiny())
    check_common(r, scenario, server)
    assert r.unit == "msgs/s"
    assert r.sent > 0 and r.received >= r.sent
    assert r.lost == 0 and r.dup == 0
    assert r.p50_ms is not None and r.p99_ms is not None and r.p999_ms is not None
    assert 0 < r.p50_ms <= r.p99_ms <= r.p999_ms < 10_000
    assert r.extra["qos"] == 1


async def test_fanout_delivers_to_every_subscriber(server: servers.Server) -> None:
    r = await SCENARIOS["fanout"](server, tiny())
    check_common(r, "fanout", server)
    assert r.extra["subscribers_per_msg"] == 20
    assert r.sent > 0
    assert r.received == r.sent * 20 - r.lost
    assert r.lost <= r.sent * 20 * 0.01  # QoS 0 on loopback at this tiny rate: practically no loss
    assert r.received / 0.7 == pytest.approx(2_000, rel=0.5)


async def test_fanout_max_ramp_is_bounded(server: servers.Server) -> None:
    r = await SCENARIOS["fanout"](server, tiny(rate=math.inf, ramp_start=1_000, step_seconds=0.3,
                                               max_steps=2, drain=0.5))
    check_common(r, "fanout", server)
    assert 1 <= r.extra["max_search_steps"] <= 2
    assert r.extra["sustainable"] in (0.0, 1.0)


async def test_idle_reports_rss_per_connection(server: servers.Server) -> None:
    r = await SCENARIOS["idle"](server, tiny())
    assert r.unit == "KB/conn"
    assert r.extra["connections"] == 100 and r.extra["failed"] == 0
    # A shared server may free memory from earlier tests meanwhile, so only sanity-check the samples.
    assert r.extra["rss_after_kb"] > 0 and r.extra["rss_before_kb"] > 0
    assert r.rate == pytest.approx((r.extra["rss_after_kb"] - r.extra["rss_before_kb"]) / 100)


async def test_connect_loop_counts_handshakes(server: servers.Server) -> None:
    r = await SCENARIOS["connect"](server, tiny())
    check_common(r, "connect", server)
    assert r.unit == "conns/s" and r.sent > 4 and r.extra["errors"] == 0
    assert r.p50_ms is not None and r.p50_ms > 0


async def test_storm_measures_the_stream_during_connects(server: servers.Server) -> None:
    r = await SCENARIOS["storm"](server, tiny())
    assert r.scenario == "storm" and r.lost == 0 and r.received > 0
    assert r.extra["storm_conns_per_s"] > 0 and r.extra["storm_errors"] == 0


def test_percentiles_nearest_rank() -> None:
    assert percentiles([]) == (None, None, None)
    p50, p99, p999 = percentiles([i * 1_000_000 for i in range(1, 1001)])
    assert (p50, p99, p999) == (501.0, 991.0, 1000.0)


def test_cli_json_and_params(capsys: pytest.CaptureFixture[str]) -> None:
    target = "mosquitto" if servers.mosquitto_path() else "tidewire"
    rc = bench.main(["latency", "--target", target, "--seconds", "0.5", "--rate", "500", "--drain", "0.5",
                     "--json", "--no-pin"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["scenario"] == "latency" and out["lost"] == 0 and out["sent"] > 100
    args = bench.build_parser().parse_args(["fanout", "--rate", "max"])
    p = bench.params_for("fanout", args, suite=True)
    assert math.isinf(p.rate or 0) and p.subscribers == 200 and p.seconds == 3


def test_report_format_has_all_fields() -> None:
    r = Result("fanout", "mosquitto", 1234.5, sent=10, received=9, lost=1, p50_ms=0.1, p99_ms=0.2,
               p999_ms=0.3, duration_s=1.0)
    text = bench.format_result(r)
    for label in ("scenario", "server", "delivered", "sent", "received", "lost", "dup", "p99", "duration"):
        assert label in text
    ratio = bench.format_ratio(Result("idle", "tidewire", 2.0, unit="KB/conn"),
                               Result("idle", "mosquitto", 1.0, unit="KB/conn"))
    assert "2.00" in ratio and "lower is better" in ratio
