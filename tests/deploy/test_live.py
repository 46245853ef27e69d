"""The deploy files against real processes: three real nodes started exactly as the Kubernetes Deployment starts
them (its args, the ConfigMap's settings file, the Secret's files, the downward-API env) on a real Redis, scraped
by a real Prometheus running deploy/prometheus's config and rules (targets pointed at the local ports). Every
dashboard query, alert and HPA metric is then checked against what the nodes really expose and Prometheus really
evaluates; the image's and compose's health check commands are run against a node."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from loadtest.ports import free_port
from tests.deploy import (
    GATEWAY_SERVICES,
    KUBERNETES,
    PROMETHEUS,
    RULES,
    dashboard_exprs,
    grafana_to_promql,
    load_yaml_docs,
    promql_metric_names,
    rule_exprs,
)
from tests.deploy.test_docker import healthcheck_command, image, services
from tests.store import redis_server
from tests.store.redis_server import RedisServer
from tests.waiting import wait_until

PROMETHEUS_BIN = shutil.which("prometheus") or "/usr/bin/prometheus"
MOSQUITTO_PUB = shutil.which("mosquitto_pub") or "/usr/bin/mosquitto_pub"
START_TIMEOUT = 30.0  # s until a node answers /readyz (three start at once on two cores)
SCRAPE_TIMEOUT = 20.0  # s until Prometheus has scraped all three and evaluated the rules

pytestmark = [
    pytest.mark.skipif(not redis_server.available(), reason="redis-server is not installed"),
    pytest.mark.skipif(not Path(PROMETHEUS_BIN).exists(), reason="prometheus is not installed"),
    pytest.mark.timeout(120),
]


def manifest(name: str) -> dict[str, Any]:
    (doc,) = load_yaml_docs(KUBERNETES / name)
    result: dict[str, Any] = doc
    return result


@dataclass
class Node:
    name: str
    admin_port: int
    mqtt_port: int
    proc: subprocess.Popen[bytes]
    log: Path

    def get(self, path: str, token: str | None = None) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.get(f"http://127.0.0.1:{self.admin_port}{path}", headers=headers, timeout=5)

    def ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"{self.name} exited {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
        try:
            return self.get("/readyz").status_code == 200
        except httpx.HTTPError:
            return False


def clustered(nodes: list[Node], token: str) -> bool:
    statuses = [n.get("/api/v1/status", token).json() for n in nodes]
    return all(s["cluster"] is not None and len(s["cluster"]["members"]) == 3 for s in statuses)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[list[Node], str, int]]:
    """(nodes, api token, Prometheus port), shared by this module's tests: everything stopped at teardown."""
    tmp_path = tmp_path_factory.mktemp("stack")
    redis = RedisServer(tmp_path / "redis")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        redis.start()
        # the Secret's files and the ConfigMap's file, where the pod would have them mounted
        secret = manifest("secret.yaml")["stringData"]
        secrets_dir = tmp_path / "secrets"
        secrets_dir.mkdir()
        for key, value in secret.items():
            (secrets_dir / key).write_text(value)
        config = tmp_path / "tidewire.yaml"
        config.write_text(manifest("configmap.yaml")["data"]["tidewire.yaml"])
        deployment = manifest("deployment.yaml")
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        args = list(container["args"])
        args[args.index("--config") + 1] = str(config)
        base_env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEWIRE_")}
        nodes = []
        for i in range(3):
            pod = f"tidewire-5f7d9c-{i}"
            admin, mqtt, cluster = free_port(), free_port(), free_port()
            env = {
                **base_env,
                # the Deployment's env: downward API and the Secret's cluster secret
                "TIDEWIRE_NODE_ID": pod,
                "TIDEWIRE_CLUSTER_HOST": "127.0.0.1",
                "TIDEWIRE_CLUSTER_SECRET": secret["cluster_secret"],
                # only what differs on one machine: loopback, free ports, local paths and store
                "TIDEWIRE_HOST": "127.0.0.1",
                "TIDEWIRE_PORT": str(mqtt),
                "TIDEWIRE_WS_PORT": str(free_port()),
                "TIDEWIRE_AMQP_PORT": "off",
                "TIDEWIRE_ROCKETMQ_PORT": "off",
                "TIDEWIRE_ADMIN_PORT": str(admin),
                "TIDEWIRE_CLUSTER_PORT": str(cluster),
                "TIDEWIRE_STORE": redis.url,
                "TIDEWIRE_DATA_DIR": str(tmp_path / pod),
                "TIDEWIRE_API_TOKEN_FILE": str(secrets_dir / "api_token"),
                "TIDEWIRE_PASSWORD_FILE": str(secrets_dir / "passwd"),
            }
            log = tmp_path / f"{pod}.log"
            with log.open("wb") as out:
                proc = subprocess.Popen([sys.executable, "-m", "tidewire", *args], env=env, stdout=out,
                                        stderr=subprocess.STDOUT, cwd=tmp_path)
            procs.append(proc)
            nodes.append(Node(pod, admin, mqtt, proc, log))
        for node in nodes:
            wait_until(node.ready, START_TIMEOUT, what=f"{node.name} ready", interval=0.1)
        # Prometheus starts once the three have joined, so no scrape (or alert) sees a half-formed cluster
        wait_until(lambda: clustered(nodes, secret["api_token"]), 15, what="three cluster members", interval=0.1)
        # compose's Prometheus config, its targets pointed at the local admin ports, scraping every second
        prom = yaml.safe_load(PROMETHEUS.read_text())
        prom["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
        prom["rule_files"] = [str(RULES)]
        (job,) = prom["scrape_configs"]
        job["static_configs"] = [{"targets": [f"127.0.0.1:{n.admin_port}" for n in nodes]}]
        prom_config = tmp_path / "prometheus.yml"
        prom_config.write_text(yaml.safe_dump(prom))
        prom_port = free_port()
        with (tmp_path / "prometheus.log").open("wb") as out:
            procs.append(subprocess.Popen(
                [PROMETHEUS_BIN, f"--config.file={prom_config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{prom_port}"], stdout=out, stderr=subprocess.STDOUT))
        yield nodes, secret["api_token"], prom_port
    finally:
        for proc in reversed(procs):
            _stop(proc)
        redis.stop()


def query(prom_port: int, promql: str) -> list[dict[str, Any]]:
    r = httpx.get(f"http://127.0.0.1:{prom_port}/api/v1/query", params={"query": promql}, timeout=5)
    body = r.json()
    assert r.status_code == 200 and body["status"] == "success", (promql, body)
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def exposed_names(text: str) -> set[str]:
    """The series names of a /metrics exposition (a histogram's family also names its _bucket/_sum/_count)."""
    names = set()
    for line in text.splitlines():
        if m := re.match(r"# TYPE (\S+) (\S+)", line):
            names.add(m.group(1))
            if m.group(2) == "histogram":
                names |= {f"{m.group(1)}_bucket", f"{m.group(1)}_sum", f"{m.group(1)}_count"}
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


@pytest.mark.slow  # long: `make test-slow` (CI runs it after `make test`)
def test_deployment_config_and_monitoring_on_real_nodes(stack: tuple[list[Node], str, int]) -> None:
    nodes, token, prom_port = stack
    # the Secret's api_token is the admin API's token; the three pods are one cluster
    for node in nodes:
        assert node.get("/api/v1/status").status_code == 401

    status = nodes[0].get("/api/v1/status", token).json()
    assert status["node_id"] == nodes[0].name and status["store"] == "redis"
    assert {m["node_id"] for m in status["cluster"]["members"]} == {n.name for n in nodes}

    # the placeholder password file admits nobody, and anonymous clients are refused (a real MQTT client)
    if Path(MOSQUITTO_PUB).exists():
        pub = subprocess.run([MOSQUITTO_PUB, "-h", "127.0.0.1", "-p", str(nodes[0].mqtt_port), "-t", "t", "-m", "x",
                              "-q", "1"], capture_output=True, text=True, timeout=10)
        assert pub.returncode != 0 and "not authori" in (pub.stderr + pub.stdout).lower(), pub

    # every metric a panel, an alert or the HPA names is exposed by the nodes
    exposed = exposed_names(nodes[0].get("/metrics").text)
    wanted = {n for _, e in dashboard_exprs() + rule_exprs() for n in promql_metric_names(e)} - {"up"}
    hpa = manifest("hpa.yaml")
    wanted |= {m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"]}
    assert not wanted - exposed, f"not on /metrics: {sorted(wanted - exposed)}"

    # Prometheus scrapes the three nodes with compose's job...
    def all_up() -> bool:
        try:
            result = query(prom_port, 'up{job="tidewire"}')
        except (httpx.HTTPError, json.JSONDecodeError, AssertionError):
            return False
        return len(result) == 3 and all(r["value"][1] == "1" for r in result)

    wait_until(all_up, SCRAPE_TIMEOUT, what="three scraped targets up", interval=0.1)
    assert len(query(prom_port, "sum by (instance) (tidewire_connections)")) == 3  # the HPA's per-pod series
    members = query(prom_port, "tidewire_cluster_members")
    assert [float(r["value"][1]) for r in members] == [3.0, 3.0, 3.0]
    # ...every dashboard query evaluates without an error...
    for _, expr in dashboard_exprs():
        query(prom_port, grafana_to_promql(expr))
    assert query(prom_port, grafana_to_promql(
        next(e for t, e in dashboard_exprs() if t == "Cluster members")))[0]["value"][1] == "3"

    # ...and the alert rules load and evaluate healthily, none firing on a healthy cluster
    def rules_evaluated() -> bool:
        groups = httpx.get(f"http://127.0.0.1:{prom_port}/api/v1/rules", timeout=5).json()["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        # an unevaluated rule's lastEvaluation is Go's zero time
        return len(rules) == len(rule_exprs()) and all(not r.get("lastEvaluation", "0001").startswith("0001")
                                                       for r in rules)

    wait_until(rules_evaluated, SCRAPE_TIMEOUT, what="alert rules evaluated", interval=0.1)
    groups = httpx.get(f"http://127.0.0.1:{prom_port}/api/v1/rules", timeout=5).json()["data"]["groups"]
    rules = [r for g in groups for r in g["rules"]]
    assert all(r["health"] == "ok" for r in rules), rules
    assert [r["name"] for r in rules if r["state"] != "inactive"] == []


@pytest.mark.slow  # several seconds (a real node, a build or a long model run): make test-slow
def test_health_check_commands_against_a_real_node(stack: tuple[list[Node], str, int]) -> None:
    """The image's HEALTHCHECK (shell form) and compose's gateway healthcheck, run as they would be run."""
    nodes, _, _ = stack
    node = nodes[1]
    check = healthcheck_command(image()["healthcheck"])
    env = {**os.environ, "TIDEWIRE_ADMIN_PORT": str(node.admin_port)}
    assert subprocess.run(["sh", "-c", check], env=env, timeout=10).returncode == 0
    env["TIDEWIRE_ADMIN_PORT"] = str(free_port())  # nothing listens: unhealthy
    assert subprocess.run(["sh", "-c", check], env=env, capture_output=True, timeout=10).returncode != 0
    for name in GATEWAY_SERVICES:
        test = services()[name]["healthcheck"]["test"]
        assert test[0] == "CMD"
        argv = [sys.executable if a == "python" else a.replace(":18083/", f":{node.admin_port}/") for a in test[1:]]
        assert subprocess.run(argv, timeout=10).returncode == 0, name
