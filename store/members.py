"""Who consumes each consumer group now, cluster-wide: the `Store` member calls (`join_group`, `leave_group`,
`group_members`, `release_members`), for what a protocol must decide across nodes (AMQP: an exclusive consumer,
the consumer count of Queue.Declare-Ok, an auto-delete queue's last consumer).

A member is held by one process (`node`, and `process`: its membership token) and goes with it: when the
process ends its members are released, by the survivor that saw it die (that process only) or by the node's
next start (every earlier process of the node). An exclusive member is always alone: a join is refused while
one holds the group, and an exclusive join is refused while the group has any member.

`GroupMembers` is the one-process form, kept in memory by the embedded engine (its one node's consumers end with
it); `store.redis.members` keeps the same in Redis, each call one script.
"""

from __future__ import annotations

from typing import NamedTuple


class _Member(NamedTuple):
    exclusive: bool
    node: str
    process: str


class GroupMembers:
    def __init__(self) -> None:
        self._groups: dict[str, dict[str, _Member]] = {}  # group -> member id -> how it is held

    def join(self, group: str, member: str, node: str, process: str, exclusive: bool) -> int:
        members = self._groups.get(group, {})
        if member in members:
            return len(members)
        if members and (exclusive or any(m.exclusive for m in members.values())):
            return -1
        self._groups.setdefault(group, members)[member] = _Member(exclusive, node, process)
        return len(members)

    def leave(self, group: str, member: str) -> int:
        members = self._groups.get(group)
        if members is None:
            return 0
        members.pop(member, None)
        if not members:
            del self._groups[group]
        return len(members)

    def count(self, group: str) -> int:
        return len(self._groups.get(group, ()))

    def release(self, node: str, process: str) -> list[str]:
        emptied: list[str] = []
        for group, members in list(self._groups.items()):
            gone = [k for k, m in members.items() if m.node == node and (not process or m.process == process)]
            for key in gone:
                del members[key]
            if gone and not members:
                del self._groups[group]
                emptied.append(group)
        return emptied

    def drop(self, group: str) -> None:
        self._groups.pop(group, None)
