"""Garbage and mutated valid streams: the parser raises nothing but ProtocolError."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.gateway.protocols.mqtt.codec.test_roundtrip import levels_and_streams
from tidewire.gateway.protocols.mqtt.codec import Packet, Parser, ProtocolError, encode


def _feed_all(data: bytes, level: int, cut: int) -> None:
    parser = Parser(max_packet_size=1 << 16, protocol_level=level)
    try:
        parser.feed(data[:cut])
        parser.feed(data[cut:])
    except ProtocolError as exc:
        assert 0x80 <= exc.reason_code <= 0xA2
        assert exc.message


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.sampled_from([0, 4, 5]), st.integers(0, 200))
def test_random_bytes_raise_only_protocol_error(data: bytes, level: int, cut: int) -> None:
    _feed_all(data, level, cut)


_mutation = st.tuples(st.sampled_from(["flip", "insert", "delete", "set"]), st.integers(0), st.integers(0, 255))


def _mutate(data: bytes, ops: list[tuple[str, int, int]]) -> bytes:
    buf = bytearray(data)
    for op, where, value in ops:
        if not buf:
            break
        i = where % len(buf)
        if op == "flip":
            buf[i] ^= 1 << (value % 8)
        elif op == "insert":
            buf.insert(i, value)
        elif op == "delete":
            del buf[i]
        else:
            buf[i] = value
    return bytes(buf)


@settings(max_examples=200, deadline=None)
@given(levels_and_streams(3), st.lists(_mutation, min_size=1, max_size=4), st.integers(0, 400))
@pytest.mark.slow  # seconds long: `make test-slow` keeps `make test` under its 10 minutes
def test_mutated_streams_raise_only_protocol_error(
    case: tuple[int, list[Packet]], ops: list[tuple[str, int, int]], cut: int
) -> None:
    level, pkts = case
    data = _mutate(b"".join(encode(p, level) for p in pkts), ops)
    _feed_all(data, 0, cut)
    # Same bytes after the CONNECT, as a client-side / already-connected parser sees them.
    _feed_all(data[len(encode(pkts[0], level)) :], level, cut)
