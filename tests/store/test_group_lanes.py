"""The lanes of the consumer-group contract (`Store.claim(..., lanes=)`, RocketMQ message groups): a lane's
claims are handed out one at a time in seq order, across claimers, releases, restarts and deletes; run against
each engine of `engine`.
"""

from __future__ import annotations

from tests.store.conftest import Engine
from tests.store.test_groups import LATER, fill, new_group
from tidewire.store.base import Claim, Store


async def take_lanes(s: Store, name: str, owner: str, lanes_of: dict[int, str],
                     visible_at_ms: int = LATER) -> list[Claim]:
    cursor, _ = await s.group_position(name)
    sl = await s.read("orders", cursor, 1000)
    seqs = [m.seq for m in sl.messages]
    claims, _ = await s.claim(name, cursor, sl.upto, seqs, owner, visible_at_ms,
                              {seq: lanes_of[seq] for seq in seqs if seq in lanes_of})
    return claims


async def test_a_lane_hands_out_one_claim_at_a_time_in_order(engine: Engine) -> None:
    s = engine.store
    rec = await new_group(s)
    seqs = [m.seq for m in await fill(s, 6)]
    # a, b, a, -, b, a
    lanes = {seqs[0]: "a", seqs[1]: "b", seqs[2]: "a", seqs[4]: "b", seqs[5]: "a"}
    first = await take_lanes(s, rec.name, "n1", lanes)
    assert [c.seq for c in first] == [seqs[0], seqs[1], seqs[3]]  # one of each lane, and the lane-less one
    # The held back ones are never due, whatever the time; a lapse redelivers the lane's first, not its next.
    lapsed = await s.reclaim(rec.name, "n2", 10 * LATER, 20 * LATER, 10)
    assert [c.seq for c in lapsed] == [seqs[0], seqs[1], seqs[3]]
    head_a = next(c for c in lapsed if c.seq == seqs[0])
    assert await s.settle(rec.name, [(head_a.seq, head_a.token)]) == [seqs[0]]
    (nxt,) = await s.reclaim(rec.name, "n2", 1, LATER, 10)  # due at once, after the lane's first is settled
    assert (nxt.seq, nxt.deliveries) == (seqs[2], 1)  # its first delivery
    assert await s.reclaim(rec.name, "n2", 1, LATER, 10) == []
    assert await s.settle(rec.name, [(nxt.seq, nxt.token)]) == [seqs[2]]
    (last,) = await s.reclaim(rec.name, "n2", 1, LATER, 10)
    assert last.seq == seqs[5]


async def test_a_lane_spans_claims_and_claimers(engine: Engine) -> None:
    s = engine.store
    rec = await new_group(s)
    one = [m.seq for m in await fill(s, 2)]
    c1 = await take_lanes(s, rec.name, "n1", dict.fromkeys(one, "a"))
    assert [c.seq for c in c1] == one[:1]
    two = [m.seq for m in await fill(s, 2)]
    c2 = await take_lanes(s, rec.name, "n2", {two[0]: "a", two[1]: "z"})
    assert [c.seq for c in c2] == [two[1]]  # lane "a" still has one pending: held back
    assert await s.release_owner(rec.name, "n1") == 1  # the lane's first only; the held back stay held
    (again,) = await s.reclaim(rec.name, "n3", 1, LATER, 10)
    assert (again.seq, again.deliveries) == (one[0], 2)
    assert await s.reclaim(rec.name, "n3", 1, LATER, 10) == []
    order = []
    settle = again
    for _ in range(2):
        assert await s.settle(rec.name, [(settle.seq, settle.token)]) == [settle.seq]
        (settle,) = await s.reclaim(rec.name, "n3", 1, LATER, 10)
        order.append(settle.seq)
    assert order == [one[1], two[0]]


async def test_lanes_survive_a_restart_and_go_with_the_group(engine: Engine) -> None:
    s = engine.store
    rec = await new_group(s, "rmq/g lane/ü")
    seqs = [m.seq for m in await fill(s, 3)]
    (head,) = await take_lanes(s, rec.name, "n1", dict.fromkeys(seqs, "lane ü:1"))
    await s.sync()
    s = await engine.reopen()
    assert await s.reclaim(rec.name, "n2", 1, LATER, 10) == []
    assert await s.settle(rec.name, [(head.seq, head.token)]) == [seqs[0]]
    (nxt,) = await s.reclaim(rec.name, "n2", 1, LATER, 10)
    assert nxt.seq == seqs[1]
    await s.delete_group(rec.name)
    await new_group(s, rec.name)
    more = [m.seq for m in await fill(s, 2)]
    claims = await take_lanes(s, rec.name, "n1", dict.fromkeys(more, "lane ü:1"))
    assert [c.seq for c in claims] == more[:1]  # the lane started afresh with the new group
