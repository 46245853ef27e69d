"""Sparkplug B payloads decoded into one row per metric, with the aliases of DATA metrics resolved from the
last birth (`AliasBook`).

Values land in the column of their Sparkplug datatype: `int_value` (int32: Int8, Int16, Int32, UInt8, UInt16;
signed types read from the low 8/16/32 bits, so both two's-complement encodings in use decode alike),
`long_value` (int64: Int64, UInt32, UInt64, DateTime as ms; a UInt64 above 2^63-1 goes to `string_value` as
decimal text), `float_value` (Float), `double_value` (Double), `boolean_value`, `string_value` (String, Text,
UUID), `bytes_value` (Bytes, File, and the 3.0 arrays, which are packed into bytes). DataSet, Template and
PropertySet metrics keep their datatype and no value (the raw payload stays in the `messages` table). A metric
with `is_null` has every value column null. A metric without a datatype (a DATA metric whose birth was not seen)
goes by the protobuf field that holds its value. Timestamps outside [0, year 10000) are null.

A payload that does not parse as a `Payload` (or holds text that is not UTF-8) is malformed: `decode_metrics`
raises `MalformedPayload`, and the caller counts it and keeps the message as an ordinary row.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, NamedTuple

from google.protobuf.message import DecodeError

from tidewire.errors import TidewireError
from tidewire.pipeline.sparkplug import sparkplug_b_pb2 as pb
from tidewire.pipeline.sparkplug.topics import BIRTHS, DBIRTH, NBIRTH, SparkplugTopic

MAX_BOOK_KEYS = 50_000  # edge nodes and devices whose last birth the book holds (the oldest is forgotten)
MAX_TIMESTAMP_MS = 253_402_300_800_000  # 10000-01-01: later (or garbage) timestamps are null
INT64_MAX = (1 << 63) - 1

DATATYPE_NAMES: dict[int, str] = {v.number: v.name for v in pb.DataType.DESCRIPTOR.values}
_INT32_TYPES = {1: 8, 2: 16, 3: 32, 5: 0, 6: 0}  # Int8, Int16, Int32 (signed: bits), UInt8, UInt16
_LONG_TYPES = frozenset((4, 7, 8, 13))  # Int64, UInt32, UInt64, DateTime
_STRING_TYPES = frozenset((12, 14, 15))  # String, Text, UUID
_BYTES_TYPES = frozenset((17, 18, *range(22, 35)))  # Bytes, File, the arrays
FLOAT, DOUBLE, BOOLEAN = 9, 10, 11


class MalformedPayload(TidewireError, ValueError):
    """The payload of a Sparkplug B topic is not a Sparkplug B payload."""


class MetricRow(NamedTuple):
    name: str | None
    alias: int | None
    datatype: str | None
    is_null: bool
    is_historical: bool
    is_transient: bool
    timestamp_ms: int | None
    int_value: int | None
    long_value: int | None
    float_value: float | None
    double_value: float | None
    boolean_value: bool | None
    string_value: str | None
    bytes_value: bytes | None


class Decoded(NamedTuple):
    seq: int | None
    timestamp_ms: int | None
    metrics: list[MetricRow]
    unresolved: int  # DATA metrics sent by an alias the book did not know


def _ts(value: int) -> int | None:
    return value if 0 <= value < MAX_TIMESTAMP_MS else None


def _signed(value: int, bits: int) -> int:
    value &= (1 << bits) - 1
    return value - (1 << bits) if value >> (bits - 1) else value


def _text(value: str | bytes) -> str:
    # proto2 strings are not checked by the parser: the runtime hands text that is not UTF-8 over as bytes
    if not isinstance(value, str):
        raise ValueError("a string field is not UTF-8")
    value.encode()  # a lone surrogate raises here, not later in Arrow
    return value


_NO_VALUE = (None, None, None, None, None, None, None)


def _value(metric: Any, datatype: int | None) -> tuple[Any, ...]:
    """(int, long, float, double, boolean, string, bytes) of a metric."""
    kind = metric.WhichOneof("value")
    if kind is None or (metric.HasField("is_null") and metric.is_null):
        return _NO_VALUE
    raw = getattr(metric, kind)
    if kind in ("int_value", "long_value"):
        if datatype in _INT32_TYPES:
            bits = _INT32_TYPES[datatype]
            v = _signed(raw, bits) if bits else raw
            if -(1 << 31) <= v < (1 << 31):
                return (v, None, None, None, None, None, None)
        if datatype == 4:  # Int64: two's complement in a uint64
            return (None, _signed(raw, 64), None, None, None, None, None)
        if raw <= INT64_MAX:
            return (None, raw, None, None, None, None, None)
        return (None, None, None, None, None, str(raw), None)
    if kind == "float_value":
        return (None, None, raw, None, None, None, None) if datatype != DOUBLE else (
            None, None, None, raw, None, None, None)
    if kind == "double_value":
        return (None, None, raw, None, None, None, None) if datatype == FLOAT else (
            None, None, None, raw, None, None, None)
    if kind == "boolean_value":
        return (None, None, None, None, raw, None, None)
    if kind == "string_value":
        return (None, None, None, None, None, _text(raw), None)
    if kind == "bytes_value":
        return (None, None, None, None, None, None, raw)
    return _NO_VALUE  # DataSet, Template, an extension


class _Birth:
    __slots__ = ("aliases", "names")

    def __init__(self) -> None:
        self.aliases: dict[int, tuple[str, int | None]] = {}
        self.names: dict[str, int | None] = {}


class AliasBook:
    """The last birth of each edge node and device: alias -> (name, datatype), and name -> datatype, so a DATA
    metric sent by alias (or without its datatype) is read as its birth declared it. A device's DATA metric is
    looked up in its DBIRTH, then in its edge node's NBIRTH. An NBIRTH starts the edge node's session anew: its
    devices' births are forgotten until they are sent again. Holds at most `max_keys` births (the oldest go).

    Thread-safe: the partitions of a lake bridge build their tables in worker threads and share one book."""

    def __init__(self, max_keys: int = MAX_BOOK_KEYS) -> None:
        self.max_keys = max_keys
        self._births: OrderedDict[tuple[str, str, str], _Birth] = OrderedDict()
        self._lock = threading.Lock()
        self.changed = False  # since the last `to_json`

    def __len__(self) -> int:
        return len(self._births)

    def _learn(self, key: tuple[str, str, str], metrics: Any, node_birth: bool) -> None:
        birth = _Birth()
        for m in metrics:
            if not m.HasField("name"):
                continue
            name = _text(m.name)
            datatype = m.datatype if m.HasField("datatype") else None
            birth.names[name] = datatype
            if m.HasField("alias"):
                birth.aliases[m.alias] = (name, datatype)
        with self._lock:
            if node_birth:
                group, edge, _ = key
                for k in [k for k in self._births if k[0] == group and k[1] == edge]:
                    del self._births[k]
            self._births.pop(key, None)
            self._births[key] = birth
            while len(self._births) > self.max_keys:
                self._births.popitem(last=False)
            self.changed = True

    def _lookup(self, topic: SparkplugTopic) -> list[_Birth]:
        with self._lock:
            found = []
            if topic.device is not None:
                b = self._births.get((topic.group, topic.edge_node, topic.device))
                if b is not None:
                    found.append(b)
            b = self._births.get((topic.group, topic.edge_node, ""))
            if b is not None:
                found.append(b)
            return found

    def to_json(self) -> dict[str, Any]:
        with self._lock:
            self.changed = False
            return {"births": [[list(k), [[a, n, d] for a, (n, d) in b.aliases.items()],
                                [[n, d] for n, d in b.names.items()]] for k, b in self._births.items()]}

    def load_json(self, obj: dict[str, Any]) -> None:
        """Add the births of a `to_json` dump (a birth already held is replaced)."""
        with self._lock:
            for key, aliases, names in obj.get("births", []):
                b = _Birth()
                b.aliases = {int(a): (str(n), d) for a, n, d in aliases}
                b.names = {str(n): d for n, d in names}
                k = (str(key[0]), str(key[1]), str(key[2]))
                self._births.pop(k, None)
                self._births[k] = b
            while len(self._births) > self.max_keys:
                self._births.popitem(last=False)

    def decode(self, topic: SparkplugTopic, payload: bytes) -> Decoded:
        """The metrics of one message on `topic`; a birth is learnt first. Raises `MalformedPayload`."""
        message = pb.Payload()
        try:
            message.ParseFromString(payload)
            metrics = message.metrics
            if topic.message_type in BIRTHS:
                self._learn((topic.group, topic.edge_node, topic.device or ""), metrics,
                            topic.message_type == NBIRTH)
                births: list[_Birth] = []
            else:
                births = self._lookup(topic)
            rows: list[MetricRow] = []
            unresolved = 0
            for m in metrics:
                name = _text(m.name) if m.HasField("name") else None
                alias = m.alias if m.HasField("alias") else None
                datatype = m.datatype if m.HasField("datatype") else None
                if births and (name is None or datatype is None):
                    for b in births:
                        if name is None and alias is not None and alias in b.aliases:
                            name, declared = b.aliases[alias]
                        elif name is not None and name in b.names:
                            declared = b.names[name]
                        else:
                            continue
                        datatype = datatype if datatype is not None else declared
                        break
                if name is None and alias is not None:
                    unresolved += 1
                is_null = m.HasField("is_null") and m.is_null
                rows.append(MetricRow(
                    name, alias if alias is None or alias <= INT64_MAX else None,
                    None if datatype is None else DATATYPE_NAMES.get(datatype, f"Unknown({datatype})"),
                    is_null, m.is_historical, m.is_transient,
                    _ts(m.timestamp) if m.HasField("timestamp") else None,
                    *_value(m, datatype)))
            seq = message.seq if message.HasField("seq") and message.seq <= INT64_MAX else None
            ts = _ts(message.timestamp) if message.HasField("timestamp") else None
        except (DecodeError, UnicodeError, ValueError, RecursionError) as e:
            raise MalformedPayload(str(e) or type(e).__name__) from e
        return Decoded(seq, ts, rows, unresolved)


__all__ = ["DBIRTH", "AliasBook", "Decoded", "MalformedPayload", "MetricRow"]
