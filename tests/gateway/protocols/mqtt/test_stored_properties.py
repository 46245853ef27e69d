"""The MQTT adapter's side of the stored property block: the store's encoding (`store.properties`) is the content
of an MQTT 5 property block, so a PUBLISH's properties are stored re-encoded by the MQTT codec (minus the per-hop
ones) and forwarded as they are; these tests hold the two encodings to being the same."""

from __future__ import annotations

from typing import Any

from tidewire.gateway.protocols.mqtt.codec import PropertyId, decode_properties
from tidewire.gateway.protocols.mqtt.connect import stored_properties
from tidewire.store import properties as stored
from tidewire.store.properties import Properties


def test_the_stored_identifiers_are_mqtt_5s() -> None:
    assert (stored.PAYLOAD_FORMAT, stored.MESSAGE_EXPIRY, stored.CONTENT_TYPE, stored.RESPONSE_TOPIC,
            stored.CORRELATION_DATA, stored.SUBSCRIPTION_ID, stored.TOPIC_ALIAS, stored.USER_PROPERTY) == (
        PropertyId.PAYLOAD_FORMAT_INDICATOR, PropertyId.MESSAGE_EXPIRY_INTERVAL, PropertyId.CONTENT_TYPE,
        PropertyId.RESPONSE_TOPIC, PropertyId.CORRELATION_DATA, PropertyId.SUBSCRIPTION_IDENTIFIER,
        PropertyId.TOPIC_ALIAS, PropertyId.USER_PROPERTY)


def test_a_publish_block_as_stored_reads_as_the_neutral_properties() -> None:
    publish: dict[int, Any] = {
        PropertyId.PAYLOAD_FORMAT_INDICATOR: 1, PropertyId.MESSAGE_EXPIRY_INTERVAL: 60, PropertyId.TOPIC_ALIAS: 3,
        PropertyId.CONTENT_TYPE: "application/json", PropertyId.RESPONSE_TOPIC: "reply/1",
        PropertyId.CORRELATION_DATA: b"\x00\x01", PropertyId.SUBSCRIPTION_IDENTIFIER: [7],
        PropertyId.USER_PROPERTY: [("a", "1"), ("ü", "ß")],
    }
    assert Properties.from_block(stored_properties(publish)) == Properties(
        "application/json", b"\x00\x01", "reply/1", [("a", "1"), ("ü", "ß")], True)


def test_a_neutral_block_is_a_valid_mqtt_5_block() -> None:
    props = Properties("text/plain", b"id", "r/t", [("k", "v"), ("k", "w")], True)
    assert decode_properties(props.to_block()) == {
        PropertyId.PAYLOAD_FORMAT_INDICATOR: 1, PropertyId.CONTENT_TYPE: "text/plain",
        PropertyId.RESPONSE_TOPIC: "r/t", PropertyId.CORRELATION_DATA: b"id",
        PropertyId.USER_PROPERTY: [("k", "v"), ("k", "w")]}
    assert stored_properties(decode_properties(props.to_block())) == props.to_block()
