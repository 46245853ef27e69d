"""What a bridge or a rule uses of its node (`NodeHost`: the node satisfies it), so they hold a narrow view of it."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from tidewire.extensions.authentication import AuthChain
    from tidewire.extensions.hooks import Authorizer
    from tidewire.gateway.config import Settings
    from tidewire.gateway.core.clock import Clock
    from tidewire.gateway.core.consumers import ConsumerGroups
    from tidewire.gateway.core.ingress import DurableSink
    from tidewire.gateway.core.publish_hooks import PublishHooks
    from tidewire.store.base import Message, Store


class NodeHost(Protocol):
    """What a bridge or a rule uses of its node."""

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

    @property
    def hooks(self) -> PublishHooks | None:
        """The publish hooks an ingress hands its messages to (None: publish directly)."""

    def publish(self, message: Message, sink: DurableSink | None = None, token: Any = None) -> None: ...

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None: ...
