"""Helpers of the lake tests: log records built by hand, and reading the lake back."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa

from tidewire.pipeline.lake import reading
from tidewire.store.base import PROTOCOL_AMQP, PROTOCOL_MQTT, Message
from tidewire.store.log_reader import LogRecord
from tidewire.store.properties import Properties


def record(position: int, *, partition: int = 0, received_ms: int = 1_700_000_000_000, topic: str = "t/x",
           client_id: str = "c", protocol: str = "mqtt", qos: int = 0, retain: bool = False, payload: bytes = b"",
           expires_at_ms: int = 0, properties: Properties | None = None) -> LogRecord:
    return LogRecord(position, partition, received_ms, topic, topic.split("/", 1)[0], client_id, protocol, qos,
                      retain, payload, expires_at_ms, properties or Properties())


def read_lake(lake: Path, table: str = "messages") -> pa.Table:
    """Every committed file of `table`, as the jobs read it (`pipeline.lake.reading`: hive partitions, hidden
    files skipped, files a compaction replaced left out)."""
    root = lake / table
    if not root.exists():
        return pa.table({})
    return reading.dataset(lake, table).to_table()


def published_files(lake: Path, table: str = "messages") -> list[Path]:
    return sorted(p for p in (lake / table).rglob("*.parquet") if not p.name.startswith("."))


def tmp_files(lake: Path) -> list[Path]:
    return sorted(p for p in lake.rglob(".*.tmp"))


H = 3_600_000
T0 = 1_700_000_000_000 // H * H + 2 * H - 60_000  # 2023-11-14 23:59 UTC: the export spans a day boundary


def messages(n: int, start: int = 0) -> list[Message]:  # one every 3.6 s
    props = Properties(content_type="application/json", user=[("site", "a")]).to_block()
    return [Message(f"sensors/d{i % 7}/t", json.dumps({"temperature": i % 100, "n": {"i": i}}).encode(),
                    qos=i % 2, properties=props if i % 3 == 0 else b"", timestamp_ms=T0 + i * 3600,
                    publisher=f"d{i % 7}", protocol=PROTOCOL_AMQP if i % 5 == 0 else PROTOCOL_MQTT)
            for i in range(start, start + n)]


def assert_once(lake: Path, upto: int) -> None:
    positions = read_lake(lake).column("position").to_pylist()
    assert len(positions) == upto and sorted(positions) == list(range(1, upto + 1))
