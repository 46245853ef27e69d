"""Message kinds (`rocketmq.kinds`) as pure functions: a sent message's type checked against its properties, the
stored properties, and the lane and due time the consumer groups read from a stored message."""

from __future__ import annotations

from rocketmq.grpc_protocol import definition_pb2

from tidewire.gateway.protocols.rocketmq.kinds import due_of, inbound_kind, lane_of
from tidewire.gateway.protocols.rocketmq.mapping import Code, Outbound, Refusal, inbound, outbound, set_ms
from tidewire.store.base import Claim, Message

from .test_mapping import PROP, rmq_message

NOW = 1_700_000_000_000
MAX_DELAY_S = 3600


def system(**fields: object) -> definition_pb2.SystemProperties:
    pb = definition_pb2.SystemProperties()
    for name, value in fields.items():
        if name == "delivery_ms":
            set_ms(pb.delivery_timestamp, int(value))  # type: ignore[call-overload]
        else:
            setattr(pb, name, value)
    return pb


def code(answer: object) -> int:
    assert isinstance(answer, Refusal)
    return answer.code


def test_kinds_and_their_stored_properties() -> None:
    assert inbound_kind(system(message_type=definition_pb2.NORMAL), NOW, MAX_DELAY_S) == []
    assert inbound_kind(system(message_type=definition_pb2.FIFO, message_group="g1"), NOW, MAX_DELAY_S) == [
        ("__SHARDINGKEY", "g1")]
    assert inbound_kind(system(message_group="g1"), NOW, MAX_DELAY_S) == [("__SHARDINGKEY", "g1")]
    later = NOW + 5000
    assert inbound_kind(system(message_type=definition_pb2.DELAY, delivery_ms=later), NOW, MAX_DELAY_S) == [
        ("TIMER_DELIVER_MS", str(later))]
    assert inbound_kind(system(message_type=definition_pb2.DELAY, delivery_ms=NOW - 1), NOW, MAX_DELAY_S) == []


def test_kinds_refused() -> None:
    assert code(inbound_kind(system(message_type=definition_pb2.FIFO), NOW, 1)) == Code.ILLEGAL_MESSAGE_GROUP
    assert code(inbound_kind(system(message_type=definition_pb2.FIFO, message_group="x" * 65), NOW, 1)) == \
        Code.ILLEGAL_MESSAGE_GROUP
    assert code(inbound_kind(system(message_type=definition_pb2.DELAY), NOW, 1)) == Code.ILLEGAL_DELIVERY_TIME
    too_late = system(message_type=definition_pb2.DELAY, delivery_ms=NOW + MAX_DELAY_S * 1000 + 1)
    assert code(inbound_kind(too_late, NOW, MAX_DELAY_S)) == Code.ILLEGAL_DELIVERY_TIME
    assert code(inbound_kind(system(message_type=definition_pb2.NORMAL, message_group="g"), NOW, 1)) == \
        Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE
    assert code(inbound_kind(system(message_type=definition_pb2.LITE), NOW, 1)) == \
        Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE


def test_a_stored_kind_comes_back_as_system_properties() -> None:
    pb = rmq_message()
    pb.user_properties["__SHARDINGKEY"] = "forged"  # a client's own property of an internal name is dropped
    mapped = inbound(pb, PROP, 100)
    assert not isinstance(mapped, Refusal) and mapped.properties.user == []
    to = Outbound("", "rmq/g/T", 30_000, PROP, "h:1")
    for kind, extra, check in (
            (definition_pb2.FIFO, [("__SHARDINGKEY", "g1")], lambda s: s.message_group == "g1"),
            (definition_pb2.DELAY, [("TIMER_DELIVER_MS", str(NOW))],
             lambda s: s.delivery_timestamp.seconds * 1000 == NOW and s.delivery_attempt == 1)):
        mapped.properties.user[:] = extra
        message = Message("T", b"x", properties=mapped.properties.to_block(), seq=7)
        out = outbound(message, Claim(7, 2 if kind == definition_pb2.DELAY else 1, 3), to).system_properties
        assert out.message_type == kind and check(out)
        assert dict(outbound(message, Claim(7, 1, 3), to).user_properties) == {}
        assert lane_of(message) == ("g1" if kind == definition_pb2.FIFO else "")
        assert due_of(message) == (NOW if kind == definition_pb2.DELAY else 0)
    assert lane_of(Message("T", b"x")) == "" and due_of(Message("T", b"x")) == 0
