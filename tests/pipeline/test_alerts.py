"""The rule job: parsing, detection on constructed series, and alerts published once through a real gateway."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import Gateway, GatewayFactory, PahoFactory, write_password_file
from tests.pipeline.conftest import T0, message, write_messages
from tidewire.pipeline.cli import build_parser
from tidewire.pipeline.jobs import alerts
from tidewire.pipeline.jobs.alerts import MqttTarget, Rule, parse_mqtt_url, parse_rule
from tidewire.pipeline.window import RuleError, parse_duration

# Spark local jobs (a JVM per session, seconds per job): `make test-slow`, with the Spark cluster test, keeps
# `make test` under its 10 minutes.
pytestmark = pytest.mark.slow

T0_MS = int(T0.timestamp() * 1000)

# -- parsing -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "rule"), [
    ("temperature > 80 for 1 minute", Rule("temperature", ">", 80.0, timedelta(minutes=1))),
    ("temperature>80 for 60s", Rule("temperature", ">", 80.0, timedelta(minutes=1))),
    ("env.hum <= -2.5e1 for 90s", Rule("env.hum", "<=", -25.0, timedelta(seconds=90))),
    ("  x != 0 FOR 1h30m ", Rule("x", "!=", 0.0, timedelta(minutes=90))),
    ("x == .5 for 500ms", Rule("x", "==", 0.5, timedelta(milliseconds=500))),
    ("x >= 3 for 2 minutes", Rule("x", ">=", 3.0, timedelta(minutes=2))),
    ("x < 3 for 0s", Rule("x", "<", 3.0, timedelta(0))),
])
def test_parse_rule(text: str, rule: Rule) -> None:
    assert parse_rule(text) == rule


def test_same_rule_same_state_file() -> None:
    a, b = parse_rule("temperature > 80 for 1 minute"), parse_rule("temperature>80.0 for 60 s")
    assert a.digest == b.digest and a.canonical == "temperature > 80.0 for 60s"
    assert parse_rule("temperature > 80 for 61s").digest != a.digest


@pytest.mark.parametrize(("text", "says"), [
    ("temperature > 80", "expected '<field> <op> <number> for <duration>'"),
    ("temperature => 80 for 1m", "expected '<field> <op>"),
    ("temperature > hot for 1m", "expected '<field> <op>"),
    ("temperature > 80 for 10", "expected a number and a unit"),
    ("temperature > 80 for 10 fortnights", "unknown duration unit 'fortnights'"),
    ("temperature > 80 for 1m 5", "expected a number and a unit"),
    ("temperature > 80 for 400 days", "longer than 366 days"),
    ("x" * 2000 + " > 1 for 1s", "longer than 1000 characters"),
])
def test_bad_rules(text: str, says: str) -> None:
    with pytest.raises(RuleError) as e:
        parse_rule(text)
    assert says in str(e.value)


def test_parse_duration_and_topic_template() -> None:
    assert parse_duration("2 minutes") == timedelta(minutes=2)
    assert parse_duration("1d2h") == timedelta(days=1, hours=2)
    with pytest.raises(RuleError):
        parse_duration("")
    assert alerts.check_topic_template("alerts/{field}/{client_id}")
    for bad in ("alerts/{device}", "alerts/#", "alerts/{client_id", ""):
        with pytest.raises(RuleError):
            alerts.check_topic_template(bad)
    assert alerts.alert_topic("alerts/{client_id}", "a+b#c", "t") == "alerts/a_b_c"


def test_gateway_url_never_shows_the_password() -> None:
    t = parse_mqtt_url("mqtt://ops:s%40cret@gw.example:1884")
    assert (t.host, t.port, t.username, t.password, t.tls) == ("gw.example", 1884, "ops", "s@cret", False)
    assert "cret" not in t.redacted() and "cret" not in repr(t)
    assert parse_mqtt_url("mqtts://gw.example?ca=/etc/ca.pem") == MqttTarget("gw.example", 8883, None, None, True,
                                                                              "/etc/ca.pem")
    for bad in ("http://u:hunter2@x", "mqtt://u:hunter2@x:notaport", "u:hunter2@x"):
        with pytest.raises(RuleError) as e:
            parse_mqtt_url(bad)
        assert "hunter2" not in str(e.value)


# -- detection -----------------------------------------------------------------------------------------------

def _series(lake: Path, first_position: int, start_s: float, client_id: str, temps: list[float | None],
            step_s: float = 10) -> None:
    """One reading every `step_s`; None: a message without the field (neither breaks nor extends an island)."""
    rows = [message(first_position + i, start_s + i * step_s, client_id, f"dev/{client_id}",
                    {"other": 1.0} if t is None else {"temp": t, "other": 1.0})
            for i, t in enumerate(temps)]
    write_messages(lake, rows, name=f"{client_id}-{first_position}")


def _lake(tmp_path: Path) -> Path:
    lake = tmp_path / "lake"
    _series(lake, 1, 0, "a", [70, 85, 86, None, 90, 88, 70])  # island 10 s .. 50 s (40 s), max 90
    _series(lake, 100, 0, "b", [85, 85, 70, 85, 85, 85, 70])  # islands 0..10 s and 30..50 s (20 s)
    _series(lake, 200, 0, "c", [81, 60, 81, 60, 81])  # never two in a row
    _series(lake, 300, 0, f"{alerts.ALERT_CLIENT_PREFIX}-x", [99] * 10)  # the alert publisher: never evaluated
    return lake


def _found(spark: Any, lake: Path, rule: str) -> list[tuple[Any, ...]]:
    rows = alerts.detect(spark, str(lake), parse_rule(rule)).orderBy("client_id", "start_ms").collect()
    return [(r["client_id"], r["start_ms"] - T0_MS, r["end_ms"] - T0_MS, r["count"], r["min"], r["max"]) for r in rows]


def test_detect_islands(spark: Any, tmp_path: Path) -> None:
    lake = _lake(tmp_path)
    assert _found(spark, lake, "temp > 80 for 20s") == [("a", 10_000, 50_000, 4, 85.0, 90.0),
                                                         ("b", 30_000, 50_000, 3, 85.0, 85.0)]
    assert _found(spark, lake, "temp > 80 for 41s") == []
    assert _found(spark, lake, "temp >= 85 for 0s") == [("a", 10_000, 50_000, 4, 85.0, 90.0),
                                                        ("b", 0, 10_000, 2, 85.0, 85.0),
                                                        ("b", 30_000, 50_000, 3, 85.0, 85.0)]
    assert _found(spark, lake, "temp < 75 for 1m") == []
    assert _found(spark, lake, "missing > 0 for 0s") == []


# -- publishing through a real gateway ------------------------------------------------------------------------

def test_alerts_published_once(spark: Any, tmp_path: Path, gateway: Gateway, paho_factory: PahoFactory) -> None:
    lake = _lake(tmp_path)
    rule = parse_rule("temp > 80 for 20s")
    sub = paho_factory(gateway.port, "watcher")
    sub.connect()
    sub.subscribe("alerts/#", qos=1)
    target = MqttTarget("127.0.0.1", gateway.port)

    first = alerts.run(spark, str(lake), rule, target=target)
    assert first.error is None and (first.found, first.already) == (2, 0)
    got = sorted(sub.expect(2, timeout=5), key=lambda m: m.topic)
    assert [(m.topic, m.qos) for m in got] == [("alerts/a", 1), ("alerts/b", 1)]
    body = json.loads(got[0].payload)["alert"]
    assert (body["client_id"], body["field"], body["count"], body["max"], body["min"]) == ("a", "temp", 4, 90.0, 85.0)
    assert (body["start"], body["end"]) == ("2024-05-01T10:00:10.000Z", "2024-05-01T10:00:50.000Z")
    assert body["rule"] == rule.canonical and body["threshold"] == 80.0
    state = json.loads(alerts.state_path(str(lake), rule).read_text())
    assert sorted(map(tuple, state["published"])) == [("a", T0_MS + 10_000), ("b", T0_MS + 30_000)]

    again = alerts.run(spark, str(lake), rule, target=target)
    assert (again.found, again.published, again.already, again.error) == (0, [], 2, None)
    sub.assert_nothing(0.5)

    # a's island keeps growing (same start: no new alert); c gets a new one
    _series(lake, 400, 70, "a", [95, 96])
    _series(lake, 500, 60, "c", [82, 83, 84])
    third = alerts.run(spark, str(lake), rule, target=target, topic="alerts/{field}/{client_id}")
    assert [a.client_id for a in third.published] == ["c"] and third.error is None
    assert sub.get(timeout=5).topic == "alerts/temp/c"
    sub.assert_nothing(0.3)


def test_credentials_and_refusal(spark: Any, tmp_path: Path, gateway_factory: GatewayFactory,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    pw = write_password_file(tmp_path / "passwd", {"ops": "hunter2"})
    gw = gateway_factory(password_file=pw)
    lake = _lake(tmp_path)
    rule = parse_rule("temp > 80 for 20s")
    wrong = alerts.run(spark, str(lake), rule, target=parse_mqtt_url(f"mqtt://ops:wrong-pw@127.0.0.1:{gw.port}"))
    assert wrong.error is not None and "refused the connection" in wrong.error and "wrong-pw" not in wrong.error
    assert wrong.published == [] and not alerts.state_path(str(lake), rule).exists()

    args = build_parser().parse_args(["run", "alerts", "--lake", str(lake), "--rule", "temp > 80 for 20s",
                                      "--mqtt", f"mqtt://ops:hunter2@127.0.0.1:{gw.port}"])
    assert alerts.main_job(spark, str(lake), args) == 0
    out = capsys.readouterr()
    assert "2 new, 2 published to mqtt://ops:***@127.0.0.1" in out.out
    assert "hunter2" not in out.out + out.err
