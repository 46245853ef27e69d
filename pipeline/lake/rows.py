"""Log records and gateway events -> Arrow tables of the lake's schemas (the bridge's CPU cost: built by column).

JSON detection: a payload is JSON when it decodes as UTF-8 and parses as one strict JSON value (no NaN/Infinity);
`payload_json` is then the text, else null. `json_numbers` holds the numeric leaves (int or float, never bool) of
a JSON object by dotted path, descending into nested objects only (lists are skipped), at most `MAX_JSON_NUMBERS`
per message; a payload that is a bare JSON number has it under the empty path ""; any other JSON value (string,
list, true/false/null) gives an empty map; a payload that is not JSON gives null.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from tidewire.pipeline.lake.schema import EVENTS_SCHEMA, MESSAGES_SCHEMA, USER_PROPERTIES
from tidewire.store.log_reader import LogRecord
from tidewire.store.properties import Properties

try:  # msgspec parses JSON ~3x faster than the stdlib; the results are the same for everything but huge numbers
    import msgspec

    # msgspec checks UTF-8 as it parses (JSON outside strings is ASCII): a parsed payload is valid text.
    _decode: Callable[[bytes], Any] = msgspec.json.decode
    _JSON_ERRORS: tuple[type[Exception], ...] = (UnicodeDecodeError, msgspec.MsgspecError, ValueError)
except ImportError:  # pragma: no cover - depends on the installed extras
    def _no_constants(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    def _decode(data: bytes) -> Any:
        return json.loads(data.decode(), parse_constant=_no_constants)

    _JSON_ERRORS = (UnicodeDecodeError, ValueError, RecursionError)

MAX_JSON_NUMBERS = 256  # numeric fields kept per message
MAX_JSON_DEPTH = 16  # nested objects followed below the top level
MAX_JSON_BYTES = 1 << 20  # larger payloads are not parsed (payload_json/json_numbers null): bounded CPU per row

# A JSON text starts (after optional whitespace) with one of these bytes: anything else is skipped without a parse.
_JSON_START = frozenset(b' \t\r\n{["-0123456789tfn')
_TS = pa.timestamp("ms", tz="UTC")
_NUMBERS_TYPE = MESSAGES_SCHEMA.field("json_numbers").type
_USER_STRUCT = USER_PROPERTIES.value_type


def _numbers(obj: dict[Any, Any], prefix: str, keys: list[str], values: list[float], depth: int) -> None:
    for k, v in obj.items():
        t = type(v)
        if t is float:
            keys.append(prefix + k)
            values.append(v)
        elif t is int:  # bool is its own type: excluded
            try:
                f = float(v)
            except OverflowError:
                continue
            keys.append(prefix + k)
            values.append(f)
        elif t is dict and depth < MAX_JSON_DEPTH:
            _numbers(v, prefix + k + ".", keys, values, depth + 1)


def _top_numbers(obj: dict[Any, Any], keys: list[str], values: list[float]) -> None:
    # The common case (flat telemetry) inlined; anything unusual goes the general way.
    base = len(keys)
    try:
        for k, v in obj.items():
            t = type(v)
            if t is float:
                keys.append(k)
                values.append(v)
            elif t is int:
                values.append(float(v))
                keys.append(k)
            elif t is dict:
                _numbers(v, k + ".", keys, values, 1)
    except OverflowError:  # an integer beyond float range: start over, skipping such leaves
        del keys[base:], values[base:]
        _numbers(obj, "", keys, values, 0)


def json_columns(payloads: Sequence[bytes], cap: int = MAX_JSON_NUMBERS,
                 binary: pa.Array | None = None) -> tuple[pa.Array, pa.Array]:
    """The `payload_json` and `json_numbers` columns for these payloads (`binary`: them as a binary array already,
    whose buffers `payload_json` then shares)."""
    offsets: list[int] = [0]
    mask: list[bool] = []
    keys: list[str] = []
    values: list[float] = []
    start = _JSON_START
    any_null = False
    for p in payloads:
        ok = False
        if p and p[0] in start and len(p) <= MAX_JSON_BYTES:
            try:
                obj = _decode(p)
                ok = True
            except _JSON_ERRORS:
                pass
        if not ok:
            mask.append(True)
            any_null = True
        else:
            mask.append(False)
            t = type(obj)
            if t is dict:
                _top_numbers(obj, keys, values)
                if len(keys) - offsets[-1] > cap:
                    del keys[offsets[-1] + cap:], values[offsets[-1] + cap:]
            elif (t is int or t is float) and cap > 0:
                try:
                    values.append(float(obj))
                    keys.append("")
                except OverflowError:
                    pass
        offsets.append(len(keys))
    mask_arr = pa.array(mask, pa.bool_()) if any_null else None
    numbers = pa.MapArray.from_arrays(
        pa.array(offsets, pa.int32()), pa.array(keys, pa.string()), pa.array(values, pa.float64()),
        type=_NUMBERS_TYPE, mask=mask_arr)
    if binary is None:
        binary = pa.array(payloads, pa.binary())
    # The JSON payloads are valid UTF-8: the text column is the binary one's buffers under a validity bitmap.
    if binary.offset or binary.null_count:
        binary = pa.concat_arrays([binary])  # buffers from offset 0 (cannot happen for a fresh array)
    bufs = binary.buffers()
    valid_bits = pc.invert(mask_arr).buffers()[1] if mask_arr is not None else None
    text = pa.Array.from_buffers(pa.string(), len(binary), [valid_bits, bufs[1], bufs[2]],
                                 null_count=mask.count(True) if any_null else 0)
    return text, numbers


def _user_properties(props: Sequence[Properties]) -> pa.Array:
    offsets = [0]
    keys: list[str] = []
    values: list[str] = []
    for p in props:
        if p.user:
            for k, v in p.user:
                keys.append(k)
                values.append(v)
        offsets.append(len(keys))
    entries = pa.StructArray.from_arrays(
        [pa.array(keys, pa.string()), pa.array(values, pa.string())], fields=list(_USER_STRUCT))
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), entries, type=USER_PROPERTIES)


def messages_table(records: Sequence[LogRecord], json_cap: int = MAX_JSON_NUMBERS) -> pa.Table:
    """A MESSAGES_SCHEMA table of `records`, in their order."""
    payloads = [r.payload for r in records]
    props = [r.properties for r in records]
    binary = pa.array(payloads, pa.binary())
    payload_json, json_numbers = json_columns(payloads, json_cap, binary)
    columns = [
        pa.array([r.position for r in records], pa.int64()),
        pa.array([r.partition for r in records], pa.int32()),
        pa.array([r.received_ms for r in records], _TS),
        pa.array([r.topic for r in records], pa.string()),
        pa.array([r.first_level for r in records], pa.string()),
        pa.array([r.client_id for r in records], pa.string()),
        pa.array([r.protocol for r in records], pa.string()),
        pa.array([r.qos for r in records], pa.int8()),
        pa.array([r.retain for r in records], pa.bool_()),
        pa.array([len(p) for p in payloads], pa.int32()),
        binary,
        payload_json,
        json_numbers,
        pa.array([p.content_type for p in props], pa.string()),
        pa.array([p.correlation_data for p in props], pa.binary()),
        pa.array([p.response_topic for p in props], pa.string()),
        _user_properties(props),
        pa.array([p.utf8_payload for p in props], pa.bool_()),
        pa.array([r.expires_at_ms or None for r in records], _TS),
    ]
    return pa.Table.from_arrays(columns, schema=MESSAGES_SCHEMA)


# gateway.core.event_buffer.Event: (event, time_ms, client_id, protocol, topic, position, qos, dup, reason, detail,
# consumer_group, consumer_tag)
EventTuple = tuple[str, int, str, str, str | None, int | None, int | None, bool, str | None, str | None, str | None,
                   str | None]


def events_table(events: Iterable[EventTuple], node: str) -> pa.Table:
    """An EVENTS_SCHEMA table of gateway events (tuples as `gateway.core.event_buffer.EventBuffer.drain` returns
    them)."""
    rows = list(events)
    if not rows:
        return EVENTS_SCHEMA.empty_table()
    event, time_ms, client_id, protocol, topic, position, qos, dup, reason, detail, group, tag = zip(*rows, strict=True)
    columns = [
        pa.array(time_ms, _TS),
        pa.array(event, pa.string()),
        pa.repeat(node, len(rows)).cast(pa.string()),
        pa.array(client_id, pa.string()),
        pa.array(protocol, pa.string()),
        pa.array(topic, pa.string()),
        pa.array(position, pa.int64()),
        pa.array(qos, pa.int8()),
        pa.array(dup, pa.bool_()),
        pa.array(reason, pa.string()),
        pa.array(detail, pa.string()),
        pa.array(group, pa.string()),
        pa.array(tag, pa.string()),
    ]
    return pa.Table.from_arrays(columns, schema=EVENTS_SCHEMA)
