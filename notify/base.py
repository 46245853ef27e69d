"""The notifier interface and the in-process notifier.

Events carry only queue names. Every name notified during one event-loop tick is merged into one set and
delivered once, so a burst of appends to a hot queue costs one wake-up per node, not one per message. A node
that is the only one in its process gets the names of its own appends back from `notify_from` at once, with
no wake-up at all: it dispatches them in the tick of the append.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from tidewire.lookup.base import Lookup

NotifyHandler = Callable[[set[str]], None]


class Notifier(Protocol):
    def register(self, node_id: str, handler: NotifyHandler) -> None:
        """Deliver events for `node_id` to `handler` (called with the merged set of queue names)."""

    def notify(self, queues: Iterable[str]) -> None:
        """Queue names that have new messages. Never blocks; delivery is asynchronous."""

    def notify_from(self, node_id: str, queues: set[str]) -> set[str]:
        """`notify` for messages that `node_id` appended itself. Returns the names that node alone is to be told
        about instead of telling it (a superset: it filters by its own readers), so it dispatches them in this
        tick; the rest are delivered as by `notify`."""


@dataclass(slots=True)
class NotifyCounts:
    """What a notifier did since start (a notifier's `counts`, read by the metrics endpoint)."""

    sent: int = 0  # notify events: merged name sets handed to a node (a handler call, a frame to a peer)
    merged: int = 0  # names notified again while still pending: merged into the pending event
    broadcast: int = 0  # events sent to every node because the target could not be told apart
    unknown: int = 0  # names the lookup could not place (table changing, shard missing): broadcast instead


class LocalNotifier:
    """Delivers to handlers registered in this process, targeted by the lookup's queue → nodes table."""

    def __init__(self, lookup: Lookup) -> None:
        self._lookup = lookup
        self._handlers: dict[str, NotifyHandler] = {}
        self._pending: set[str] = set()
        self._scheduled = False
        self.counts = NotifyCounts()

    def register(self, node_id: str, handler: NotifyHandler) -> None:
        self._handlers[node_id] = handler

    def notify(self, queues: Iterable[str]) -> None:
        pending = self._pending
        before = len(pending)
        names = queues if isinstance(queues, set) else set(queues)
        pending |= names
        self.counts.merged += before + len(names) - len(pending)
        if not self._scheduled and pending:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def notify_from(self, node_id: str, queues: set[str]) -> set[str]:
        if len(self._handlers) == 1 and node_id in self._handlers:
            self.counts.sent += 1
            return queues  # the only node in this process: every name is its own
        self.notify(queues)
        return set()

    def _flush(self) -> None:
        self._scheduled = False
        pending, self._pending = self._pending, set()
        per_node: dict[str, set[str]] = {}
        counts = self.counts
        unknown = counts.unknown
        for queue in pending:
            nodes = self._lookup.nodes_for_queue(queue)
            # None means the lookup can't tell (table changing, shard missing): broadcast, lose nothing.
            if nodes is None:
                counts.unknown += 1
            for node_id in self._handlers if nodes is None else nodes:
                per_node.setdefault(node_id, set()).add(queue)
        counts.broadcast += counts.unknown > unknown
        for node_id, queues in per_node.items():
            handler = self._handlers.get(node_id)
            if handler is not None:
                counts.sent += 1
                handler(queues)
