"""The stored property block (`store.properties`): what `to_block` writes `from_block` reads back, byte for byte
as documented; a block that does not decode gives no properties (a delivery never fails on it); per-hop MQTT
properties a block might hold are skipped."""

from __future__ import annotations

import pytest

from tidewire.store.properties import Properties


def test_the_block_layout_is_the_documented_one() -> None:
    props = Properties(content_type="a/b", correlation_data=b"\x00c", response_topic="r",
                       user=[("k", "v"), ("k", "w")], utf8_payload=True)
    assert props.to_block() == (b"\x01\x01" + b"\x03\x00\x03a/b" + b"\x08\x00\x01r" + b"\x09\x00\x02\x00c"
                                + b"\x26\x00\x01k\x00\x01v" + b"\x26\x00\x01k\x00\x01w")
    assert Properties.from_block(props.to_block()) == props
    assert Properties(expiry_interval=5).to_block() == b""  # the record keeps the deadline


def test_remaining_expiry_comes_from_the_deadline() -> None:
    assert Properties.from_block(b"", 10_500, now_ms=1_000).expiry_interval == 10
    assert Properties.from_block(b"", 1_001, now_ms=1_000).expiry_interval == 1
    assert Properties.from_block(b"", 0, now_ms=1_000).expiry_interval is None


def test_per_hop_properties_are_skipped() -> None:
    block = (b"\x02\x00\x00\x00\x3c" + b"\x0b\x81\x01" + b"\x23\x00\x07" + b"\x03\x00\x01t" + b"\x0b\x05")
    assert Properties.from_block(block) == Properties(content_type="t")


@pytest.mark.parametrize("block", [
    b"\x03\x00\x05ab",  # runs past the block
    b"\x01",  # no value
    b"\x02\x00\x00",  # expiry cut short
    b"\x0b\x80\x80\x80\x80\x01",  # varint longer than 4 bytes
    b"\x03\x00\x01a\x03\x00\x01b",  # a single property twice
    b"\x11\x00\x00\x00\x01",  # not a message property
    b"\x03\x00\x02\xff\xfe",  # not UTF-8
    b"\x08\x00\x01\x00",  # U+0000
])
def test_a_block_that_does_not_decode_gives_no_properties(block: bytes) -> None:
    assert Properties.from_block(block + b"\x26\x00\x01k\x00\x01v", 5_000, now_ms=1_000) == Properties(
        expiry_interval=4)
