"""The `sparkplug` job on Spark local over a lake the bridge wrote from Sparkplug B messages made with the
reference protobuf module (appended to a store in the first test, sent by paho through a gateway in the second):
per metric count, nulls, min, max, avg, last value and time over a window; a run without --since continues where
the last stopped; a metric the bridge could not name (its DATA before its birth in the log) is named from the
births in the lake."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest

from tests.integration.conftest import GatewayFactory, PahoFactory
from tests.integration.test_sparkplug import publish_edge_node
from tests.waiting import wait_until
from tidewire.pipeline.cli import build_parser
from tidewire.pipeline.jobs import sparkplug
from tidewire.pipeline.lake.bridge import LakeBridge
from tidewire.pipeline.sparkplug import sparkplug_b_pb2 as pb
from tidewire.pipeline.window import TimeWindow, checkpoint_path, last_until
from tidewire.store.base import Message
from tidewire.store.embedded.engine import EmbeddedStore

pytestmark = pytest.mark.slow  # Spark local: seconds per job

T0 = 1_714_557_600_000  # 2024-05-01T10:00Z
HOUR = 3_600_000


def _payload(seq: int, metrics: list[dict[str, Any]]) -> bytes:
    p = pb.Payload(timestamp=T0 + seq, seq=seq)
    for m in metrics:
        p.metrics.add(**m)
    return p.SerializeToString()


def _messages() -> list[Message]:
    def msg(topic: str, payload: bytes, at: int) -> Message:
        return Message(topic=topic, payload=payload, timestamp_ms=at, publisher="edge1")

    out = [msg("spBv1.0/plant/NBIRTH/edge1", _payload(0, [
               {"name": "uptime", "alias": 1, "datatype": pb.Int64, "long_value": 5}]), T0),
           msg("spBv1.0/plant/DBIRTH/edge1/pump", _payload(1, [
               {"name": "temp", "alias": 10, "datatype": pb.Double, "double_value": 20.0},
               {"name": "running", "alias": 11, "datatype": pb.Boolean, "boolean_value": False}]), T0 + 1)]
    temps = [21.0, 25.0, None, 23.0]  # None: an is_null metric
    for i, t in enumerate(temps):
        metric: dict[str, Any] = {"alias": 10, "timestamp": T0 + 10 + i}
        metric.update({"is_null": True} if t is None else {"double_value": t})
        running = {"alias": 11, "boolean_value": True}
        out.append(msg("spBv1.0/plant/DDATA/edge1/pump", _payload(2 + i, [metric, running]), T0 + 10 + i))
    out.append(msg("spBv1.0/plant/NDATA/edge1", _payload(6, [{"alias": 1, "long_value": 50}]), T0 + 20))
    out.append(msg("spBv1.0/plant/NCMD/edge1", _payload(0, [
        {"name": "Node Control/Rebirth", "datatype": pb.Boolean, "boolean_value": True}]), T0 + 21))  # not counted
    # The next hour: a second device whose DATA comes before its birth in the log; then the birth.
    out.append(msg("spBv1.0/plant/DDATA/edge1/fan", _payload(7, [{"alias": 30, "int_value": 900}]), T0 + HOUR))
    out.append(msg("spBv1.0/plant/DBIRTH/edge1/fan", _payload(8, [
        {"name": "fan_rpm", "alias": 30, "datatype": pb.UInt16, "int_value": 800}]), T0 + HOUR + 1))
    return out


async def _lake(tmp_path: Path) -> Path:
    lake = tmp_path / "lake"
    store = EmbeddedStore(tmp_path / "data", fsync="never")
    await store.open()
    try:
        await store.append(_messages())
        bridge = LakeBridge(store, lake, owner="t", flush_rows=100, flush_seconds=0.1, idle_s=0.02,  # type: ignore[arg-type]
                            lease_ttl_ms=600)
        await asyncio.wait_for(bridge.run(once=True), 20)
        assert bridge.stats()["sparkplug"] == {"rows": 15, "malformed": 0, "unresolved": 1}
    finally:
        await store.close()
    return lake


def test_report_per_metric_over_windows(spark: Any, tmp_path: Path) -> None:
    lake = asyncio.run(_lake(tmp_path))
    first = {(r["device"], r["metric"]): r for r in
             sparkplug.run(spark, str(lake), TimeWindow(T0, T0 + HOUR)).collect()}
    assert set(first) == {(None, "uptime"), ("pump", "temp"), ("pump", "running")}  # no command
    temp = first[("pump", "temp")]
    assert (temp["datatype"], temp["count"], temp["nulls"], temp["min"], temp["max"]) == ("Double", 5, 1, 20.0, 25.0)
    assert temp["avg"] == pytest.approx((20 + 21 + 25 + 23) / 4)
    assert temp["last_value"] == "23.0" and int(temp["last_time"].timestamp() * 1000) == T0 + 13
    running = first[("pump", "running")]
    assert (running["datatype"], running["count"], running["avg"], running["last_value"]) == (
        "Boolean", 5, 0.8, "true")
    uptime = first[(None, "uptime")]
    assert (uptime["datatype"], uptime["min"], uptime["max"], uptime["last_value"]) == ("Int64", 5.0, 50.0, "50")
    assert all((r["group_id"], r["edge_node"]) == ("plant", "edge1") for r in first.values())

    # The command line, without --since on its second run: it continues from the first run's --until.
    parser = build_parser()
    until = T0 + 2 * HOUR
    args = parser.parse_args(["run", "sparkplug", "--lake", str(lake), "--since", "2024-05-01T11:00:00Z",
                              "--until", "2024-05-01T12:00:00Z"])
    assert sparkplug.main_job(spark, str(lake), args) == 0
    assert last_until(checkpoint_path(str(lake), sparkplug.JOB)) == until
    second = spark.read.parquet(sparkplug.report_path(str(lake))).collect()
    # The fan's DATA was written before its birth: the report names it from the birth in the lake.
    assert sorted((r["device"], r["metric"], r["count"], r["min"], r["max"], r["last_value"]) for r in second) == [
        ("fan", "fan_rpm", 2, 800.0, 900.0, "800")]


def test_report_over_what_paho_sent_through_a_gateway(spark: Any, gateway_factory: GatewayFactory,
                                                      paho_factory: PahoFactory, tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    gw = gateway_factory(env={"TIDEWIRE_LAKE_DIR": str(lake), "TIDEWIRE_LAKE_FLUSH_SECONDS": "0.1",
                              "TIDEWIRE_SYS_EVENTS": "false"})
    publish_edge_node(paho_factory, gw.port, "plant")

    def rows() -> int:
        files = [str(p) for p in (lake / "sparkplug").rglob("*.parquet") if not p.name.startswith(".")]
        return ds.dataset(files, format="parquet").count_rows() if files else 0

    wait_until(lambda: rows() >= 6, timeout=15, what="the metrics in the lake")
    report = {(r["device"], r["metric"]): r for r in sparkplug.run(spark, str(lake)).collect()}
    temperature = report[("pump", "temperature")]
    assert (temperature["datatype"], temperature["count"], temperature["min"], temperature["max"],
            temperature["last_value"]) == ("Float", 3, 20.5, 22.75, "22.75")
    assert report[("pump", "status")]["last_value"] == "ok"
    assert report[(None, "bdSeq")]["count"] == 1
