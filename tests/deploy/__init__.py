"""Shared helpers of the deploy/ tests: the files' paths, the contract's metric names and PromQL name extraction."""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
KUBERNETES = DEPLOY / "kubernetes"
DOCKERFILE = DEPLOY / "Dockerfile"
COMPOSE = DEPLOY / "compose.yaml"
PROMETHEUS = DEPLOY / "prometheus" / "prometheus.yml"
RULES = DEPLOY / "prometheus" / "tidewire-rules.yml"
DASHBOARD = DEPLOY / "grafana" / "tidewire-dashboard.json"
# The compose-spec JSON schema (github.com/compose-spec/compose-spec schema/compose-spec.json, Apache-2.0),
# vendored: the tests run offline and docker has no compose plugin here.
COMPOSE_SCHEMA = Path(__file__).with_name("compose-spec.json")

ADMIN_PORT = 18083
GATEWAY_SERVICES = ("gw1", "gw2", "gw3")

# The issue 11 contract's metric names (.helpers/ISSUE11.md, "Metric names"): what /metrics exposes.
GAUGES = frozenset({"tidewire_info", "tidewire_connections", "tidewire_sessions_online", "tidewire_subscriptions",
                    "tidewire_inflight", "tidewire_cluster_members", "tidewire_cluster_epoch", "tidewire_draining"})
COUNTERS = frozenset({"tidewire_messages_received_total", "tidewire_messages_sent_total",
                      "tidewire_bytes_received_total", "tidewire_bytes_sent_total", "tidewire_deliveries_total",
                      "tidewire_retries_total", "tidewire_dropped_total", "tidewire_notify_events_total",
                      "tidewire_cache_hits_total", "tidewire_cache_misses_total", "tidewire_lookup_fallbacks_total",
                      "tidewire_auth_total", "tidewire_banned_refused_total"})
HISTOGRAMS = frozenset({"tidewire_store_append_seconds", "tidewire_store_fsync_seconds"})
# prometheus_client's process collector (on the per-node registry) and Prometheus's own per-target series.
PROCESS = frozenset({"process_cpu_seconds_total", "process_resident_memory_bytes", "process_virtual_memory_bytes",
                     "process_open_fds", "process_max_fds", "process_start_time_seconds"})
SCRAPE = frozenset({"up"})

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_BRACKETS = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENT = re.compile(r"(?<![\w.$:])[A-Za-z_:][A-Za-z0-9_:]*")
_KEYWORDS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
                       "unless", "offset", "atan2", "inf", "nan", "Inf", "NaN"})


def promql_metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: identifiers that are neither functions, aggregations,
    keywords, label names (inside `{}` or grouping clauses), durations nor Grafana variables."""
    text = _STRING.sub('""', expr)
    text = _MATCHERS.sub(" ", text)
    text = _BRACKETS.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    names = set()
    for match in _IDENT.finditer(text):
        name = match.group()
        if name in _KEYWORDS or text[match.end():].lstrip().startswith("("):
            continue
        names.add(name)
    return names


def known_metric(name: str) -> bool:
    """Whether `name` is a series the nodes (or Prometheus, for `up`) produce: a contract gauge or counter, a
    contract histogram's `_bucket`/`_sum`/`_count`, a process metric, or `up`."""
    if name in GAUGES | COUNTERS | PROCESS | SCRAPE:
        return True
    base, _, suffix = name.rpartition("_")
    return suffix in ("bucket", "sum", "count") and base in HISTOGRAMS


def load_yaml_docs(path: Path) -> list[Any]:
    """Every document of a YAML file (empty documents dropped)."""
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def dashboard_panels() -> list[dict[str, Any]]:
    """Every panel, rows' nested panels included."""
    out: list[dict[str, Any]] = []
    for panel in dashboard()["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


def dashboard_exprs() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every query of the dashboard."""
    return [(p["title"], t["expr"]) for p in dashboard_panels() for t in p.get("targets", [])]


def grafana_to_promql(expr: str) -> str:
    """A dashboard query as Prometheus receives it: Grafana's variables replaced by plausible values."""
    return (expr.replace("$__rate_interval", "1m").replace("$__interval", "15s")
            .replace("$instance", ".*").replace("${instance}", ".*"))


def rule_exprs() -> list[tuple[str, str]]:
    """(alert name, PromQL) of every alerting rule."""
    out: list[tuple[str, str]] = []
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        out.extend((rule.get("alert") or rule["record"], rule["expr"]) for rule in group["rules"])
    return out


_FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


@functools.lru_cache(maxsize=4)
def cli_flags(*command: str) -> frozenset[str]:
    """The long flags `python -m tidewire <command...> --help` documents (both halves of --x/--no-x), read from the
    real help text; wide columns so rich does not truncate the names."""
    env = {**os.environ, "COLUMNS": "400", "TERM": "dumb", "NO_COLOR": "1"}
    out = subprocess.run([sys.executable, "-m", "tidewire", *command, "--help"], capture_output=True, text=True,
                         timeout=60, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    return frozenset(_FLAG.findall(out.stdout))


def serve_argv_problems(argv: list[str]) -> list[str]:
    """What is wrong with `tidewire <argv>` as a `serve` command line: an unknown subcommand or flag, a flag
    without its value. Empty when it is a real command."""
    if not argv or argv[0] != "serve":
        return [f"not a serve command: {argv}"]
    known = cli_flags("serve")
    problems = []
    args = iter(argv[1:])
    for arg in args:
        flag = arg.split("=", 1)[0]
        if not flag.startswith("--") or flag not in known:
            problems.append(f"unknown argument {arg!r}")
        elif "=" not in arg and not flag.startswith("--no-") and f"--no-{flag[2:]}" not in known:
            value = next(args, None)  # every other flag of serve takes a value
            if value is None or value.startswith("--"):
                problems.append(f"{flag} has no value")
    return problems
