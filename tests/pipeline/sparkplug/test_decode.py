"""pipeline.sparkplug: topics parsed, payloads made with the reference protobuf module decoded into typed metric
rows, aliases resolved from the last birth, malformed payloads refused with MalformedPayload, not a crash."""

from __future__ import annotations

import pytest

from tidewire.pipeline.sparkplug import sparkplug_b_pb2 as pb
from tidewire.pipeline.sparkplug.decode import AliasBook, MalformedPayload, MetricRow
from tidewire.pipeline.sparkplug.topics import SparkplugTopic, parse_topic


def _topic(text: str) -> SparkplugTopic:
    parsed = parse_topic(text)
    assert parsed is not None
    return parsed


def test_topics() -> None:
    assert parse_topic("spBv1.0/plant/NBIRTH/edge1") == SparkplugTopic("plant", "NBIRTH", "edge1", None)
    assert parse_topic("spBv1.0/plant/DDATA/edge1/pump") == SparkplugTopic("plant", "DDATA", "edge1", "pump")
    for other in ["spBv1.0/plant/DDATA/edge1",  # a device type without its device
                  "spBv1.0/plant/NDATA/edge1/pump",  # a node type with one
                  "spBv1.0/plant/NBIRTH", "spBv1.0/plant/XDATA/e", "spBv1.0//NDATA/e", "spBv1.0/g/NDATA/",
                  "spBv1.0/STATE/host", "spAv1.0/g/NDATA/e", "a/b/c/d", "spBv1.0/g/DDATA/e/d/x"]:
        assert parse_topic(other) is None, other


def _birth() -> bytes:
    p = pb.Payload(timestamp=1_700_000_000_000, seq=0)
    p.metrics.add(name="bdSeq", alias=0, datatype=pb.Int64, long_value=(-2) & (2**64 - 1))
    p.metrics.add(name="temp", alias=1, datatype=pb.Double, double_value=21.5, timestamp=1_700_000_000_001)
    p.metrics.add(name="level", alias=2, datatype=pb.Float, float_value=0.25)
    p.metrics.add(name="small", alias=3, datatype=pb.Int8, int_value=(-5) & 0xFF)  # Tahu: value + 2**8
    p.metrics.add(name="small32", alias=4, datatype=pb.Int16, int_value=(-300) & 0xFFFFFFFF)  # 32-bit complement
    p.metrics.add(name="count", alias=5, datatype=pb.UInt32, int_value=4_000_000_000)
    p.metrics.add(name="huge", alias=6, datatype=pb.UInt64, long_value=2**64 - 1)
    p.metrics.add(name="on", alias=7, datatype=pb.Boolean, boolean_value=True)
    p.metrics.add(name="label", alias=8, datatype=pb.String, string_value="ünï")
    p.metrics.add(name="blob", alias=9, datatype=pb.Bytes, bytes_value=b"\x00\x01")
    p.metrics.add(name="when", alias=10, datatype=pb.DateTime, long_value=1_700_000_000_123)
    p.metrics.add(name="missing", alias=11, datatype=pb.Double, is_null=True)
    return p.SerializeToString()


def _by_name(rows: list[MetricRow]) -> dict[str | None, MetricRow]:
    return {r.name: r for r in rows}


def test_values_land_in_the_column_of_their_datatype() -> None:
    decoded = AliasBook().decode(_topic("spBv1.0/g/NBIRTH/e"), _birth())
    assert (decoded.seq, decoded.timestamp_ms, decoded.unresolved) == (0, 1_700_000_000_000, 0)
    m = _by_name(decoded.metrics)
    assert m["bdSeq"].long_value == -2 and m["bdSeq"].datatype == "Int64"
    assert m["temp"].double_value == 21.5 and m["temp"].timestamp_ms == 1_700_000_000_001
    assert m["level"].float_value == 0.25 and m["level"].double_value is None
    assert m["small"].int_value == -5 and m["small32"].int_value == -300
    assert m["count"].long_value == 4_000_000_000 and m["count"].int_value is None
    assert m["huge"].long_value is None and m["huge"].string_value == str(2**64 - 1)
    assert m["on"].boolean_value is True and m["label"].string_value == "ünï"
    assert m["blob"].bytes_value == b"\x00\x01" and m["when"].long_value == 1_700_000_000_123
    missing = m["missing"]
    assert missing.is_null and missing.datatype == "Double"
    assert missing[7:] == (None,) * 7  # every value column


