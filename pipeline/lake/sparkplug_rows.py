"""The `sparkplug` table of a flush: the Sparkplug B messages among its log records decoded, one row per metric.

Records whose topic is not in the `spBv1.0/` namespace cost a prefix check. The aliases of DATA metrics are
resolved from the `AliasBook` the bridge shares between its partitions (births learnt in log order within a
partition; a birth in another partition is known once that partition's flush built it), and the book is kept
in `<lake>/_tidewire/sparkplug-births-<owner>.json` (one file per bridge owner, so the bridges of a cluster never
write one file; a bridge starts from all of them, newer files last) so a restarted bridge still knows the births
before its checkpoint.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from tidewire.pipeline.lake.schema import SPARKPLUG_SCHEMA, STATE_DIR
from tidewire.pipeline.sparkplug.decode import AliasBook, MalformedPayload
from tidewire.pipeline.sparkplug.topics import PREFIX, parse_topic
from tidewire.store.log_reader import LogRecord

log = logging.getLogger(__name__)

BOOK_PREFIX = "sparkplug-births-"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


@dataclass(slots=True)
class SparkplugBatch:
    table: pa.Table
    malformed: int = 0  # Sparkplug topics whose payload did not decode
    unresolved: int = 0  # DATA metrics sent by an alias no birth named


def sparkplug_table(records: list[LogRecord], book: AliasBook) -> SparkplugBatch:
    """The SPARKPLUG_SCHEMA rows of `records` (in their order) and what could not be decoded."""
    columns: list[list[Any]] = [[] for _ in SPARKPLUG_SCHEMA]
    malformed = unresolved = 0
    for r in records:
        if not r.topic.startswith(PREFIX):
            continue
        topic = parse_topic(r.topic)
        if topic is None:
            continue
        try:
            decoded = book.decode(topic, r.payload)
        except MalformedPayload as e:
            malformed += 1
            log.warning("lake: sparkplug: %s at position %d is not a Sparkplug B payload: %s", r.topic,
                        r.position, e)
            continue
        unresolved += decoded.unresolved
        head = (r.position, r.partition, r.received_ms, topic.group, topic.edge_node, topic.device,
                topic.message_type, decoded.seq, decoded.timestamp_ms)
        for metric in decoded.metrics:
            for column, value in zip(columns, (*head, *metric), strict=True):
                column.append(value)
    arrays = [pa.array(values, f.type) for values, f in zip(columns, SPARKPLUG_SCHEMA, strict=True)]
    return SparkplugBatch(pa.Table.from_arrays(arrays, schema=SPARKPLUG_SCHEMA), malformed, unresolved)


def book_path(lake: Path, owner: str) -> Path:
    return lake / STATE_DIR / f"{BOOK_PREFIX}{_UNSAFE.sub('_', owner)}.json"


def load_book(lake: Path, book: AliasBook) -> None:
    """Fill `book` from the births the lake's bridges saved, the newest file last (none: it starts empty; an
    unreadable file is skipped)."""
    def mtime(path: Path) -> float:
        try:
            return path.stat().st_mtime
        except FileNotFoundError:
            return 0.0

    for path in sorted((lake / STATE_DIR).glob(f"{BOOK_PREFIX}*.json"), key=mtime):
        try:
            book.load_json(json.loads(path.read_text()))
        except FileNotFoundError:
            continue
        except (ValueError, TypeError, KeyError, IndexError) as e:
            log.warning("lake: sparkplug: %s unreadable (%s): skipped", path, e)
