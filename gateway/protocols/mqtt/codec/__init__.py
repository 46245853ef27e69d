"""Sans-IO MQTT 3.1.1 / 5.0 codec: `Parser` turns bytes into packet dataclasses, `encode` does the reverse."""

from __future__ import annotations

from .encoder import PINGREQ, PINGRESP, encode, puback, pubcomp, publish_parts, pubrec, pubrel
from .errors import ConnackCode311, PacketType, PropertyId, ProtocolError, ReasonCode
from .packets import (
    Auth,
    Connack,
    Connect,
    Disconnect,
    Packet,
    Pingreq,
    Pingresp,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    SubscriptionRequest,
    Unsuback,
    Unsubscribe,
    Will,
)
from .parser import Parser
from .primitives import MAX_VARINT, encode_varint
from .properties import decode_properties, encode_properties

__all__ = [
    "MAX_VARINT",
    "PINGREQ",
    "PINGRESP",
    "Auth",
    "Connack",
    "ConnackCode311",
    "Connect",
    "Disconnect",
    "Packet",
    "PacketType",
    "Parser",
    "Pingreq",
    "Pingresp",
    "Properties",
    "PropertyId",
    "ProtocolError",
    "Puback",
    "Pubcomp",
    "Publish",
    "Pubrec",
    "Pubrel",
    "ReasonCode",
    "Suback",
    "Subscribe",
    "SubscriptionRequest",
    "Unsuback",
    "Unsubscribe",
    "Will",
    "decode_properties",
    "encode",
    "encode_properties",
    "encode_varint",
    "puback",
    "pubcomp",
    "publish_parts",
    "pubrec",
    "pubrel",
]