def test_a_data_metric_sent_by_alias_gets_its_name_and_type_from_the_last_birth() -> None:
    book = AliasBook()
    device = _topic("spBv1.0/g/DDATA/e/pump")
    data = pb.Payload(seq=2)
    data.metrics.add(alias=1, double_value=23.0)  # no name, no datatype: as DATA is sent
    data.metrics.add(alias=21, int_value=7)  # the device's own alias
    data.metrics.add(alias=99, int_value=1)  # nobody's
    payload = data.SerializeToString()

    before = book.decode(device, payload)  # no birth yet: kept, unnamed, typed by its protobuf field
    assert [r.name for r in before.metrics] == [None, None, None] and before.unresolved == 3
    assert before.metrics[0].double_value == 23.0 and before.metrics[0].datatype is None

    book.decode(_topic("spBv1.0/g/NBIRTH/e"), _birth())
    dbirth = pb.Payload(seq=1)
    dbirth.metrics.add(name="rpm", alias=21, datatype=pb.UInt16, int_value=0)
    book.decode(_topic("spBv1.0/g/DBIRTH/e/pump"), dbirth.SerializeToString())
    after = book.decode(device, payload)
    assert [(r.name, r.datatype) for r in after.metrics] == [("temp", "Double"), ("rpm", "UInt16"), (None, None)]
    assert after.metrics[1].int_value == 7 and after.unresolved == 1

    # A new NBIRTH starts the edge node's session over: its devices' births are forgotten, its own replaced.
    rebirth = pb.Payload(seq=0)
    rebirth.metrics.add(name="pressure", alias=1, datatype=pb.Double, double_value=1.0)
    book.decode(_topic("spBv1.0/g/NBIRTH/e"), rebirth.SerializeToString())
    again = book.decode(device, payload)
    assert [r.name for r in again.metrics] == ["pressure", None, None]


def test_the_book_is_bounded_and_saved() -> None:
    book = AliasBook(max_keys=2)
    for edge in ("a", "b", "c"):
        book.decode(_topic(f"spBv1.0/g/NBIRTH/{edge}"), _birth())
    assert len(book) == 2  # the oldest, a, went
    copy = AliasBook()
    copy.load_json(book.to_json())
    data = pb.Payload()
    data.metrics.add(alias=8, string_value="x")
    assert [r.name for r in copy.decode(_topic("spBv1.0/g/NDATA/c"), data.SerializeToString()).metrics] == ["label"]
    assert copy.decode(_topic("spBv1.0/g/NDATA/a"), data.SerializeToString()).metrics[0].name is None


@pytest.mark.parametrize("payload", [b"\xff\xff\xff", b'{"temp": 21.5}', _birth()[:-3]])
def test_malformed_payloads_raise_malformed_not_anything_else(payload: bytes) -> None:
    book = AliasBook()
    with pytest.raises(MalformedPayload):
        book.decode(_topic("spBv1.0/g/NBIRTH/e"), payload)
    assert len(book) == 0


def test_text_that_is_not_utf8_is_malformed() -> None:
    # proto2 strings are not checked by the parser: a metric name of raw bytes must not reach Arrow.
    p = pb.Payload()
    p.metrics.add(name="ok", alias=1, datatype=pb.String, string_value="fine")
    raw = bytearray(p.SerializeToString())
    raw[raw.index(b"fine"):raw.index(b"fine") + 4] = b"\xff\xfe\xfd\xfc"
    with pytest.raises(MalformedPayload):
        AliasBook().decode(_topic("spBv1.0/g/NDATA/e"), bytes(raw))
