"""The jobs on a real Spark standalone cluster, submitted as a user does (make test-slow: ~1-2 minutes).

A master and a worker started from pyspark's own `spark-class`; the artifact built by `tidewire pipeline package`;
each job spark-submitted from a directory outside the checkout by a driver Python that has the driver
requirements and not Tidewire (tests.pipeline.driver). Each job's output is checked, and the master must list
it as a finished application (it ran on the cluster, not in local mode).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pyarrow.dataset as ds
import pyspark
import pytest

from loadtest.ports import free_port
from tests.integration.conftest import Gateway, PahoFactory
from tests.pipeline.conftest import write_messages
from tests.pipeline.driver import driver_env, make_driver_python
from tests.pipeline.test_alerts import _lake as alerts_lake
from tests.pipeline.test_jobs import _expected, _report_lake, _telemetry
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

SPARK_HOME = Path(pyspark.__file__).parent
LOOPBACK = "127.0.0.1"


@dataclass
class Cluster:
    url: str  # spark://127.0.0.1:PORT
    ui: str  # the master's web UI, whose /json/ lists applications
    python: Path  # the driver's (and executors') interpreter
    zip_path: Path
    launchers: dict[str, Path]
    work: Path  # where spark-submit runs: outside the checkout

    def env(self) -> dict[str, str]:
        return driver_env(SPARK_HOME=str(SPARK_HOME), SPARK_LOCAL_IP=LOOPBACK, PYSPARK_PYTHON=str(self.python),
                          PYSPARK_DRIVER_PYTHON=str(self.python))

    def submit(self, job: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        cmd = [str(SPARK_HOME / "bin" / "spark-submit"), "--master", self.url, "--deploy-mode", "client",
               "--conf", "spark.cores.max=1", "--conf", "spark.executor.memory=512m",
               "--py-files", str(self.zip_path), str(self.launchers[job]), *args]
        return subprocess.run(cmd, cwd=self.work, env={**self.env(), **(env or {})}, capture_output=True,
                              text=True, timeout=300)

    def finished_apps(self) -> list[str]:
        state = httpx.get(f"{self.ui}/json/", timeout=5).json()
        return [app["name"] for app in state.get("completedapps", [])]


def _daemon(cls: str, args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen([str(SPARK_HOME / "bin" / "spark-class"), cls, *args], stdout=out,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    base = tmp_path_factory.mktemp("spark-cluster")
    python = make_driver_python(base / "driver")
    work = base / "work"
    work.mkdir()
    dist = work / "dist"
    # the artifact exactly as a user builds it, from the installed package
    tidewire = Path(sys.executable).parent / "tidewire"
    built = subprocess.run([str(tidewire), "pipeline", "package", "-o", str(dist / "tidewire-pipeline.zip")],
                           cwd=work, capture_output=True, text=True, timeout=60)
    assert built.returncode == 0, built.stderr
    launchers = {job: dist / "jobs" / f"{job}.py" for job in ("aggregates", "reports", "alerts")}
    env = driver_env(SPARK_HOME=str(SPARK_HOME), SPARK_LOCAL_IP=LOOPBACK,
                     SPARK_DAEMON_MEMORY="512m", SPARK_WORKER_DIR=str(base / "worker"))
    port, ui, worker_ui = free_port(), free_port(), free_port()
    master = _daemon("org.apache.spark.deploy.master.Master",
                     ["--host", LOOPBACK, "--port", str(port), "--webui-port", str(ui)], base / "master.log", env)
    worker = None
    try:
        wait_until(lambda: "I have been elected leader" in (base / "master.log").read_text(errors="replace"),
                   timeout=60, what="the Spark master up")
        worker = _daemon("org.apache.spark.deploy.worker.Worker",
                         [f"spark://{LOOPBACK}:{port}", "--host", LOOPBACK, "--webui-port", str(worker_ui),
                          "--cores", "2", "--memory", "2g"], base / "worker.log", env)
        wait_until(lambda: "Successfully registered with master" in (base / "worker.log").read_text(errors="replace"),
                   timeout=60, what="the Spark worker registered")
        yield Cluster(f"spark://{LOOPBACK}:{port}", f"http://{LOOPBACK}:{ui}", python,
                      dist / "tidewire-pipeline.zip", launchers, work)
    finally:
        if worker is not None:
            _stop(worker)
        _stop(master)


def _merged_partials(lake: Path) -> dict[tuple[str, int], dict[str, Any]]:
    """The device_minute partial files folded as any SQL engine would (sum of count and sum, min of min, max of
    max), read with pyarrow: the job's output, not the job's own reader."""
    rows = ds.dataset(lake / "aggregates" / "device_minute", format="parquet", partitioning="hive").to_table(
        columns=["client_id", "minute", "field", "count", "sum", "min", "max"]).to_pylist()
    folded: dict[tuple[str, int, str | None], list[float]] = {}
    for r in rows:
        key = (r["client_id"], int(r["minute"].timestamp() * 1000), r["field"])
        c, s, lo, hi = folded.get(key, [0, 0.0, float("inf"), float("-inf")])
        folded[key] = [c + r["count"], s + r["sum"], min(lo, r["min"]), max(hi, r["max"])]
    out: dict[tuple[str, int], dict[str, Any]] = defaultdict(lambda: {"fields": {}})
    for (client, minute, field), (count, total, lo, hi) in folded.items():
        entry = out[(client, minute)]
        if field is None:
            entry["messages"], entry["bytes"] = count, int(total)
        else:
            entry["fields"][field] = (count, lo, hi, total / count)
    return dict(out)


def test_aggregates_on_the_cluster(cluster: Cluster, tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    rows = _telemetry(1, 400, seed=7)
    write_messages(lake, rows[:250], name="0-a")
    write_messages(lake, rows[250:], name="0-b")
    done = cluster.submit("aggregates", "--lake", str(lake))
    assert done.returncode == 0, done.stderr[-4000:]
    assert "aggregates: 400 rows" in done.stdout
    got, want = _merged_partials(lake), _expected(rows, "client_id")
    assert got.keys() == want.keys()
    for key, w in want.items():
        g = got[key]
        assert (g["messages"], g["bytes"]) == (w["messages"], w["bytes"]), key
        assert {f: v[:3] for f, v in g["fields"].items()} == {f: v[:3] for f, v in w["fields"].items()}, key
        for f, v in w["fields"].items():
            assert g["fields"][f][3] == pytest.approx(v[3], rel=1e-12)
    assert "tidewire-aggregates" in cluster.finished_apps()


def test_reports_on_the_cluster(cluster: Cluster, tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    _report_lake(lake)
    done = cluster.submit("reports", "--lake", str(lake), "--top", "1")
    assert done.returncode == 0, done.stderr[-4000:]
    assert "== top_talkers" in done.stdout and "== rates" in done.stdout
    top = ds.dataset(lake / "reports" / "top_talkers", format="parquet").to_table().to_pylist()
    assert [(r["client_id"], r["messages"], r["bytes"], r["messages_rank"], r["bytes_rank"]) for r in top] == [
        ("p1", 100, 1000, 1, 2), ("p2", 10, 5000, 2, 1)]
    rates = {r["topic"]: r for r in ds.dataset(lake / "reports" / "rates", format="parquet").to_table().to_pylist()}
    assert (rates["r/a"]["delivered"], rates["r/a"]["retries"], rates["r/a"]["dropped"]) == (111, 10, 5)
    assert rates["#"]["drop_rate"] == 5 / 116
    assert "tidewire-reports" in cluster.finished_apps()


def test_alerts_from_the_cluster_reach_a_device(cluster: Cluster, tmp_path: Path, gateway: Gateway,
                                                paho_factory: PahoFactory) -> None:
    lake = alerts_lake(tmp_path)
    sub = paho_factory(gateway.port, "watcher")
    sub.connect()
    sub.subscribe("alerts/#", qos=1)
    done = cluster.submit("alerts", "--lake", str(lake), "--rule", "temp > 80 for 20s",
                          env={"TIDEWIRE_MQTT_URL": f"mqtt://{LOOPBACK}:{gateway.port}"})
    assert done.returncode == 0, done.stderr[-4000:]
    assert "2 new, 2 published" in done.stdout
    got = sorted(sub.expect(2, timeout=10), key=lambda m: m.topic)
    assert [m.topic for m in got] == ["alerts/a", "alerts/b"]
    body = json.loads(got[0].payload)["alert"]
    assert (body["client_id"], body["field"], body["count"], body["min"], body["max"]) == ("a", "temp", 4, 85.0, 90.0)
    again = cluster.submit("alerts", "--lake", str(lake), "--rule", "temp > 80 for 20s",
                           env={"TIDEWIRE_MQTT_URL": f"mqtt://{LOOPBACK}:{gateway.port}"})
    assert again.returncode == 0 and "0 new, 0 published" in again.stdout and "2 published before" in again.stdout
    sub.assert_nothing(0.5)
    assert cluster.finished_apps().count("tidewire-alerts") == 2
