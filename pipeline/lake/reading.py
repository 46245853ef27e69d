"""How a reader finds the committed files of a lake table: the one listing every reader of the lake goes through.

Compaction (`pipeline.lake.compaction`) rewrites many small files of a closed hour into a few, and leaves the old
ones in place for a grace period, so that a reader that listed them earlier can still read them. The hour's
manifest `_compaction` (a leading `_`: Spark and pyarrow skip it) says which files each compacted output
replaces. The committed files of an hour are the visible files (no leading `.` or `_`) listed, minus the inputs of
every manifest entry whose output was listed.

Why this order makes a listing exact while compaction runs: the compactor records the entry before it renames
the output into place and deletes the inputs only a grace period after that; the reader lists the directory
first and reads the manifest second. A listing without the output keeps the inputs (present for the grace
period); a listing with the output was taken after the entry was written, so the manifest read after it has the
entry and drops the inputs. Either way every row once. A reader must finish within the grace period
(`lake_compact_grace`) of its listing.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tidewire.pipeline.lake.schema import EVENTS, EVENTS_SCHEMA, MESSAGES, MESSAGES_SCHEMA, SPARKPLUG, SPARKPLUG_SCHEMA

MANIFEST = "_compaction"
PARQUET = ".parquet"
# Compaction's message outputs start with `c-` (the bridge's with a digit): a stream that must read each row once
# (the aggregates job) skips them (Hadoop's glob `[!c]`); it must read the bridge's files within the grace period.
BRIDGE_FILES_GLOB = "[!c]*.parquet"


@dataclass(slots=True)
class Entry:
    """One committed compaction output and the files it replaces (names in the same hour directory)."""

    output: str
    inputs: list[str] = field(default_factory=list)
    committed_ms: int = 0
    deleted_ms: int = 0  # when the inputs were deleted (0: not yet); kept a grace period for earlier listings

    def to_json(self) -> dict[str, Any]:
        return {"output": self.output, "inputs": self.inputs, "committed_ms": self.committed_ms,
                "deleted_ms": self.deleted_ms}


def visible(name: str) -> bool:
    """A data file every reader sees: not hidden (`.` in progress, `_` state) and Parquet."""
    return name.endswith(PARQUET) and not name.startswith((".", "_"))


def read_manifest(hour: Path) -> list[Entry]:
    try:
        doc = json.loads((hour / MANIFEST).read_text())
    except FileNotFoundError:
        return []
    return [Entry(e["output"], list(e["inputs"]), int(e.get("committed_ms", 0)), int(e.get("deleted_ms", 0)))
            for e in doc.get("entries", [])]


def committed_in_hour(hour: Path) -> list[Path]:
    """The committed files of one `dt=/hour=` directory, sorted (see the module docstring for why it lists first
    and reads the manifest second)."""
    try:
        listed = {n for n in os.listdir(hour) if visible(n)}
    except FileNotFoundError:
        return []
    replaced: set[str] = set()
    for entry in read_manifest(hour):
        if entry.output in listed:
            replaced.update(entry.inputs)
    return [hour / n for n in sorted(listed - replaced)]


def hour_dirs(table_dir: Path) -> list[Path]:
    """Every `dt=YYYY-MM-DD/hour=HH` directory of a table, in time order."""
    out: list[Path] = []
    if not table_dir.is_dir():
        return out
    for dt in sorted(os.scandir(table_dir), key=lambda e: e.name):
        if dt.is_dir() and dt.name.startswith("dt="):
            out += [Path(h.path) for h in sorted(os.scandir(dt.path), key=lambda e: e.name)
                    if h.is_dir() and h.name.startswith("hour=")]
    return out


def committed_files(lake: str | Path, table: str) -> list[Path]:
    """Every committed file of `<lake>/<table>` (messages or events), in time order: what Spark, pyarrow or DuckDB
    should read (`read_parquet([...], hive_partitioning=true)`) instead of the whole directory."""
    files: list[Path] = []
    for hour in hour_dirs(Path(lake) / table):
        files += committed_in_hour(hour)
    return files


def dataset(lake: str | Path, table: str, schema: Any = None) -> Any:
    """The committed files of a table as a `pyarrow.dataset.Dataset` with `dt` and `hour` as columns."""
    import pyarrow.dataset as ds

    base = str(Path(lake) / table)
    files = [str(p) for p in committed_files(lake, table)]
    if not files and schema is None:  # an empty table still has its columns
        schema = {MESSAGES: MESSAGES_SCHEMA, EVENTS: EVENTS_SCHEMA, SPARKPLUG: SPARKPLUG_SCHEMA}[table]
    return ds.dataset(files, schema=schema, format="parquet", partitioning="hive", partition_base_dir=base)
