"""Fixtures for the pipeline tests: one local SparkSession for the whole session (Spark starts in ~10 s, so it
is started once and shared), writers of synthetic lake files in the lake's layout and schemas, and the
integration suite's real gateway and paho fixtures."""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.integration.conftest import gateway, gateway_factory, paho_factory  # noqa: F401  (fixtures)
from tidewire.pipeline.lake.schema import EVENTS, EVENTS_SCHEMA, FORMAT_VERSION, MESSAGES, MESSAGES_SCHEMA

UTC = dt.UTC
T0 = dt.datetime(2024, 5, 1, 10, 0, 0, tzinfo=UTC)  # the synthetic lakes' clock starts here


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from tidewire.pipeline.spark import spark_session

    session = spark_session("local[2]", app="tidewire-tests", shuffle_partitions=2)
    yield session
    session.stop()


def at(seconds: float) -> dt.datetime:
    """T0 + seconds."""
    return T0 + dt.timedelta(seconds=seconds)


def message(position: int, seconds: float, client_id: str, topic: str, numbers: dict[str, float] | None = None,
            size: int = 10, **extra: Any) -> dict[str, Any]:
    """One messages row received at T0 + `seconds`; `numbers` None: not JSON."""
    return {"position": position, "partition": 0, "received_at": at(seconds), "topic": topic,
            "first_level": topic.split("/", 1)[0], "client_id": client_id, "protocol": "mqtt", "qos": 1,
            "retain": False, "payload_size": size, "payload": b"x" * size,
            "json_numbers": None if numbers is None else list(numbers.items()), "utf8_payload": False, **extra}


def event(name: str, seconds: float, client_id: str, topic: str | None = None, position: int | None = None,
          dup: bool = False, reason: str | None = None) -> dict[str, Any]:
    return {"time": at(seconds), "event": name, "node": "n1", "client_id": client_id, "protocol": "mqtt",
            "topic": topic, "position": position, "qos": 1, "dup": dup, "reason": reason, "detail": None}


def _write(lake: Path, table: str, schema: pa.Schema, rows: Sequence[dict[str, Any]], time_field: str,
           name: str) -> list[Path]:
    """Rows split by dt/hour of `time_field`, one file per hour, written as the bridge does (dot name, rename)."""
    by_hour: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows:
        t = row[time_field]
        by_hour.setdefault((t.strftime("%Y-%m-%d"), t.strftime("%H")), []).append(row)
    paths = []
    for (day, hour), part in sorted(by_hour.items()):
        d = lake / table / f"dt={day}" / f"hour={hour}"
        d.mkdir(parents=True, exist_ok=True)
        tbl = pa.Table.from_pylist(part, schema=schema).replace_schema_metadata(
            {b"tidewire.lake.version": str(FORMAT_VERSION).encode()})
        tmp, final = d / f".{name}.parquet", d / f"{name}.parquet"
        pq.write_table(tbl, tmp)
        os.replace(tmp, final)
        paths.append(final)
    return paths


def write_messages(lake: Path, rows: Sequence[dict[str, Any]], name: str | None = None) -> list[Path]:
    positions = [r["position"] for r in rows]
    return _write(lake, MESSAGES, MESSAGES_SCHEMA, rows, "received_at",
                  name or f"0-{min(positions)}-{max(positions)}")


def write_events(lake: Path, rows: Sequence[dict[str, Any]], name: str = "n1-0-0") -> list[Path]:
    return _write(lake, EVENTS, EVENTS_SCHEMA, rows, "time", name)
