"""The store contract, continued: what a cluster of nodes sharing one store relies on. Run against each engine of
`engine`: reads that say up to where they are complete, sealed high-water marks, session claims that fence
older owners, the versioned wildcard set, leases."""

from __future__ import annotations

import asyncio

import pytest

from tests.store.conftest import Engine
from tests.store.test_contract import full_session, msg
from tidewire.errors import StaleWildcards


async def test_read_says_up_to_where_it_is_complete(engine: Engine) -> None:
    s = engine.store
    await s.append([msg("a", "x")])
    await s.append([msg("b", "y"), msg("c", "y")])
    before = s.last_seq()
    x = await s.read("x", 0, 10)
    assert [m.topic for m in x.messages] == ["a"]
    # Nothing new in x, but the answer covers every append that completed before the read (also y's).
    assert x.upto >= (await s.read("y", 0, 10)).messages[-1].seq and x.upto >= before
    cut = await s.read("y", 0, 1)
    assert cut.upto == cut.messages[-1].seq  # cut at the limit: complete only up to the last message
    empty = await s.read("no/such/queue", 0, 10)
    assert empty.messages == [] and empty.upto >= before
    sealed = await s.read("x", x.upto, 10, seal=x.upto + 1000)
    assert sealed.upto >= x.upto + 1000
    await s.append([msg("d", "x")])  # no later append lands at or below what was sealed
    after = await s.read("x", x.upto, 10)
    assert [m.topic for m in after.messages] == ["d"] and after.messages[0].seq > sealed.upto


async def test_last_seq_is_sealed(engine: Engine) -> None:
    s = engine.store
    await s.append([msg("a", "q")])
    mark = s.last_seq()
    await s.append([msg("b", "q"), msg("c", "r")])
    assert all(m.seq > mark for m in (await s.read("q", 0, 10)).messages[1:])
    assert all(m.seq > mark for m in (await s.read("r", 0, 10)).messages)


async def test_claim_fences_off_older_owners(engine: Engine) -> None:
    s = engine.store
    none, first = await s.claim_session("c1", "n1")
    assert none is None and first >= 1
    rec = full_session("c1")
    rec.owner, rec.epoch = "n1", first
    assert await s.put_session(rec)
    got, second = await s.claim_session("c1", "n2")
    assert second > first and got is not None and got.owner == "n2" and got.epoch == second
    stale = full_session("c1", offset=99, sent_upto=99)
    stale.owner, stale.epoch = "n1", first
    assert not await s.put_session(stale)  # n1 lost the client: its record is not written back
    await s.set_offsets({"c1": (77, 77, first)})  # nor its offsets
    kept = await s.get_session("c1")
    assert kept is not None and kept.offset == rec.offset
    await s.delete_session("c1", first)  # nor may it delete the session
    assert await s.get_session("c1") is not None
    await s.set_offsets({"c1": (8, 9, second)})
    kept = await s.get_session("c1")
    assert kept is not None and (kept.offset, kept.sent_upto) == (8, 9)
    await s.delete_session("c1", second)
    assert await s.get_session("c1") is None


async def test_wildcard_set_versions_and_stale_appends(engine: Engine) -> None:
    s = engine.store
    v0, filters = await s.wildcards()
    assert filters == frozenset()
    v1 = await s.add_wildcards(["a/+"], "n1")
    assert v1 > v0
    assert await s.add_wildcards(["a/+"], "n2") == v1  # a second holder: the set is unchanged
    assert await s.add_wildcards(["a/+"], "n2") == v1  # a repeated add (a resend) counts once
    assert await s.wildcards() == (v1, frozenset({"a/+"}))
    with pytest.raises(StaleWildcards):
        await s.append([msg("a/b", "a/b")], wildcard_version=v0)
    assert (await s.read("a/b", 0, 10)).messages == []  # nothing of the refused batch was stored
    await s.append([msg("a/b", "a/b", "a/+")], wildcard_version=v1)
    await s.append([msg("a/c", "a/c")])  # -1: unchecked
    assert await s.remove_wildcards(["a/+"], "n1") == v1  # one holder left
    assert await s.remove_wildcards(["a/+"], "n1") == v1  # n1 held it once: n2 still does
    v2 = await s.remove_wildcards(["a/+"], "n2")
    assert v2 > v1 and await s.wildcards() == (v2, frozenset())
    assert await s.remove_wildcards(["never/+"], "n1") == v2


async def test_released_holder_leaves_what_others_hold(engine: Engine) -> None:
    """A node declared dead: what only it held leaves the set, what another node holds stays."""
    s = engine.store
    await s.add_wildcards(["dead/+", "both/#"], "n1")
    v1 = await s.add_wildcards(["both/#"], "n2")
    v2 = await s.release_wildcards("n1")
    assert v2 > v1 and await s.wildcards() == (v2, frozenset({"both/#"}))
    assert await s.release_wildcards("n1") == v2  # nothing left to release
    assert await s.remove_wildcards(["both/#"], "n1") == v2  # released holds are gone for good
    assert (await s.wildcards())[1] == frozenset({"both/#"})


async def test_lease_has_one_holder_at_a_time(engine: Engine) -> None:
    s = engine.store
    first = await s.lease("g", "n1", 300)
    assert first > 0
    assert await s.lease("g", "n2", 300) == 0  # held by n1
    assert await s.lease("g", "n1", 300) == first  # a renewal keeps the epoch
    await s.release("g", "n2")  # not the holder: nothing happens
    assert await s.lease("g", "n2", 300) == 0
    await s.release("g", "n1")
    second = await s.lease("g", "n2", 300)
    assert second > first  # taken anew: a new epoch fences the former holder
    await asyncio.sleep(0.4)  # the behaviour under test: expired (300 ms) without a renewal
    third = await s.lease("g", "n1", 300)
    assert third > second
    assert await s.lease("other", "n2", 300) > 0  # leases are independent
