"""The lookup interface and its in-process implementation (one node, or tests)."""

from __future__ import annotations

from typing import Protocol

from tidewire.store.base import P2P_PREFIX


class Lookup(Protocol):
    """Writers are sync and fire-and-forget (a cluster lookup batches them); a node reports only itself."""

    def set_client_location(self, client_id: str, node_id: str) -> None:
        """Record that the client is connected to `node_id` (for session takeover across nodes)."""

    def remove_client_location(self, client_id: str, node_id: str) -> None:
        """Forget the location if it still points at `node_id` (a takeover may have moved it)."""

    async def client_location(self, client_id: str) -> str | None:
        """The node the client is connected to; None when nowhere or unknown (the caller then broadcasts)."""

    def add_queue_subscriber(self, queue: str, node_id: str) -> None:
        """Count one local subscriber of `queue` on `node_id`."""

    def remove_queue_subscriber(self, queue: str, node_id: str) -> None: ...

    def nodes_for_queue(self, queue: str) -> frozenset[str] | None:
        """Nodes with subscribers of `queue`; None when unknown (caller broadcasts). A cluster lookup answers
        only for the slots it owns; cluster notify routes through the owners instead."""


class InProcessLookup:
    """Plain dicts; reference counts per (queue, node) so one node's many subscribers count once."""

    def __init__(self) -> None:
        self._locations: dict[str, str] = {}
        self._queue_nodes: dict[str, dict[str, int]] = {}

    def set_client_location(self, client_id: str, node_id: str) -> None:
        self._locations[client_id] = node_id

    def remove_client_location(self, client_id: str, node_id: str) -> None:
        if self._locations.get(client_id) == node_id:
            del self._locations[client_id]

    async def client_location(self, client_id: str) -> str | None:
        return self._locations.get(client_id)

    def add_queue_subscriber(self, queue: str, node_id: str) -> None:
        nodes = self._queue_nodes.setdefault(queue, {})
        nodes[node_id] = nodes.get(node_id, 0) + 1

    def remove_queue_subscriber(self, queue: str, node_id: str) -> None:
        nodes = self._queue_nodes.get(queue)
        if nodes is None or node_id not in nodes:
            return
        nodes[node_id] -= 1
        if nodes[node_id] <= 0:
            del nodes[node_id]
            if not nodes:
                del self._queue_nodes[queue]

    def nodes_for_queue(self, queue: str) -> frozenset[str] | None:
        if queue.startswith(P2P_PREFIX):  # a P2P queue's one reader is wherever its client is connected
            node = self._locations.get(queue[len(P2P_PREFIX):])
            return frozenset((node,)) if node is not None else frozenset()
        nodes = self._queue_nodes.get(queue)
        return frozenset(nodes) if nodes else frozenset()
