"""What the bridge's MQTT client (`bridges/mqtt/client.py`) tells its caller: the events `ClientCore.receive`
returns, and its errors."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tidewire.errors import ProtocolError, TidewireError


# --- errors ---------------------------------------------------------------------------------------------------
class ClientError(TidewireError):
    """The bridge's MQTT client cannot do what it was asked (the root of this module's errors)."""


class ClientProtocolError(ClientError, ProtocolError):
    """The server broke MQTT; `reason_code` is what an MQTT 5 DISCONNECT says before the connection is closed."""


class KeepaliveTimeout(ClientError, TimeoutError):
    """No PINGRESP in time: the connection is dead even if the socket does not know it yet."""


class PacketTooLarge(ClientError, ValueError):
    """A packet larger than our `max_packet_size` or the server's Maximum Packet Size: it cannot be sent at all."""


class ClientStateError(ClientError, RuntimeError):
    """A call the state does not allow: publishing while not connected or beyond `credit()`."""


@dataclass(slots=True)
class Connected:
    """CONNACK accepted. The re-sends of the in-flight table are in `data_to_send()`; an `Acked` may follow for
    those the new connection's limits end (see `ClientCore._resend`)."""

    session_present: bool
    properties: dict[int, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Refused:
    """CONNACK refused (`code`: the 3.x return code or the MQTT 5 reason code). For 3.x, code 1 after a
    `try_private` CONNECT means: connect again without the bridge bit (what Mosquitto's bridge does)."""

    code: int
    reason: str


@dataclass(slots=True)
class Incoming:
    """A PUBLISH from the server. QoS 1/2: acknowledged only by `incoming_stored(packet_id)`, once stored.
    `properties`: the MQTT 5 block as Tidewire stores it (no per-hop properties); `expiry`: the Message Expiry
    Interval in seconds, if any."""

    topic: str
    payload: bytes
    qos: int
    retain: bool
    packet_id: int
    properties: bytes = b""
    dup: bool = False
    expiry: int | None = None


@dataclass(slots=True)
class Acked:
    """Our publishes the server acknowledged (PUBACK, or PUBCOMP for QoS 2), by token. `failed`: those it
    acknowledged with an MQTT 5 reason code >= 0x80 (refused, not delivered), token -> reason code."""

    tokens: list[object]
    failed: dict[object, int] = field(default_factory=dict)


@dataclass(slots=True)
class Subscribed:
    packet_id: int
    granted: list[int]  # per filter: the granted QoS, or a reason code >= 0x80


@dataclass(slots=True)
class Unsubscribed:
    packet_id: int
    reason_codes: list[int]  # MQTT 5 only; empty for 3.x


@dataclass(slots=True)
class ServerDisconnect:
    """An MQTT 5 DISCONNECT from the server: the connection is over."""

    reason: int
    text: str | None = None


Event = Connected | Refused | Incoming | Acked | Subscribed | Unsubscribed | ServerDisconnect
