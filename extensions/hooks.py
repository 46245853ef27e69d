"""Extension hook interfaces: who a client is, and the authorizer deciding what it may publish/subscribe."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(slots=True, frozen=True)
class ClientInfo:
    client_id: str
    username: str | None
    address: str = ""
    protocol_level: int = 4


class Authorizer(Protocol):
    def allow_publish(self, client: ClientInfo, topic: str) -> bool: ...

    def allow_subscribe(self, client: ClientInfo, topic_filter: str) -> bool: ...


class AllowAll:
    """Default authorizer when no ACL file is configured."""

    __slots__ = ()

    def allow_publish(self, client: ClientInfo, topic: str) -> bool:
        return True

    def allow_subscribe(self, client: ClientInfo, topic_filter: str) -> bool:
        return True
