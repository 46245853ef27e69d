"""Topic, property, message id and receipt-handle mapping, and the MQv2-HMAC-SHA1 check (pure, no gateway)."""

from __future__ import annotations

import gzip

from hypothesis import given
from hypothesis import strategies as st
from rocketmq.grpc_protocol import definition_pb2
from rocketmq.v5.util.signature import Signature

from tidewire.gateway.protocols.rocketmq.auth import Authenticator, parse_authorization
from tidewire.gateway.protocols.rocketmq.mapping import (
    Code,
    Inbound,
    Outbound,
    Refusal,
    inbound,
    join_topic,
    message_id,
    outbound,
    parse_receipt_handle,
    receipt_handle,
    split_topic,
)
from tidewire.store.base import Claim

PROP = "mqttSecondTopic"


def test_second_topic_normal_form() -> None:
    assert split_topic("a/b/c") == ("a", "/b/c/")  # RocketMQ-MQTT's normalizeSecondTopic
    assert split_topic("a") == ("a", None)
    for second in ("/b/c/", "/b/c", "b/c", "b/c/"):
        assert join_topic("a", second) == "a/b/c"
    assert join_topic("a", None) == join_topic("a", "") == join_topic("a", "/") == "a"


@given(st.text(alphabet="ab/", min_size=1, max_size=12))
def test_topic_round_trip(topic: str) -> None:
    first, second = split_topic(topic)
    assert join_topic(first, second) == topic


@given(st.integers(0, 2**63), st.integers(0, 2**63))
def test_receipt_handle_round_trip(seq: int, token: int) -> None:
    handle = receipt_handle("rmq/g/T", seq, token)
    assert parse_receipt_handle("rmq/g/T", handle) == (seq, token)
    assert parse_receipt_handle("rmq/other/T", handle) is None  # another group's handle


def test_bad_receipt_handles() -> None:
    good = receipt_handle("g", 5, 6)
    for bad in ("", "x", "1.2", "1.2.3.4", good.replace("5", "z", 1), "-1.2." + good.split(".")[2], good * 20):
        assert parse_receipt_handle("g", bad) is None


def rmq_message(**system: object) -> definition_pb2.Message:
    pb = definition_pb2.Message(body=b"hello")
    pb.topic.name = "T"
    pb.system_properties.message_id = "id1"
    for name, value in system.items():
        if name == "keys":
            pb.system_properties.keys.extend(value)
        else:
            setattr(pb.system_properties, name, value)
    return pb


def test_inbound_maps_topic_tag_keys_and_properties() -> None:
    pb = rmq_message(tag="tg", keys=["k1", "k2"])
    pb.user_properties[PROP] = "/b/c/"
    pb.user_properties["x"] = "y"
    mapped = inbound(pb, PROP, 100)
    assert isinstance(mapped, Inbound)
    assert mapped.topic == "T/b/c" and mapped.payload == b"hello" and mapped.message_id == "id1"
    assert sorted(mapped.properties.user) == [("KEYS", "k1 k2"), ("TAGS", "tg"), ("x", "y")]


def test_inbound_refusals() -> None:
    assert inbound(rmq_message(), PROP, 4) == (Code.MESSAGE_BODY_TOO_LARGE, "message body over 4 bytes")
    bad_topic = rmq_message()
    bad_topic.topic.name = "a/b"
    assert isinstance(refused := inbound(bad_topic, PROP, 100), Refusal) and refused.code == Code.ILLEGAL_TOPIC
    wild = rmq_message()
    wild.user_properties[PROP] = "/b/#"
    assert isinstance(refused := inbound(wild, PROP, 100), Refusal) and refused.code == Code.ILLEGAL_TOPIC
    bad_tag = rmq_message(tag="a|b")
    assert isinstance(refused := inbound(bad_tag, PROP, 100), Refusal) and refused.code == Code.ILLEGAL_MESSAGE_TAG


def test_inbound_gzip_body() -> None:
    pb = rmq_message(body_encoding=definition_pb2.GZIP)
    pb.body = gzip.compress(b"x" * 50)
    mapped = inbound(pb, PROP, 50)
    assert isinstance(mapped, Inbound) and mapped.payload == b"x" * 50
    assert isinstance(refused := inbound(pb, PROP, 49), Refusal) and refused.code == Code.MESSAGE_BODY_TOO_LARGE
    pb.body = b"not gzip"
    assert isinstance(refused := inbound(pb, PROP, 50), Refusal) and refused.code == Code.MESSAGE_CORRUPTED


def test_outbound_round_trip() -> None:
    pb = rmq_message(tag="tg", keys=["k1", "k2"])
    pb.user_properties[PROP] = "b/c"
    pb.user_properties["x"] = "y"
    mapped = inbound(pb, PROP, 100)
    assert isinstance(mapped, Inbound)
    from tidewire.gateway.core.ingress import neutral_message

    stored = neutral_message(mapped.topic, mapped.payload, properties=mapped.properties, now_ms=1234)
    stored.seq = 42
    out = outbound(stored, Claim(42, 2, 7), Outbound("ns", "rmq/g/T", 5000, PROP, "h:1"))
    system = out.system_properties
    assert out.topic.name == "T" and out.topic.resource_namespace == "ns" and out.body == b"hello"
    assert dict(out.user_properties) == {PROP: "/b/c/", "x": "y"}
    assert system.tag == "tg" and sorted(system.keys) == ["k1", "k2"]
    assert system.message_id == message_id(42) and system.delivery_attempt == 2 and system.queue_offset == 42
    assert parse_receipt_handle("rmq/g/T", system.receipt_handle) == (42, 7)
    assert system.born_timestamp.seconds == 1 and system.born_timestamp.nanos == 234_000_000


def test_signature_check() -> None:
    class Config:  # what Signature.metadata reads of a ClientConfiguration
        def __init__(self, ak: str, sk: str) -> None:
            self.credentials = type("C", (), {"ak": ak, "sk": sk})()
            self.namespace = ""

    good = Signature.metadata(Config("ak1", "sk1"), "client-1")
    auth = Authenticator({"ak1": "sk1"}, allow_anonymous=True)
    caller = auth.check(good, "ipv4:127.0.0.1:1")
    assert caller is not None and caller.username == "ak1" and caller.client_id == "client-1"
    assert auth.check(Signature.metadata(Config("ak1", "wrong"), "c"), "") is None
    assert auth.check(Signature.metadata(Config("nobody", "sk1"), "c"), "") is None
    assert auth.check(Signature.metadata(Config("", ""), "c"), "") is None  # credentials configured: no anonymous
    assert auth.check([], "") is None
    tampered = [(k, "20000101T000000Z") if k == "x-mq-date-time" else (k, v) for k, v in good]
    assert auth.check(tampered, "") is None
    open_node = Authenticator(None, allow_anonymous=True)
    anonymous = open_node.check(good, "")
    assert anonymous is not None and anonymous.username is None
    assert Authenticator(None, allow_anonymous=False).check(good, "") is None


def test_parse_authorization() -> None:
    assert parse_authorization("MQv2-HMAC-SHA1 Credential=ak/x/y, SignedHeaders=x-mq-date-time, Signature=AB") == (
        "ak", "ab")
    assert parse_authorization("MQv2-HMAC-SHA1 Credential=ak, SignedHeaders=host, Signature=ab") is None
    assert parse_authorization("Basic abc") is None
    assert parse_authorization("MQv2-HMAC-SHA1 " + "x" * 2000) is None
