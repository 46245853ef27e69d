"""What a bridge uses of its node (`BridgeHost`: the node satisfies it) and what it counts (`BridgeCounters`)."""

from __future__ import annotations

from collections.abc import Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from tidewire.extensions.authentication import AuthChain
    from tidewire.extensions.hooks import Authorizer
    from tidewire.gateway.config import Settings
    from tidewire.gateway.core.clock import Clock
    from tidewire.gateway.core.consumers import ConsumerGroups
    from tidewire.gateway.core.ingress import DurableSink
    from tidewire.store.base import Message, Store


class BridgeHost(Protocol):
    """What a bridge uses of its node."""

    @property
    def node_id(self) -> str: ...

    @property
    def settings(self) -> Settings: ...

    @property
    def store(self) -> Store: ...

    @property
    def groups(self) -> ConsumerGroups: ...

    @property
    def authorizer(self) -> Authorizer: ...

    @property
    def auth(self) -> AuthChain: ...

    @property
    def clock(self) -> Clock: ...

    def publish(self, message: Message, sink: DurableSink | None = None, token: Any = None) -> None: ...

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None: ...


@dataclass
class BridgeCounters:
    sent: int = 0  # publishes written to the remote (resends included)
    acked: int = 0  # settled after the remote's acknowledgement
    refused_by_remote: int = 0  # acknowledged with an MQTT 5 error code, or too large for it: settled, not retried
    redelivered: int = 0  # claims sent again after a restart, a takeover or a lapse: possible duplicates
    received: int = 0  # publishes from the remote
    stored: int = 0  # of those, durable here
    denied: int = 0  # refused by the ACL (or an invalid topic) for the bridge's local identity
    connects: int = 0
    failures: int = 0  # connection attempts or links that failed
