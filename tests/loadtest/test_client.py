"""The load client's hand-written codec and its chunk-tolerant parser."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from loadtest.client import (
    HEADER_SIZE,
    PAYLOAD_HEADER,
    Counters,
    MqttConn,
    Publisher,
    connect_packet,
    encode_varint,
    publish_packet,
    subscribe_packet,
)


class FakeTransport:
    def __init__(self) -> None:
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass


def _conn(counters: Counters) -> tuple[MqttConn, FakeTransport]:
    conn = MqttConn(counters)
    t = FakeTransport()
    conn.connection_made(t)  # type: ignore[arg-type]
    return conn, t


@pytest.mark.parametrize(("n", "encoded"), [(0, b"\x00"), (127, b"\x7f"), (128, b"\x80\x01"),
                                            (16_383, b"\xff\x7f"), (2_097_152, b"\x80\x80\x80\x01")])
def test_varint(n: int, encoded: bytes) -> None:
    assert encode_varint(n) == encoded


def test_varint_out_of_range() -> None:
    with pytest.raises(ValueError):
        encode_varint(268_435_456)


def test_connect_and_subscribe_bytes() -> None:
    pkt = connect_packet("c1", keepalive=600)
    assert pkt == b"\x10\x0e\x00\x04MQTT\x04\x02\x02\x58\x00\x02c1"
    assert subscribe_packet(7, "a/b", 1) == b"\x82\x08\x00\x07\x00\x03a/b\x01"


async def test_publisher_batch_matches_single_encoder() -> None:
    counters = Counters()
    pub = Publisher(counters, "t/x", 1, pub_id=9, payload_size=40)
    raw = pub.batch(2)
    assert counters.sent == 2 and pub.inflight == 2 and pub.seq == 2
    one = len(raw) // 2
    first = raw[:one]
    ts, pub_id, seq = PAYLOAD_HEADER.unpack_from(first, len(first) - 40)
    assert (pub_id, seq) == (9, 1)
    assert first == publish_packet("t/x", PAYLOAD_HEADER.pack(ts, 9, 1) + b"x" * (40 - HEADER_SIZE), 1, 1)


async def test_parser_handles_byte_by_byte_chunks_acks_and_dups() -> None:
    counters = Counters()
    src = Publisher(Counters(), "big/topic", 1, pub_id=3, payload_size=300)  # remaining length > 127
    stream = src.batch(3)
    dup = stream[: len(stream) // 3]  # message 1 again
    conn, t = _conn(counters)
    for i in range(len(stream + dup)):
        conn.data_received((stream + dup)[i:i + 1])
    assert counters.received == 4
    assert counters.dup == 1
    assert len(counters.latencies_ns) == 4
    assert b"".join(t.written) == b"\x40\x02\x00\x01\x40\x02\x00\x02\x40\x02\x00\x03\x40\x02\x00\x01"


async def test_acks_refill_window_and_connack_suback() -> None:
    counters = Counters()
    conn, t = _conn(counters)
    conn.data_received(b"\x20\x02\x00\x00")
    assert conn.connack.result() == 0
    fut = conn.subscribe("a/#", 1)
    conn.data_received(b"\x90\x03\x00\x01\x01")
    assert await asyncio.wait_for(fut, 1) == 1
    conn.publisher = Publisher(counters, "a/1", 1, pub_id=1, payload_size=20, window=4)
    conn.refill = True
    assert conn.send(10) == 4  # window caps it
    t.written.clear()
    conn.data_received(b"\x40\x02\x00\x01\x40\x02\x00\x02")
    assert counters.acked == 2
    assert conn.publisher.inflight == 4  # two acks bought two new publishes in one write
    assert len(t.written) == 1 and t.written[0].count(b"\x32") >= 2


async def test_qos2_handshake_replies() -> None:
    conn, t = _conn(Counters())
    conn.data_received(b"\x50\x02\x00\x05\x62\x02\x00\x06")  # PUBREC 5, PUBREL 6
    assert t.written == [b"\x62\x02\x00\x05\x70\x02\x00\x06"]


def test_connection_lost_fails_pending_futures() -> None:
    async def run() -> Any:
        conn, _ = _conn(Counters())
        fut = conn.subscribe("x", 0)
        conn.connection_lost(None)
        assert conn.closed.done()
        with pytest.raises(ConnectionError):
            await fut

    asyncio.run(run())


def test_connect_with_credentials_bytes() -> None:
    pkt = connect_packet("c1", keepalive=60, username="u", password="pw")
    # flags 0xC2: user name + password + clean session; payload: client id, user name, password
    assert pkt == b"\x10\x15\x00\x04MQTT\x04\xc2\x00\x3c\x00\x02c1\x00\x01u\x00\x02pw"
    assert connect_packet("c1", username="u")[9] == 0x82
    with pytest.raises(ValueError):
        connect_packet("c1", password="pw")
