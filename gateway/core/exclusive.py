"""Exclusive subscriptions (EMQX's `$exclusive/<filter>`): one subscriber of a filter at a time, cluster-wide.

The lock is an exclusive member of the store's group `$exclusive/<filter>` (`Store.join_group`, atomic in every
engine), held by the client id and this node's process: a second client's join is refused (SUBACK 0x97, as EMQX
answers) while the first holds it, and the same client subscribing again keeps it. It goes with the
subscription (UNSUBSCRIBE), with the session (a clean session's connection ending, a stored session expiring),
and with the node (its death: the survivor that saw it die releases its members, `ConsumerGroups.owner_gone`;
its restart: `release_members` at start). The subscription itself is an ordinary one to `<filter>`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tidewire.store.base import Store

log = logging.getLogger("tidewire.exclusive")

EXCLUSIVE_PREFIX = "$exclusive/"


def lock_name(topic_filter: str) -> str:
    """The store group whose exclusive member holds `topic_filter`."""
    return EXCLUSIVE_PREFIX + topic_filter


class ExclusiveLocks:
    """This node's holds on exclusive subscriptions: client id -> the filters it holds through this node."""

    def __init__(self, store: Store, node_id: str, holder: Callable[[], str],
                 spawn: Callable[[Any], None]) -> None:
        self.store = store
        self.node_id = node_id
        self.holder = holder  # this process's membership token (`Topology.holder`)
        self.spawn = spawn
        self.held: dict[str, set[str]] = {}

    async def start(self) -> None:
        """What an earlier process of this node held is released (its sessions ended with it)."""
        await self.store.release_members(self.node_id)

    async def claim(self, client_id: str, filters: list[str]) -> list[bool]:
        """Try to hold each filter for `client_id`: True where it holds it now."""
        got: list[bool] = []
        for topic_filter in filters:
            joined = await self.store.join_group(lock_name(topic_filter), client_id, self.node_id, self.holder(),
                                                 True) >= 0
            if joined:
                self.held.setdefault(client_id, set()).add(topic_filter)
            got.append(joined)
        return got

    def holds(self, client_id: str, topic_filter: str) -> bool:
        return topic_filter in self.held.get(client_id, ())

    def release(self, client_id: str, filters: Iterable[str]) -> None:
        """Let go of `filters` (those held), in the background."""
        mine = self.held.get(client_id)
        gone = [f for f in filters if mine is not None and f in mine]
        if not gone:
            return
        assert mine is not None
        mine.difference_update(gone)
        if not mine:
            del self.held[client_id]
        self.spawn(self._leave(client_id, gone))

    def session_ended(self, client_id: str, filters: Iterable[str] = ()) -> None:
        """The client's session ended: every lock it holds through this node goes; `filters` (a stored session's
        subscriptions, when it expires on any node) are let go too (leaving a group one is no member of changes
        nothing)."""
        mine = self.held.pop(client_id, set())
        stored = set(filters) - mine
        if mine:
            self.spawn(self._leave(client_id, sorted(mine)))
        if stored:
            self.spawn(self._leave(client_id, sorted(stored)))

    async def _leave(self, client_id: str, filters: list[str]) -> None:
        for topic_filter in filters:
            try:
                await self.store.leave_group(lock_name(topic_filter), client_id)
            except Exception as exc:  # the node's death or restart releases it then
                log.warning("exclusive.release_failed", extra={"client_id": client_id, "filter": topic_filter,
                                                               "error": str(exc)})
