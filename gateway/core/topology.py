"""One node alone or one node of a cluster: a strategy chosen once, at start, so the rest of the gateway asks it
instead of testing for a cluster. `SingleNode` is the embedded default; `gateway.cluster.ClusterRole` is the other.

`shared` is the one fact the parts read: other nodes may serve this node's clients and read what it wrote. Then
what such a node would read (a will, a persistent session's record) is in the store before the client is
answered, and a clean session cannot be opened without asking the store. The rest are actions a single node
has no use for (they do nothing there).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, Protocol

ClientAction = Callable[[str], Awaitable[int]]  # client id -> an HTTP-like status: 204 done, 404 not here, 409 ...


class Topology(Protocol):
    """What differs between a node alone and a node of a cluster."""

    @property
    def shared(self) -> bool:
        """Other nodes may serve this node's clients and subscriptions."""

    @property
    def members(self) -> Mapping[str, str]:
        """Live nodes of the cluster: node id -> address (empty alone)."""

    def stats(self) -> dict[str, int]:
        """The cluster fabric's counters (empty alone)."""

    def advertise(self, service: str, address: str) -> None:
        """Tell the other nodes where clients reach this node's `service` ("host:port"; alone: no one to tell)."""

    def advertised(self, service: str) -> Mapping[str, str]:
        """Live node id -> the address it advertises for `service`, this node included once it advertised
        (empty alone): changes with membership."""

    def gauges(self) -> dict[str, int]:
        """Counters for `$SYS/brokers/<node>/stats/...` (none alone)."""

    @property
    def holder(self) -> str:
        """The name this process holds wildcard filters under in the store: unique to the process in a cluster,
        so the survivor that sees it die releases exactly its holds, never a restarted successor's."""

    def stale_owner(self, owner: str) -> bool:
        """The node that held a session or will is gone (alone: always; it was this node's last run)."""

    async def kick_elsewhere(self, client_id: str, epoch: int) -> None:
        """Tell the node that held the client to close its connection (alone: there is none)."""

    def answer(self, action: str, handler: ClientAction) -> None:
        """Do `action` on this node's clients when another node asks (an operator's request made there)."""

    async def ask_others(self, action: str, client_id: str, first: str | None) -> int | None:
        """Have the other nodes do `action` on `client_id`: `first` (the node that should hold it) first, then
        the others; the first answer that is not 404, else 404; None when there is no other node."""

    def loops(self) -> list[Coroutine[Any, Any, None]]:
        """What runs for the node's life besides its own loops."""


class SingleNode:
    """A node alone on its store (the embedded default, or Redis without `cluster_port`)."""

    shared = False
    members: Mapping[str, str] = {}
    holder = "local"  # one node on its store: its holds are its own, and a restart takes them over

    def stats(self) -> dict[str, int]:
        return {}

    def advertise(self, service: str, address: str) -> None:
        return None

    def advertised(self, service: str) -> Mapping[str, str]:
        return {}

    def gauges(self) -> dict[str, int]:
        return {}

    def stale_owner(self, owner: str) -> bool:
        return True

    async def kick_elsewhere(self, client_id: str, epoch: int) -> None:
        return None

    def answer(self, action: str, handler: ClientAction) -> None:
        return None

    async def ask_others(self, action: str, client_id: str, first: str | None) -> int | None:
        return None

    def loops(self) -> list[Coroutine[Any, Any, None]]:
        return []
