"""What the sans-IO connection core (`core`) tells its caller, its limits and its states."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from tidewire.gateway.protocols.amqp.codec import Method, Properties


@dataclass(frozen=True, slots=True)
class Limits:
    frame_max: int
    channel_max: int
    heartbeat: int  # s offered in Tune; 0: off
    max_body: int
    vhosts: frozenset[str] = frozenset({"/"})


@dataclass(slots=True)
class ClientInfo:
    """What the client said about itself in StartOk."""

    properties: dict[str, Any] = field(default_factory=dict)
    capabilities: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Authenticate:
    """Check these credentials, then call `auth_accepted` or `auth_refused`."""

    username: str | None
    password: bytes | None


@dataclass(frozen=True, slots=True)
class Opened:
    vhost: str


@dataclass(frozen=True, slots=True)
class ChannelOpened:
    channel: int


@dataclass(frozen=True, slots=True)
class ChannelCloseRequested:
    """The client closes the channel: clean up, then call `channel_close_ok`."""

    channel: int


@dataclass(frozen=True, slots=True)
class ChannelClosed:
    """The channel was closed on a framing fault: forget it (requeue what it had unacked)."""

    channel: int


@dataclass(frozen=True, slots=True)
class Command:
    channel: int
    method: Method
    properties: Properties | None = None
    body: bytes = b""


@dataclass(frozen=True, slots=True)
class CloseRequested:
    """The client closes the connection: clean up, then call `close_ok`."""


Event = Authenticate | Opened | ChannelOpened | ChannelCloseRequested | ChannelClosed | Command | CloseRequested


class State(Enum):
    HEADER = 0  # awaiting the protocol header
    START = 1  # Start sent, awaiting StartOk
    AUTH = 2  # StartOk received, credentials being checked
    TUNE = 3  # Tune sent, awaiting TuneOk
    OPEN_WAIT = 4  # awaiting Connection.Open
    OPEN = 5
    CLOSING = 6  # Connection.Close sent, awaiting CloseOk
    CLIENT_CLOSING = 7  # Connection.Close received: commands read before it still run, then close_ok
    CLOSED = 8  # nothing more is read or sent: close the transport once the output is written
