"""The bridge's `sparkplug` table over a real embedded store: one typed row per metric, published with its
messages exactly once, aliases resolved from the births (also those read before a restart), malformed payloads
counted and kept as plain messages, and compaction covering the table."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.pipeline.lake.support import published_files, read_lake, tmp_files
from tidewire.pipeline.lake.bridge import LakeBridge
from tidewire.pipeline.lake.compaction import compact_lake
from tidewire.pipeline.lake.retention import remove_expired
from tidewire.pipeline.lake.schema import SPARKPLUG, SPARKPLUG_SCHEMA
from tidewire.pipeline.sparkplug import sparkplug_b_pb2 as pb
from tidewire.store.base import Message
from tidewire.store.embedded.engine import EmbeddedStore

T0 = 1_700_000_000_000
HOUR = 3_600_000


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[EmbeddedStore]:
    s = EmbeddedStore(tmp_path / "data", fsync="never")
    await s.open()
    yield s
    await s.close()


def _bridge(store: EmbeddedStore, lake: Path, owner: str = "test") -> LakeBridge:
    return LakeBridge(store, lake, owner=owner, flush_rows=3, flush_seconds=0.1, idle_s=0.02,  # type: ignore[arg-type]
                      lease_ttl_ms=600)


def _msg(topic: str, payload: bytes, at: int) -> Message:
    return Message(topic=topic, payload=payload, timestamp_ms=at, publisher="edge")


def _nbirth() -> bytes:
    p = pb.Payload(timestamp=T0, seq=0)
    p.metrics.add(name="bdSeq", alias=0, datatype=pb.Int64, long_value=0)
    p.metrics.add(name="Node Control/Rebirth", alias=1, datatype=pb.Boolean, boolean_value=False)
    return p.SerializeToString()


def _dbirth() -> bytes:
    p = pb.Payload(timestamp=T0, seq=1)
    p.metrics.add(name="temp", alias=10, datatype=pb.Double, double_value=20.0)
    p.metrics.add(name="rpm", alias=11, datatype=pb.UInt16, int_value=1200)
    return p.SerializeToString()


def _ddata(seq: int, temp: float) -> bytes:
    p = pb.Payload(timestamp=T0 + seq, seq=seq)
    p.metrics.add(alias=10, double_value=temp, timestamp=T0 + seq)
    return p.SerializeToString()


async def test_metrics_become_typed_rows_with_aliases_resolved(store: EmbeddedStore, tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    await store.append([
        _msg("spBv1.0/plant/NBIRTH/edge1", _nbirth(), T0),
        _msg("spBv1.0/plant/DBIRTH/edge1/pump", _dbirth(), T0 + 1),
        _msg("other/topic", b'{"temp": 1}', T0 + 2),
        _msg("spBv1.0/plant/DDATA/edge1/pump", _ddata(2, 21.5), T0 + 3),
        _msg("spBv1.0/plant/DDATA/edge1/pump", b"\xff\xff\xff not protobuf", T0 + 4),  # malformed
        _msg("spBv1.0/plant/DDATA/edge1/pump", _ddata(3, 22.5), T0 + HOUR),  # the next hour
    ])
    b = _bridge(store, lake)
    await asyncio.wait_for(b.run(once=True), 20)

    assert read_lake(lake).num_rows == 6  # every message, the malformed one too, as an ordinary row
    table = read_lake(lake, SPARKPLUG)
    assert table.schema.remove(table.schema.get_field_index("dt")).remove(
        table.schema.get_field_index("hour") - 1) == SPARKPLUG_SCHEMA
    rows = sorted(table.to_pylist(), key=lambda r: (r["position"], r["metric"]))
    assert [(r["position"], r["message_type"], r["device"], r["metric"], r["alias"]) for r in rows] == [
        (1, "NBIRTH", None, "Node Control/Rebirth", 1), (1, "NBIRTH", None, "bdSeq", 0),
        (2, "DBIRTH", "pump", "rpm", 11), (2, "DBIRTH", "pump", "temp", 10),
        (4, "DDATA", "pump", "temp", 10), (6, "DDATA", "pump", "temp", 10)]
    data = rows[4]
    assert (data["datatype"], data["double_value"], data["seq"], data["group_id"], data["edge_node"]) == (
        "Double", 21.5, 2, "plant", "edge1")
    assert data["metric_timestamp"].timestamp() * 1000 == T0 + 2
    assert rows[2]["int_value"] == 1200 and rows[0]["boolean_value"] is False and rows[1]["long_value"] == 0
    assert sorted({(r["dt"], r["hour"]) for r in rows}) == [("2023-11-14", 22), ("2023-11-14", 23)]
    stats = b.stats()["sparkplug"]
    assert stats == {"rows": 6, "malformed": 1, "unresolved": 0}
    checkpoint = json.loads((lake / "_tidewire" / "checkpoint-p00.json").read_text())
    assert (checkpoint["sparkplug_rows"], checkpoint["sparkplug_malformed"]) == (6, 1)

    # A bridge started later (here under another owner, as another node's) knows the births exported before:
    # they are behind the checkpoint now, and only in the saved book.
    assert [p.name for p in (lake / "_tidewire").glob("sparkplug-births-*.json")] == ["sparkplug-births-test.json"]
    await store.append([_msg("spBv1.0/plant/DDATA/edge1/pump", _ddata(4, 23.5), T0 + HOUR + 1)])
    await asyncio.wait_for(_bridge(store, lake, owner="node/2").run(once=True), 20)
    last = [r for r in read_lake(lake, SPARKPLUG).to_pylist() if r["position"] == 7]
    assert [(r["metric"], r["datatype"], r["double_value"]) for r in last] == [("temp", "Double", 23.5)]

    # Compaction rewrites the closed hour's sparkplug files too, every row kept once.
    before = sorted((r["position"], r["metric"]) for r in read_lake(lake, SPARKPLUG).to_pylist())
    stats_c = compact_lake(lake, older_than_ms=0, target_bytes=1 << 20, grace_ms=0, clock=lambda: T0 / 1000 + 3 * 3600)
    assert stats_c.outputs >= 2  # messages and sparkplug of the first hour at least
    assert any(p.name.startswith("c-") for p in published_files(lake, SPARKPLUG))
    assert sorted((r["position"], r["metric"]) for r in read_lake(lake, SPARKPLUG).to_pylist()) == before
    assert tmp_files(lake) == []

    # Retention removes the table's days with the messages'.
    run = remove_expired(lake, 1, T0 + 3 * 24 * HOUR)
    assert {"messages/dt=2023-11-14", "sparkplug/dt=2023-11-14"} <= set(run.removed)
    assert read_lake(lake, SPARKPLUG).num_rows == 0
