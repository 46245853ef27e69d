"""rows.py: log records and events -> Arrow tables of the lake's schemas."""

from __future__ import annotations

import json

import pyarrow as pa

from tests.pipeline.lake.support import record
from tidewire.pipeline.lake.rows import MAX_JSON_NUMBERS, events_table, json_columns, messages_table
from tidewire.pipeline.lake.schema import EVENTS_SCHEMA, MESSAGES_SCHEMA
from tidewire.store.properties import Properties


def _json(payloads: list[bytes]) -> tuple[list[str | None], list[dict[str, float] | None]]:
    text, numbers = json_columns(payloads)
    maps = [None if m is None else dict(m) for m in numbers.to_pylist()]
    return text.to_pylist(), maps


def test_json_detection() -> None:
    payloads = [
        b'{"t": 21.5, "n": 3, "ok": true, "s": "x", "l": [1, 2], "nested": {"a": {"b": -1e3}, "z": null}}',
        b"[1, 2, 3]",
        b"42",
        b" 1.5 ",
        b'"just a string"',
        b"null",
        b"hello",  # not JSON
        b"",
        b"\xff\xfe{}",  # not UTF-8
        b'{"a": 1',  # truncated
        b"NaN",  # not strict JSON
        b'{"a": NaN}',
        '{"température": 20, "ü": {"x": 1}}'.encode(),
        b'{"big": 1' + b"0" * 400 + b', "small": 2}',  # an integer beyond float range is skipped
    ]
    text, maps = _json(payloads)
    assert text[0] is not None and json.loads(text[0])["t"] == 21.5
    assert maps[0] == {"t": 21.5, "n": 3.0, "nested.a.b": -1000.0}
    assert (text[1], maps[1]) == ("[1, 2, 3]", {})
    assert maps[2] == {"": 42.0} and maps[3] == {"": 1.5}
    assert (text[4], maps[4]) == ('"just a string"', {})
    assert (text[5], maps[5]) == ("null", {})
    for i in range(6, 12):
        assert (text[i], maps[i]) == (None, None), payloads[i]
    assert text[12] == '{"température": 20, "ü": {"x": 1}}'
    assert maps[12] == {"température": 20.0, "ü.x": 1.0}
    assert maps[13] == {"small": 2.0}


def test_json_numbers_are_capped_in_document_order() -> None:
    obj = {f"k{i}": i for i in range(MAX_JSON_NUMBERS + 50)}
    nested = {"a": {f"k{i}": i for i in range(MAX_JSON_NUMBERS + 50)}}
    _, maps = _json([json.dumps(obj).encode(), json.dumps(nested).encode(), b'{"x": 1}'])
    assert maps[0] is not None and len(maps[0]) == MAX_JSON_NUMBERS
    assert maps[0]["k0"] == 0 and f"k{MAX_JSON_NUMBERS - 1}" in maps[0] and f"k{MAX_JSON_NUMBERS}" not in maps[0]
    assert maps[1] is not None and len(maps[1]) == MAX_JSON_NUMBERS and maps[1]["a.k0"] == 0
    assert maps[2] == {"x": 1.0}  # the next row starts clean


def test_messages_table_columns() -> None:
    props = Properties(content_type="application/json", correlation_data=b"\x00\x01", response_topic="r/1",
                       user=[("k", "v"), ("k", "w")], utf8_payload=True)
    recs = [
        record(7, received_ms=1_700_000_000_123, topic="sensors/d1/t", client_id="d1", qos=1,
               payload=b'{"temperature": 81}', properties=props, expires_at_ms=1_700_000_060_000),
        record(9, partition=2, received_ms=1_700_000_000_456, topic="/x", client_id="", protocol="amqp",
               payload=b"\x00binary", retain=True),
    ]
    table = messages_table(recs)
    assert table.schema == MESSAGES_SCHEMA
    rows = table.to_pylist()
    a, b = rows
    assert a["position"] == 7 and a["partition"] == 0 and a["topic"] == "sensors/d1/t"
    assert a["first_level"] == "sensors" and b["first_level"] == ""
    assert a["received_at"].timestamp() * 1000 == 1_700_000_000_123
    assert a["client_id"] == "d1" and a["protocol"] == "mqtt" and a["qos"] == 1 and a["retain"] is False
    assert a["payload_size"] == 19 and a["payload"] == b'{"temperature": 81}'
    assert a["payload_json"] == '{"temperature": 81}' and dict(a["json_numbers"]) == {"temperature": 81.0}
    assert a["content_type"] == "application/json" and a["correlation_data"] == b"\x00\x01"
    assert a["response_topic"] == "r/1" and a["utf8_payload"] is True
    assert a["user_properties"] == [{"key": "k", "value": "v"}, {"key": "k", "value": "w"}]
    assert a["expires_at"].timestamp() * 1000 == 1_700_000_060_000
    assert b["partition"] == 2 and b["protocol"] == "amqp" and b["retain"] is True and b["payload_size"] == 7
    assert b["payload_json"] is None and b["json_numbers"] is None
    assert b["content_type"] is None and b["correlation_data"] is None and b["response_topic"] is None
    assert b["user_properties"] == [] and b["utf8_payload"] is False and b["expires_at"] is None
    assert messages_table([]).num_rows == 0


def test_payload_json_shares_the_payload_buffers() -> None:
    payloads = [b'{"a": 1}', b"nope", b"[2]"] * 1000
    table = messages_table([record(i + 1, payload=p) for i, p in enumerate(payloads)])
    col = table.column("payload_json").combine_chunks()
    col.validate(full=True)
    assert col.to_pylist()[:3] == ['{"a": 1}', None, "[2]"] and col.null_count == 1000


def test_events_table() -> None:
    events = [
        ("connected", 1_700_000_000_000, "d1", "mqtt", None, None, None, False, None, "alice", None, None),
        ("delivered", 1_700_000_000_005, "d2", "amqp", "a/b", 12, None, True, None, None, "q1", "ctag-1"),
    ]
    table = events_table(events, "node-1")
    assert table.schema == EVENTS_SCHEMA
    rows = table.to_pylist()
    assert rows[0]["event"] == "connected" and rows[0]["node"] == "node-1" and rows[0]["detail"] == "alice"
    assert rows[0]["topic"] is None and rows[0]["position"] is None and rows[0]["qos"] is None
    assert rows[1]["time"].timestamp() * 1000 == 1_700_000_000_005
    assert (rows[1]["position"], rows[1]["qos"], rows[1]["dup"], rows[1]["protocol"]) == (12, None, True, "amqp")
    assert (rows[1]["consumer_group"], rows[1]["consumer_tag"]) == ("q1", "ctag-1")
    assert rows[0]["consumer_group"] is None and rows[0]["consumer_tag"] is None
    assert events_table([], "n").schema == EVENTS_SCHEMA and isinstance(events_table([], "n"), pa.Table)
