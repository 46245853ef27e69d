"""The trace ring buffer, packet descriptions and the merge of several nodes' lines (gateway.ops.trace), sans-IO."""

from __future__ import annotations

import json

import pytest

from tidewire.gateway.ops.trace import RUNNING, STOPPED, Trace, TraceSpec, describe, encode_fields, merge_lines
from tidewire.gateway.protocols.mqtt.codec import Connect, Puback, Publish, Suback, Subscribe, SubscriptionRequest


def _spec(max_packets: int = 100, max_bytes: int = 1 << 20, payload_bytes: int = 0, topic: str | None = None,
          client_id: str | None = "c1") -> TraceSpec:
    return TraceSpec("t", client_id if topic is None else None, topic, 60.0, max_packets, max_bytes, payload_bytes)


def test_the_ring_buffer_keeps_the_newest_packets_and_counts_the_dropped() -> None:
    trace = Trace(_spec(max_packets=5), 100.0, 1_700_000_000.0)
    for i in range(12):
        trace.record(encode_fields({"type": "PUBLISH", "seq": i}), 100.0 + i / 10, 1_700_000_000.0 + i / 10)
    lines = [json.loads(line) for line in trace.lines()]
    assert [line["seq"] for line in lines] == [7, 8, 9, 10, 11]
    assert (trace.recorded, trace.dropped) == (12, 7)
    assert lines[0]["t"] == pytest.approx(0.7) and lines[0]["ts"] == pytest.approx(1_700_000_000.7)
    assert trace.summary(101.0)["packets"] == 5


def test_the_byte_bound_drops_the_oldest_lines_too() -> None:
    trace = Trace(_spec(max_bytes=1024), 0.0, 0.0)
    for i in range(40):
        trace.record(encode_fields({"type": "PUBLISH", "pad": "x" * 90, "seq": i}), 0.0, 0.0)
    held = sum(len(line) + 1 for line in trace.lines())
    assert held == trace.held_bytes <= 1024
    assert json.loads(trace.lines()[-1])["seq"] == 39
    assert trace.dropped == 40 - len(trace.lines()) > 0


def test_a_stopped_trace_records_nothing_more() -> None:
    trace = Trace(_spec(), 0.0, 0.0)
    trace.record(encode_fields({"type": "PINGREQ"}), 0.0, 0.0)
    assert trace.status == RUNNING
    trace.stop(5.0, "stopped")
    trace.record(encode_fields({"type": "PINGREQ"}), 1.0, 1.0)
    assert trace.status == STOPPED and trace.recorded == 1 and trace.summary(2.0)["ended_at"] == 5.0


def test_describe_gives_the_fields_and_caps_the_payload() -> None:
    publish = Publish("a/b", b"hello world", 1, True, False, 7)
    assert describe(publish, 0) == {"type": "PUBLISH", "topic": "a/b", "qos": 1, "retain": True, "dup": False,
                                    "size": 11, "packet_id": 7}
    capped = describe(publish, 5)
    assert capped["payload"] == "hello" and capped["payload_truncated"] is True
    assert describe(Publish("a", b"\xff\xfe", 0), 8)["payload_b64"] == "//4="
    assert describe(Puback(7, 0x10), 0) == {"type": "PUBACK", "packet_id": 7, "reason_code": 0x10}
    assert describe(Subscribe(3, [SubscriptionRequest("x/#", 1)]), 0)["filters"] == [["x/#", 1]]
    assert describe(Suback(3, [1, 0x87]), 0)["reason_codes"] == [1, 0x87]
    connect = describe(Connect("dev", 5, password=b"secret", username="u"), 0)
    assert connect["client_id"] == "dev" and "secret" not in json.dumps(connect)


def test_topic_and_client_matching() -> None:
    topic_trace = Trace(_spec(topic="site/+/temp"), 0.0, 0.0)
    assert topic_trace.wants_publish("site/1/temp") and not topic_trace.wants_publish("site/1/hum")
    assert not topic_trace.follows("c1")
    client_trace = Trace(_spec(), 0.0, 0.0)
    assert client_trace.follows("c1") and not client_trace.follows("c2") and not client_trace.wants_publish("a")


def test_merge_orders_the_nodes_lines_by_wall_clock() -> None:
    a = [json.dumps({"ts": 1.0, "n": "a1"}), json.dumps({"ts": 3.0, "n": "a2"})]
    b = [json.dumps({"ts": 2.0, "n": "b1"}), json.dumps({"ts": 3.0, "n": "b2"})]
    assert [json.loads(line)["n"] for line in merge_lines([a, b])] == ["a1", "b1", "a2", "b2"]


def test_a_huge_subscribe_is_listed_in_part() -> None:
    fields = describe(Subscribe(1, [SubscriptionRequest(f"f/{i}", 0) for i in range(500)]), 0)
    assert len(fields["filters"]) == 32 and fields["count"] == 500
    assert "count" not in describe(Suback(1, [0] * 32), 0)


def test_a_line_is_json_with_its_times_first_and_non_ascii_counted_in_bytes() -> None:
    trace = Trace(_spec(), 10.0, 0.0)
    trace.record(encode_fields({"topic": "température"}), 10.25, 1_700_000_000.5)
    trace.record(encode_fields({}), 11.0, 1_700_000_001.0)
    first, second = trace.lines()
    assert json.loads(first) == {"t": 0.25, "ts": 1_700_000_000.5, "topic": "température"}
    assert json.loads(second) == {"t": 1.0, "ts": 1_700_000_001.0}
    assert trace.held_bytes == len(first.encode()) + len(second.encode()) + 2
