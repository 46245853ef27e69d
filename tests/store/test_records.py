"""The message record format (store.records): v1 layout and round trip, legacy v0 bodies, unknown versions, and
how the embedded engine and its tail deal with data dirs of older and newer builds."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidewire.store.base import PROTOCOL_AMQP, PROTOCOL_MQTT, PROTOCOL_ROCKETMQ, Message, WillRecord
from tidewire.store.embedded.engine import EmbeddedStore
from tidewire.store.embedded.kv import RETAINED, KVFile
from tidewire.store.embedded.tail import EmbeddedLogTail
from tidewire.store.log_reader import LogReader
from tidewire.store.records import (
    MAGIC,
    CorruptRecord,
    UnsupportedRecord,
    decode_message_body,
    decode_will,
    encode_message_body,
    encode_will,
    frame,
    peek_message,
)

# Written out here, not taken from the module: the tests pin the documented bytes.
V1_HEADER = struct.Struct("<7sBqqqBBBHHIIHI")
V0_HEADER = struct.Struct("<qqqBBHHIIHI")

texts = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=40)


def fields(m: Message) -> tuple[object, ...]:
    return (m.topic, m.payload, m.qos, m.retain, m.properties, m.timestamp_ms, m.expires_at_ms, m.publisher,
            m.queues, m.seq, m.protocol)


def legacy_body(seq: int, topic: str, payload: bytes, *, qos: int = 1, retain: bool = False, props: bytes = b"",
                ts: int = 5, exp: int = 0, publisher: str = "", queues: tuple[str, ...] = ()) -> bytes:
    """A body as every build before format v1 wrote it."""
    pub, top = publisher.encode(), topic.encode()
    q = "\x00".join(queues).encode()
    head = V0_HEADER.pack(seq, ts, exp, qos, 1 if retain else 0, len(pub), len(top), len(props), len(payload),
                          len(queues), len(q))
    return head + pub + top + props + payload + q


@given(
    topic=texts.filter(bool), payload=st.binary(max_size=200), qos=st.integers(0, 2), retain=st.booleans(),
    props=st.binary(max_size=50), ts=st.integers(0, 2**62), exp=st.integers(0, 2**62), publisher=texts,
    queues=st.lists(texts.filter(bool), max_size=5).map(tuple), seq=st.integers(-1, 2**53),
    protocol=st.sampled_from([PROTOCOL_MQTT, PROTOCOL_AMQP, PROTOCOL_ROCKETMQ, 200]),
)
def test_v1_round_trips_every_field(topic: str, payload: bytes, qos: int, retain: bool, props: bytes, ts: int,
                                    exp: int, publisher: str, queues: tuple[str, ...], seq: int,
                                    protocol: int) -> None:
    m = Message(topic, payload, qos, retain, props, ts, exp, publisher, queues, -7, protocol)
    body = encode_message_body(m, seq)
    got = decode_message_body(b"xy" + body, 2)
    assert fields(got) == (topic, payload, qos, retain, props, ts, exp, publisher, queues, seq, protocol)
    assert peek_message(b"xy" + body, 2) == (seq, ts, queues)
    assert peek_message(memoryview(body), 0) == (seq, ts, queues)


def test_v1_layout_is_the_documented_one() -> None:
    m = Message("a/b", b"PAY", 2, True, b"\x01\x01", 1234, 5678, "dev", ("a/b", "a/+"), 9, PROTOCOL_ROCKETMQ)
    body = encode_message_body(m, 42)
    assert body[:7] == b"TWLOG\x00\xff" == MAGIC and body[7] == 1
    head = V1_HEADER.unpack_from(body)
    assert head == (MAGIC, 1, 42, 1234, 5678, 2, 1, PROTOCOL_ROCKETMQ, 3, 3, 2, 3, 2, 7)
    assert body[V1_HEADER.size :] == b"dev" + b"a/b" + b"\x01\x01" + b"PAY" + b"a/b\x00a/+"


def test_reserved_flag_bits_are_ignored_on_read() -> None:
    body = bytearray(encode_message_body(Message("t", b"p", retain=False), 1))
    body[33] = 0b1111_1110  # every reserved bit set, retain clear
    assert decode_message_body(bytes(body)).retain is False
    body[33] = 0xFF
    assert decode_message_body(bytes(body)).retain is True


@given(
    seq=st.integers(-1, 2**53 - 1), topic=texts.filter(bool), payload=st.binary(max_size=100), retain=st.booleans(),
    publisher=texts, queues=st.lists(texts.filter(bool), max_size=4).map(tuple),
)
def test_legacy_bodies_decode_as_mqtt(seq: int, topic: str, payload: bytes, retain: bool, publisher: str,
                                      queues: tuple[str, ...]) -> None:
    body = legacy_body(seq, topic, payload, qos=2, retain=retain, props=b"\x01\x00", ts=77, exp=88,
                       publisher=publisher, queues=queues)
    got = decode_message_body(body)
    assert fields(got) == (topic, payload, 2, retain, b"\x01\x00", 77, 88, publisher, queues, seq, PROTOCOL_MQTT)
    assert peek_message(body, 0) == (seq, 77, queues)


def test_smallest_legacy_body_decodes() -> None:
    # shorter than a v1 header: the decoder must not take it for a truncated v1 record
    body = legacy_body(3, "", b"")
    assert len(body) < V1_HEADER.size
    got = decode_message_body(body)
    assert (got.seq, got.topic, got.payload, got.protocol) == (3, "", b"", PROTOCOL_MQTT)


@given(seq=st.integers(-1, 2**53 - 1))
def test_magic_never_matches_a_legacy_seq(seq: int) -> None:
    # A legacy body starts with its i64 seq: its first 7 bytes can never be the magic.
    assert struct.pack("<q", seq)[:7] != MAGIC


def test_magic_is_outside_the_legacy_seq_range_at_its_edges() -> None:
    for seq in (-1, 0, 1, 2**53 - 1, 2**31, 0x1F_FFFF_FFFF_FFFF):
        assert struct.pack("<q", seq)[:7] != MAGIC
    assert struct.pack("<q", 2**53 - 1)[6] <= 0x1F < MAGIC[6]


def test_legacy_will_in_a_kv_value_still_decodes() -> None:
    will = WillRecord("c1", Message("w/t", b"bye", 1, publisher="c1"), 5, "node-a")
    value = encode_will(will)
    head_len = struct.unpack_from("<I", value)[0]
    legacy = value[: 4 + head_len] + legacy_body(-1, "w/t", b"bye", publisher="c1")  # an unappended will: seq -1
    for v in (value, legacy):
        got = decode_will(v)
        assert (got.client_id, got.delay_interval, got.owner) == ("c1", 5, "node-a")
        assert (got.message.topic, got.message.payload, got.message.seq) == ("w/t", b"bye", -1)


@pytest.mark.parametrize("version", [0, 2, 255])
def test_unknown_version_is_refused_with_its_seq(version: int) -> None:
    body = bytearray(encode_message_body(Message("t", b"p", timestamp_ms=99), 1234))
    body[7] = version
    with pytest.raises(UnsupportedRecord) as info:
        decode_message_body(bytes(body))
    assert (info.value.version, info.value.seq, info.value.timestamp_ms) == (version, 1234, 99)
    assert f"version {version}" in str(info.value)
    with pytest.raises(UnsupportedRecord):
        peek_message(bytes(body), 0)
    assert isinstance(info.value, ValueError) and not isinstance(info.value, CorruptRecord)


def test_a_newer_record_is_refused_whatever_follows_its_stable_prefix() -> None:
    # a future version may change everything after byte 24: only the prefix is read
    body = MAGIC + bytes([9]) + struct.pack("<qq", 55, 66) + b"\xff" * 3
    with pytest.raises(UnsupportedRecord) as info:
        decode_message_body(body)
    assert (info.value.version, info.value.seq, info.value.timestamp_ms) == (9, 55, 66)
    with pytest.raises(UnsupportedRecord) as info:
        decode_message_body(MAGIC + b"\x07")  # too short for a seq
    assert (info.value.version, info.value.seq) == (7, -1)


# --- the embedded engine and its tail over records this build did not write -----------------------------------


async def open_store(path: Path) -> EmbeddedStore:
    s = EmbeddedStore(path, fsync="never", segment_bytes=2048)
    await s.open()
    return s


def v1_frame(seq: int) -> bytes:
    return frame(encode_message_body(Message(f"t/{seq}", b"p%d" % seq, 1, queues=("q",)), seq))


async def test_a_legacy_data_dir_opens_and_reads_as_mqtt(tmp_path: Path) -> None:
    (tmp_path / "log").mkdir()
    seg = tmp_path / "log" / f"{1:020d}.log"
    seg.write_bytes(b"".join(frame(legacy_body(i, f"old/{i}", b"pl", publisher="pub", queues=("q",)))
                             for i in range(1, 6)))
    s = await open_store(tmp_path)
    await s.append([Message("new", b"x", 1, publisher="c0", queues=("q",), protocol=PROTOCOL_AMQP)])
    got = (await s.read("q", 0, 100)).messages
    assert [(m.seq, m.topic, m.protocol) for m in got][:5] == [(i, f"old/{i}", PROTOCOL_MQTT) for i in range(1, 6)]
    assert (got[5].seq, got[5].protocol) == (6, PROTOCOL_AMQP)
    await s.close()
    tail = EmbeddedLogTail(tmp_path)
    await tail.open()
    records = await LogReader(tail, 0, 0).read(100)
    assert [(r.position, r.protocol, r.client_id) for r in records] == (
        [(i, "mqtt", "pub") for i in range(1, 6)] + [(6, "amqp", "c0")])
    await tail.close()


async def test_records_of_a_newer_format_are_kept_not_cut_and_refused_on_read(tmp_path: Path) -> None:
    (tmp_path / "log").mkdir()
    seg = tmp_path / "log" / f"{1:020d}.log"
    newer = bytearray(encode_message_body(Message("new/4", b"?", queues=("q",)), 4))
    newer[7] = 2  # a format version from the future, otherwise well formed
    seg.write_bytes(v1_frame(1) + v1_frame(2) + v1_frame(3) + frame(bytes(newer)) + v1_frame(5))
    size = seg.stat().st_size
    s = await open_store(tmp_path)
    assert seg.stat().st_size == size and s.last_seq() == 5  # not cut: the log is whole, just newer
    assert [m.seq for m in (await s.read("q", 0, 10)).messages] == [1, 2, 3, 5]  # indexed nowhere
    with pytest.raises(UnsupportedRecord):
        await s.read_log(0, 0, 10)
    assert [m.seq for m in (await s.read_log(0, 0, 3)).messages] == [1, 2, 3]
    assert [m.seq for m in (await s.read_log(0, 4, 10)).messages] == [5]
    await s.close()
    tail = EmbeddedLogTail(tmp_path)
    await tail.open()
    assert [m.seq for m in (await tail.read_log(0, 0, 3)).messages] == [1, 2, 3]
    with pytest.raises(UnsupportedRecord):
        await tail.read_log(0, 3, 10)
    assert [m.seq for m in (await tail.read_log(0, 4, 10)).messages] == [5]
    await tail.close()


async def test_a_retained_message_of_a_newer_format_is_skipped_not_a_failed_open(tmp_path: Path) -> None:
    s = await open_store(tmp_path)
    await s.set_retained("keep", Message("keep", b"1", retain=True))
    await s.close()
    kv = KVFile(tmp_path / "meta.kv")
    kv.open(lambda ns, key, value: None)
    body = bytearray(encode_message_body(Message("newer", b"2", retain=True), 1))
    body[7] = 2
    kv.write(sets=((RETAINED, "newer", bytes(body)),))
    kv.close()
    s = await open_store(tmp_path)
    assert [m.topic for m in await s.match_retained("#")] == ["keep"]
    await s.close()
