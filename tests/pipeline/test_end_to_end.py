"""End to end: devices (MQTT 3.1.1, MQTT 5 and AMQP) publish JSON telemetry through a real gateway, subscribers
receive it, the lake bridge exports the log as its own process (killed mid-export and restarted), the node
exports its events, the Spark jobs run over that lake, and the rule job's alert reaches a subscribed device."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pika
import pyarrow.dataset as ds
import pytest

from tests.integration.conftest import GatewayFactory, PahoFactory
from tests.waiting import wait_until
from tidewire.pipeline.jobs import aggregates, alerts, reports

# Spark local jobs (a JVM per session, seconds per job): `make test-slow`, with the Spark cluster test, keeps
# `make test` under its 10 minutes.
pytestmark = pytest.mark.slow

TELEMETRY = "devices/{}/telemetry"
PLAIN = [("d1", 5, [20.0 + i / 4 for i in range(30)]), ("d2", 4, [18.5 - i / 8 for i in range(30)])]
HOT = [85.0 + i / 10 for i in range(16)]  # one every 0.1 s: above 80 for 1.5 s
AMQP = [30.0 + (i % 7) for i in range(20)]


def _bridge(data_dir: Path, lake: Path, *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "tidewire.pipeline.lake", "--data-dir", str(data_dir),
                             "--lake", str(lake),
                             "--flush-rows", "7", "--flush-seconds", "0.05", "--idle-s", "0.02", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=Path(__file__).parents[2])


def _lake_rows(lake: Path, table: str, columns: list[str]) -> list[dict[str, Any]]:
    path = lake / table
    # The table's directory appears before its first committed file (files are written hidden, then renamed):
    # an empty dataset has no columns to project.
    if not any(path.rglob("*.parquet")):
        return []
    return ds.dataset(path, format="parquet", partitioning="hive").to_table(columns=columns).to_pylist()


def test_devices_to_lake_to_spark_and_back(gateway_factory: GatewayFactory, paho_factory: PahoFactory, spark: Any,
                                           tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    gw = gateway_factory(amqp=True, env={
        "TIDEWIRE_LAKE_DIR": str(lake), "TIDEWIRE_LAKE_BRIDGE": "false",  # the log's bridge runs as a process
        "TIDEWIRE_LAKE_FLUSH_SECONDS": "0.2", "TIDEWIRE_SYS_EVENTS": "false"})
    watcher = paho_factory(gw.port, "watcher")
    watcher.connect()
    watcher.subscribe("devices/+/telemetry", qos=1)
    hot = paho_factory(gw.port, "hot-1", version=4)
    hot.connect()
    hot.subscribe("alerts/hot-1", qos=1)

    bridge = _bridge(gw.data_dir, lake)
    kills = 0
    for name, version, values in PLAIN:
        exported = len(_lake_rows(lake, "messages", ["position"]))
        device = paho_factory(gw.port, name, version=version)
        device.connect()
        for i, value in enumerate(values):
            device.publish(TELEMETRY.format(name), json.dumps({"temperature": value, "humidity": 40 + i}), qos=1)
        device.disconnect()
        wait_until(lambda exported=exported: len(_lake_rows(lake, "messages", ["position"])) >= exported + 7,  # type: ignore[misc]
                   timeout=10, what=f"a flush of {name}'s messages in the lake")
        bridge.send_signal(signal.SIGKILL)  # mid-export: flushes of 7 rows every 50 ms
        bridge.wait(5)
        kills += 1
        bridge = _bridge(gw.data_dir, lake)
    for value in HOT:
        hot.publish(TELEMETRY.format("hot-1"), json.dumps({"temperature": value}), qos=1)
        time.sleep(0.1)  # the behaviour under test: a device hot for 1.5 s (the alert's duration)
    amqp = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", gw.amqp_port, connection_attempts=1,
                                                             socket_timeout=5))
    channel = amqp.channel()
    channel.confirm_delivery()
    for value in AMQP:
        channel.basic_publish("amq.topic", "devices.amqp-1.telemetry", json.dumps({"temperature": value}).encode(),
                              pika.BasicProperties(delivery_mode=2, content_type="application/json"))
    amqp.close()
    total = sum(len(v) for _, _, v in PLAIN) + len(HOT) + len(AMQP)
    assert len(watcher.expect(total, timeout=10)) == total
    bridge.send_signal(signal.SIGKILL)
    bridge.wait(5)
    once = _bridge(gw.data_dir, lake, "--once")
    out, _ = once.communicate(timeout=60)
    assert once.returncode == 0, out.decode(errors="replace")
    assert kills == 2

    # Every message of the log exactly once, whatever the kills interrupted (embedded seqs are consecutive).
    rows = _lake_rows(lake, "messages", ["position", "topic", "client_id", "protocol", "payload_json"])
    positions = sorted(r["position"] for r in rows)
    assert positions == list(range(1, positions[-1] + 1))
    telemetry = [r for r in rows if r["topic"].startswith("devices/")]
    assert len(telemetry) == total
    by_protocol: defaultdict[str, int] = defaultdict(int)
    for r in telemetry:
        by_protocol[r["protocol"]] += 1
    assert by_protocol == {"mqtt": total - len(AMQP), "amqp": len(AMQP)}
    amqp_ids = {r["client_id"] for r in telemetry if r["protocol"] == "amqp"}
    assert len(amqp_ids) == 1 and "" not in amqp_ids
    amqp_id = amqp_ids.pop()

    # The node's events (flushed every 0.2 s): every telemetry message delivered to and acked by the watcher.
    def events_in() -> bool:
        got = _lake_rows(lake, "events", ["event", "client_id"])
        return sum(1 for e in got if e["event"] == "acked" and e["client_id"] == "watcher") >= total
    wait_until(events_in, timeout=10)

    # (a) streaming aggregates: exact per device, whatever minutes the run straddled
    aggregates.run(spark, str(lake))
    sent = {name: values for name, _, values in PLAIN} | {"hot-1": HOT, amqp_id: AMQP}
    got: dict[str, dict[str, Any]] = {}
    for row in aggregates.minute_aggregates(spark, str(lake), by="device").collect():
        if row["client_id"] not in sent:
            continue
        t = row["fields"]["temperature"]
        acc = got.setdefault(row["client_id"],
                             {"messages": 0, "count": 0, "min": t["min"], "max": t["max"], "sum": 0.0})
        acc["messages"] += row["messages"]
        acc["count"] += t["count"]
        acc["sum"] += t["avg"] * t["count"]
        acc["min"] = min(acc["min"], t["min"])
        acc["max"] = max(acc["max"], t["max"])
    for name, values in sent.items():
        acc = got[name]
        assert (acc["messages"], acc["count"], acc["min"], acc["max"]) == (len(values), len(values), min(values),
                                                                          max(values)), name
        assert acc["sum"] / acc["count"] == pytest.approx(sum(values) / len(values), rel=1e-12)

    # (b) batch reports
    latency = {r["topic"]: r for r in reports.latency(spark, str(lake)).collect()}
    for name, _, values in PLAIN:
        lat = latency[TELEMETRY.format(name)]
        assert lat["delivered"] == lat["acked"] == len(values)
        assert 0 <= lat["delivery_p50_ms"] <= lat["delivery_p99_ms"] < 5000
        assert lat["delivery_p50_ms"] <= lat["ack_p50_ms"] < 5000
    assert max(r["online"] for r in reports.online(spark, str(lake)).collect()) >= 3  # watcher, hot-1, a device
    talkers = [r["client_id"] for r in reports.top_talkers(spark, str(lake)).collect()]
    assert talkers[:2] == ["d1", "d2"]  # 30 each (ties by id), then the AMQP device's 20, then hot-1's 16
    assert set(talkers[2:4]) == {amqp_id, "hot-1"}
    all_topics = next(r for r in reports.rates(spark, str(lake)).collect() if r["topic"] == "#")
    assert (all_topics["first_deliveries"], all_topics["dropped"], all_topics["retries"]) == (total, 0, 0)
    assert all_topics["drop_rate"] == 0.0

    # (c) the rule job closes the loop: hot-1 was above 80 for 1.5 s; the alert reaches it, once
    rule = alerts.parse_rule("temperature > 80 for 1s")
    target = alerts.parse_mqtt_url(f"mqtt://127.0.0.1:{gw.port}")
    first = alerts.run(spark, str(lake), rule, target=target)
    assert first.error is None and [a.client_id for a in first.published] == ["hot-1"]
    alert = hot.get(timeout=5)
    assert alert.topic == "alerts/hot-1"
    body = json.loads(alert.payload)["alert"]
    assert (body["client_id"], body["field"], body["count"], body["min"]) == ("hot-1", "temperature", len(HOT),
                                                                           min(HOT))
    again = alerts.run(spark, str(lake), rule, target=target)
    assert again.published == [] and again.already == 1
    hot.assert_nothing(0.5)


def test_in_node_bridge_exports_while_serving(gateway_factory: GatewayFactory, paho_factory: PahoFactory,
                                              tmp_path: Path) -> None:
    """`--lake` alone: the node runs the log's bridge (a child process of its own) and its events exporter, and a
    graceful stop makes the bridge read to the end of the log and commit before the node exits."""
    lake = tmp_path / "lake"
    gw = gateway_factory(env={"TIDEWIRE_LAKE_DIR": str(lake), "TIDEWIRE_LAKE_FLUSH_SECONDS": "30"})
    wait_until(lambda: (lake / "_tidewire" / "p00.lock").exists(), timeout=15)  # the bridge took the partition
    device = paho_factory(gw.port, "d1")
    device.connect()
    for i in range(25):
        device.publish("plant/line1/speed", json.dumps({"rpm": i}), qos=1)
    device.disconnect()
    gw.stop()  # nothing flushed yet (30 s): the stop must flush and commit
    rows = _lake_rows(lake, "messages", ["position", "topic", "json_numbers"])
    speeds = sorted(dict(r["json_numbers"])["rpm"] for r in rows if r["topic"] == "plant/line1/speed")
    assert speeds == [float(i) for i in range(25)]
    assert len({r["position"] for r in rows}) == len(rows)
    assert (lake / "_tidewire" / "checkpoint-p00.json").exists()
    assert not [p for p in lake.rglob("*") if p.name.startswith(".")]  # no temporary file left behind
    assert os.listdir(lake / "events")


def _bridge_children(parent_pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"tidewire.pipeline.lake" in argv and str(parent_pid).encode() in argv:
                found.append(int(entry.name))
    return found


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"  # exited, not reaped (yet)
    except OSError:
        return True


def test_in_node_bridge_never_outlives_its_node(gateway_factory: GatewayFactory, tmp_path: Path) -> None:
    """The bridge child watches its node: after a kill -9 of the node it stops by itself (nothing committed is
    lost; the next bridge resumes from the checkpoint)."""
    lake = tmp_path / "lake"
    gw = gateway_factory(env={"TIDEWIRE_LAKE_DIR": str(lake)})
    wait_until(lambda: (lake / "_tidewire" / "p00.lock").exists(), timeout=15)
    assert gw.proc is not None
    children = _bridge_children(gw.proc.pid)
    assert len(children) == 1
    gw.kill9()
    wait_until(lambda: _gone(children[0]), timeout=10)
