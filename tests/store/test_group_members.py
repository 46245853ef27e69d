"""The group-member contract of `store.base.Store` (`store.members`: who consumes each group now, cluster-wide),
the atomic `add_group` and a group definition's `drains` (an unbound filter's last seq), on every engine."""

from __future__ import annotations

import asyncio

from tests.store.conftest import Engine
from tidewire.store.base import GroupRecord

G = "amqp/v/q"


async def test_join_counts_and_refuses_around_an_exclusive_member(engine: Engine) -> None:
    s = engine.store
    assert await s.group_members(G) == 0
    assert await s.join_group(G, "c1", "n1", "p1", False) == 1
    assert await s.join_group(G, "c1", "n1", "p1", False) == 1  # idempotent
    assert await s.join_group(G, "c2", "n2", "p2", False) == 2
    assert await s.join_group(G, "x", "n3", "p3", True) == -1  # exclusive: the group has members
    assert await s.group_members(G) == 2
    assert await s.leave_group(G, "c1") == 1
    assert await s.leave_group(G, "c1") == 1  # not a member any more: a no-op
    assert await s.leave_group(G, "c2") == 0
    assert await s.join_group(G, "x", "n3", "p3", True) == 1
    assert await s.join_group(G, "c3", "n1", "p1", False) == -1  # an exclusive member holds it
    assert await s.join_group(G, "y", "n1", "p1", True) == -1
    assert await s.group_members(G) == 1
    assert await s.group_members("amqp/v/other") == 0


async def test_racing_exclusive_joins_admit_one(engine: Engine) -> None:
    s = engine.store
    answers = await asyncio.gather(*(s.join_group(G, f"c{i}", f"n{i % 3}", f"p{i % 3}", True) for i in range(20)))
    assert sorted(answers) == [-1] * 19 + [1]
    assert await s.group_members(G) == 1


async def test_release_members_of_a_process_or_of_every_process_of_a_node(engine: Engine) -> None:
    s = engine.store
    await s.join_group("a", "a1", "n1", "old", False)
    await s.join_group("a", "a2", "n2", "p2", False)
    await s.join_group("b", "b1", "n1", "old", False)
    await s.join_group("b", "b2", "n1", "new", False)
    await s.join_group("c", "c1", "n1", "older", True)
    assert await s.release_members("n1", "old") == []  # "a" keeps a2, "b" keeps b2: none emptied
    assert await s.group_members("a") == 1 and await s.group_members("b") == 1
    assert await s.group_members("c") == 1
    assert await s.release_members("n1", "old") == []  # nothing left of that process
    assert sorted(await s.release_members("n1")) == ["b", "c"]  # every process of n1 (a node's start)
    assert [await s.group_members(g) for g in ("a", "b", "c")] == [1, 0, 0]
    assert await s.join_group("c", "c2", "n2", "p2", True) == 1  # the exclusive member went with its process


async def test_release_reports_the_groups_it_emptied(engine: Engine) -> None:
    s = engine.store
    await s.join_group("a", "a1", "n1", "p", False)
    await s.join_group("a", "a2", "n1", "p", False)
    await s.join_group("b", "b1", "n1", "p", False)
    await s.join_group("b", "b2", "n2", "q", False)
    assert await s.release_members("n1", "p") == ["a"]
    assert await s.release_members("n2", "other") == []
    assert await s.group_members("b") == 1


async def test_delete_group_drops_its_members(engine: Engine) -> None:
    s = engine.store
    await s.put_group(GroupRecord(G, ["t"]))
    await s.join_group(G, "c1", "n1", "p1", True)
    await s.delete_group(G)
    assert await s.group_members(G) == 0
    assert await s.join_group(G, "c2", "n2", "p2", True) == 1
    assert await s.release_members("n1") == []  # its entry went with the group


async def test_drains_are_kept_with_the_definition(engine: Engine) -> None:
    s = engine.store
    record = GroupRecord(G, ["$queue/q"], drains={"a/+/c": 41, "$exchange/e/k": 7})
    await s.put_group(record)
    assert await s.get_group(G) == record
    assert [g for g in await s.list_groups() if g.name == G] == [record]


async def test_add_group_creates_once(engine: Engine) -> None:
    s = engine.store
    mine = [GroupRecord(G, ["t"], attrs={"exclusive": f"conn{i}"}, start_seq=0) for i in range(10)]
    created = await asyncio.gather(*(s.add_group(record) for record in mine))
    assert sorted(created) == [False] * 9 + [True]
    winner = mine[created.index(True)]
    assert await s.get_group(G) == winner
    assert await s.group_position(G) == (0, 0)
    assert not await s.add_group(GroupRecord(G, ["other"]))
    assert await s.get_group(G) == winner  # a refused add changes nothing
    await s.delete_group(G)
    assert await s.add_group(GroupRecord(G, ["other"]))
