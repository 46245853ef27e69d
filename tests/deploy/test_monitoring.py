"""deploy/prometheus and deploy/grafana: promtool accepts the config and rules, every query is valid PromQL, and
every metric a dashboard panel, an alert or the HPA names is one the contract says the nodes expose."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.deploy import (
    ADMIN_PORT,
    DASHBOARD,
    DEPLOY,
    GATEWAY_SERVICES,
    HISTOGRAMS,
    KUBERNETES,
    PROMETHEUS,
    RULES,
    dashboard,
    dashboard_exprs,
    dashboard_panels,
    grafana_to_promql,
    known_metric,
    load_yaml_docs,
    promql_metric_names,
    rule_exprs,
)

PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
needs_promtool = pytest.mark.skipif(not Path(PROMTOOL).exists(), reason="promtool is not installed")


# -- the PromQL name extraction the other checks rely on --------------------------------------------------

@pytest.mark.parametrize(("expr", "names"), [
    ('sum by (protocol) (rate(tidewire_messages_received_total{instance=~"$instance"}[$__rate_interval]))',
     {"tidewire_messages_received_total"}),
    ("histogram_quantile(0.99, sum by (le) (rate(tidewire_store_append_seconds_bucket[5m])))",
     {"tidewire_store_append_seconds_bucket"}),
    ("a_total / (a_total + b_total > 0) * 1e9 offset 5m", {"a_total", "b_total"}),
    ('sum(up{job="x"} == 1) without (instance) and on(pod) group_left(node) foo', {"up", "foo"}),
    ('count(x{reason="sum(by)"}) unless bool y', {"x", "y"}),
])
def test_promql_metric_names(expr: str, names: set[str]) -> None:
    assert promql_metric_names(expr) == names


def test_known_metric() -> None:
    assert known_metric("tidewire_connections")
    assert known_metric("tidewire_store_fsync_seconds_bucket")
    assert not known_metric("tidewire_store_fsync_seconds")  # a histogram is queried through its series
    assert not known_metric("tidewire_connection")
    assert not known_metric("tidewire_deliveries")


# -- Prometheus ---------------------------------------------------------------------------------------------

@needs_promtool
def test_promtool_checks_config_and_rules() -> None:
    out = subprocess.run([PROMTOOL, "check", "config", str(PROMETHEUS)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "rules found" in out.stdout + out.stderr  # the rule file was found and checked too


def test_prometheus_scrapes_the_three_nodes_admin_port() -> None:
    config = yaml.safe_load(PROMETHEUS.read_text())
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "tidewire"]
    assert job.get("metrics_path", "/metrics") == "/metrics"
    assert job.get("scheme", "http") == "http"
    targets = [t for sc in job["static_configs"] for t in sc["targets"]]
    assert sorted(targets) == [f"{name}:{ADMIN_PORT}" for name in GATEWAY_SERVICES]
    # the rule files the config names are the ones shipped next to it (compose mounts the directory)
    for rule_file in config["rule_files"]:
        assert (PROMETHEUS.parent / rule_file).resolve() == RULES.resolve()


def test_alert_rules_use_known_metrics() -> None:
    rules = rule_exprs()
    assert {name for name, _ in rules} >= {"TidewireNodeDown", "TidewireMessagesDropped"}
    for name, expr in rules:
        names = promql_metric_names(expr)
        assert names, name
        assert all(known_metric(n) for n in names), (name, names)


# -- Grafana ------------------------------------------------------------------------------------------------

def test_dashboard_structure() -> None:
    dash = dashboard()
    assert dash["uid"] == "tidewire" and dash["title"]
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert "tidewire_info" in variables["instance"]["definition"]
    panels = dashboard_panels()
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for p in panels:
        grid = p["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, p["title"]
        if p["type"] != "row":
            assert p["targets"], p["title"]
            assert p["datasource"]["uid"] == "${datasource}", p["title"]
            assert all(t["refId"] and t["expr"].strip() for t in p["targets"]), p["title"]


def test_dashboard_queries_use_only_known_metrics() -> None:
    used: set[str] = set()
    for title, expr in dashboard_exprs():
        names = promql_metric_names(expr)
        assert names, (title, expr)
        unknown = {n for n in names if not known_metric(n)}
        assert not unknown, f"{title!r} queries {sorted(unknown)}, not in the contract's metric list"
        used |= names
    # the brief's panel list: connections, rates per protocol, deliveries, drops, in-flight, store latencies,
    # notify, cache hit ratio, cluster members, auth failures
    for name in ("tidewire_connections", "tidewire_messages_received_total", "tidewire_messages_sent_total",
                 "tidewire_deliveries_total", "tidewire_dropped_total", "tidewire_inflight",
                 "tidewire_notify_events_total", "tidewire_cache_hits_total", "tidewire_cache_misses_total",
                 "tidewire_cluster_members", "tidewire_auth_total"):
        assert name in used, name
    for histogram in HISTOGRAMS:
        quantiles = [e for _, e in dashboard_exprs() if f"{histogram}_bucket" in e]
        assert any("histogram_quantile(0.5," in e for e in quantiles), histogram
        assert any("histogram_quantile(0.99," in e for e in quantiles), histogram


@needs_promtool
def test_every_query_is_valid_promql(tmp_path: Path) -> None:
    """promtool parses each dashboard query (variables substituted) as a recording rule."""
    rules = [{"record": f"tidewire:dashboard_query:{i}", "expr": grafana_to_promql(expr)}
             for i, (_, expr) in enumerate(dashboard_exprs())]
    path = tmp_path / "dashboard-rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    out = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"{len(rules)} rules found" in out.stdout


def test_grafana_provisioning_matches_compose() -> None:
    (datasources,) = load_yaml_docs(DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml")
    (source,) = datasources["datasources"]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    (providers,) = load_yaml_docs(DEPLOY / "grafana" / "provisioning" / "dashboards" / "tidewire.yml")
    (provider,) = providers["providers"]
    (compose,) = load_yaml_docs(DEPLOY / "compose.yaml")
    mounts = dict(v.rsplit(":", 1)[0].split(":", 1) for v in compose["services"]["grafana"]["volumes"]
                  if v.startswith("./"))
    dashboard_mount = mounts[f"./grafana/{DASHBOARD.name}"]
    assert Path(dashboard_mount).parent == Path(provider["options"]["path"])
    assert mounts["./grafana/provisioning"] == "/etc/grafana/provisioning"


def test_hpa_scales_on_a_contract_gauge() -> None:
    (hpa,) = load_yaml_docs(KUBERNETES / "hpa.yaml")
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods"
    assert metric["pods"]["metric"]["name"] == "tidewire_connections"
    assert known_metric(metric["pods"]["metric"]["name"])
    assert metric["pods"]["target"]["type"] == "AverageValue"
