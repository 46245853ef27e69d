"""Extension hook interfaces: who a client is, and the authorizer deciding what it may publish/subscribe."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Protocol


@dataclass(slots=True, frozen=True)
class ClientInfo:
    """Who a connected client is: `username` is the identity a credential proved (None: anonymous)."""

    client_id: str
    username: str | None
    address: str = ""
    protocol_level: int = 4
    superuser: bool = False
    acl: Authorizer | None = None  # the client's own grants (JWT claims, HTTP hook), instead of the ACL file
    tenant: str | None = None  # the tenant the client belongs to (its mount point); None: the default tenant


class SubscribeAccess(IntEnum):
    DENIED = 0  # nothing the filter matches may be read: SUBACK failure
    FILTERED = 1  # some topics may be read: granted, and each delivery is checked with `allow_read`
    GRANTED = 2  # every topic the filter matches may be read: no per-message check


class Authorizer(Protocol):
    def allow_publish(self, client: ClientInfo, topic: str) -> bool: ...

    def subscribe_access(self, client: ClientInfo, topic_filter: str) -> SubscribeAccess: ...

    def allow_read(self, client: ClientInfo, topic: str) -> bool: ...


class PerClient:
    """The node's authorizer: superusers pass, a client with its own grants gets exactly those, every
    other client is checked by `base` (the ACL file), which SIGHUP may swap."""

    __slots__ = ("base",)

    def __init__(self, base: Authorizer) -> None:
        self.base = base

    def allow_publish(self, client: ClientInfo, topic: str) -> bool:
        if client.superuser:
            return True
        return (client.acl or self.base).allow_publish(client, topic)

    def subscribe_access(self, client: ClientInfo, topic_filter: str) -> SubscribeAccess:
        if client.superuser:
            return SubscribeAccess.GRANTED
        return (client.acl or self.base).subscribe_access(client, topic_filter)

    def allow_read(self, client: ClientInfo, topic: str) -> bool:
        if client.superuser:
            return True
        return (client.acl or self.base).allow_read(client, topic)


class AllowAll:
    """Default authorizer when no ACL file is configured."""

    __slots__ = ()

    def allow_publish(self, client: ClientInfo, topic: str) -> bool:
        return True

    def subscribe_access(self, client: ClientInfo, topic_filter: str) -> SubscribeAccess:
        return SubscribeAccess.GRANTED

    def allow_read(self, client: ClientInfo, topic: str) -> bool:
        return True



class Narrowed(PerClient):
    """`PerClient` and, after it, every authorizer plugin (`authorizers`): each must allow too, so a plugin can only
    narrow what the ACL file or a client's own grants give (superusers still pass). A subscription gets the least
    access any of them gives."""

    __slots__ = ("plugins",)

    def __init__(self, base: Authorizer, plugins: list[Authorizer]) -> None:
        super().__init__(base)
        self.plugins = plugins

    def allow_publish(self, client: ClientInfo, topic: str) -> bool:
        if client.superuser:
            return True
        if not (client.acl or self.base).allow_publish(client, topic):
            return False
        return all(plugin.allow_publish(client, topic) for plugin in self.plugins)

    def subscribe_access(self, client: ClientInfo, topic_filter: str) -> SubscribeAccess:
        if client.superuser:
            return SubscribeAccess.GRANTED
        least = (client.acl or self.base).subscribe_access(client, topic_filter)
        for plugin in self.plugins:
            if least == SubscribeAccess.DENIED:
                break
            least = min(least, plugin.subscribe_access(client, topic_filter))
        return least

    def allow_read(self, client: ClientInfo, topic: str) -> bool:
        if client.superuser:
            return True
        if not (client.acl or self.base).allow_read(client, topic):
            return False
        return all(plugin.allow_read(client, topic) for plugin in self.plugins)
