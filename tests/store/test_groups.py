"""The consumer-group contract of `store.base.Store` (definitions, cursor, claims, visibility, fetch), run against
each engine of `engine` (embedded, delaying, redis, redis_cluster); plus the embedded KV file's compaction.

Times are explicit `now_ms` / `visible_at_ms` values, never the clock: the contract is about the caller's times.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from tests.store.conftest import Engine
from tests.store.test_contract import content, msg
from tidewire.store.base import Claim, GroupRecord, Message, Store
from tidewire.store.embedded.engine import EmbeddedStore
from tidewire.store.redis.engine import RedisStore

Q = "orders"
LATER = 10_000  # a visible_at far past every now_ms of a test


async def fill(s: Store, n: int, queue: str = Q) -> list[Message]:
    batch = [msg(f"{queue}/{i}", queue) for i in range(n)]
    await s.append(batch)
    return batch


async def take(s: Store, name: str, owner: str, visible_at_ms: int = LATER, limit: int = 1000,
               queue: str = Q) -> tuple[list[Claim], int]:
    """Claim what the group's queue holds past its cursor, as a consumer does: read, then claim."""
    cursor, _ = await s.group_position(name)
    sl = await s.read(queue, cursor, limit)
    return await s.claim(name, cursor, sl.upto, [m.seq for m in sl.messages], owner, visible_at_ms)


async def sealed(s: Store) -> int:
    """Past every append that completed (`last_seq()` may lag behind a partitioned engine's newest seq)."""
    return (await s.read("no/such/queue", 0, 1)).upto


async def new_group(s: Store, name: str = "amqp/v/q") -> GroupRecord:
    rec = GroupRecord(name, [Q], start_seq=await sealed(s), created_ms=123)
    await s.put_group(rec)
    return rec


# --- definitions ------------------------------------------------------------------------------------------


async def test_put_get_list_delete(engine: Engine) -> None:
    s = engine.store
    a = GroupRecord("amqp/v/a", ["x/#", "y"], durable=False, start_seq=7, created_ms=5,
                    attrs={"x-expires": 1000, "args": {"nested": [1, "two", None, True]}})
    b = GroupRecord("rmq/g/t", ["t/#"])
    await s.put_group(a)
    await s.put_group(b)
    assert await s.get_group("amqp/v/a") == a
    assert await s.get_group("nope") is None
    assert sorted((await s.list_groups()), key=lambda r: r.name) == [a, b]
    got = await s.get_group("amqp/v/a")
    assert got is not None
    got.filters.append("z")
    got.attrs["args"]["nested"].clear()
    assert await s.get_group("amqp/v/a") == a  # the caller's copy is its own
    a.attrs["x-expires"] = 1  # so is the record it put
    assert (await s.get_group("amqp/v/a")) != a
    await s.delete_group("amqp/v/a")
    await s.delete_group("never")  # no-op
    assert await s.get_group("amqp/v/a") is None
    assert await s.list_groups() == [b]
    assert await s.group_position("amqp/v/a") == (-1, 0)
    with pytest.raises(ValueError):
        await s.put_group(GroupRecord(""))


async def test_cursor_starts_at_start_seq_and_a_new_definition_keeps_cursor_and_claims(engine: Engine) -> None:
    s = engine.store
    old = await fill(s, 3)
    rec = await new_group(s)
    assert await s.group_position(rec.name) == (rec.start_seq, 0)
    new = await fill(s, 3)
    claims, cursor = await take(s, rec.name, "n1")
    assert [c.seq for c in claims] == [m.seq for m in new]  # nothing from before start_seq
    assert all(c.seq > m.seq for c in claims for m in old)
    redefined = GroupRecord(rec.name, [Q, "more"], start_seq=0, attrs={"v": 2})
    await s.put_group(redefined)
    assert await s.get_group(rec.name) == redefined
    assert await s.group_position(rec.name) == (cursor, 3)  # not back to start_seq 0, claims kept
    assert await s.settle(rec.name, [(c.seq, c.token) for c in claims]) == [c.seq for c in claims]


# --- claims -----------------------------------------------------------------------------------------------


async def test_claim_takes_only_seqs_above_the_cursor(engine: Engine) -> None:
    s = engine.store
    rec = await new_group(s)
    assert await s.claim("nope", 0, 10, [1, 2], "n1", LATER) == ([], -1)
    batch = await fill(s, 6)
    seqs = [m.seq for m in batch]
    first, cursor = await s.claim(rec.name, rec.start_seq, seqs[2], seqs[:3], "n1", LATER)
    assert [c.seq for c in first] == seqs[:3] and cursor == seqs[2]
    assert all(c.deliveries == 1 for c in first) and len({c.token for c in first}) == 3
    # Ahead of the stored cursor: the caller did not read (cursor, after]; nothing happens.
    assert await s.claim(rec.name, seqs[3], seqs[5], seqs[4:], "n2", LATER) == ([], seqs[2])
    assert await s.group_position(rec.name) == (seqs[2], 3)
    # An overlapping window: what is at or below the cursor is somebody's already.
    second, cursor = await s.claim(rec.name, rec.start_seq, seqs[4], seqs[:5], "n2", LATER)
    assert [c.seq for c in second] == seqs[3:5] and cursor == seqs[4]
    assert not {c.token for c in second} & {c.token for c in first}
    # A stale window below the cursor claims nothing and never moves the cursor back.
    assert await s.claim(rec.name, rec.start_seq, seqs[1], seqs[:2], "n3", LATER) == ([], seqs[4])
    # The cursor moves to upto even without seqs (a complete read that found nothing).
    high = seqs[5] + 1000
    assert await s.claim(rec.name, seqs[4], high, [], "n3", LATER) == ([], high)
    assert await s.group_position(rec.name) == (high, 5)
    assert (await take(s, rec.name, "n3"))[0] == []  # seqs[5] is below the cursor now: never claimed


async def test_racing_claimers_claim_every_seq_exactly_once(engine: Engine) -> None:
    s = engine.store
    rec = await new_group(s)
    batches = [await fill(s, 50) for _ in range(6)]
    want = sorted(m.seq for b in batches for m in b)
    stores: list[Store] = [s]
    extra: RedisStore | None = None
    if isinstance(s, RedisStore):  # a second client on the same Redis: another node
        extra = RedisStore(s.url, partitions=s.partitions)
        await extra.open()
        stores.append(extra)
    got: list[int] = []

    async def claimer(i: int) -> None:
        st = stores[i % len(stores)]
        rng = random.Random(i)
        known = rec.start_seq
        while known < want[-1]:
            # Read from a window that may start below the cursor (a slow claimer), with a small limit.
            after = max(rec.start_seq, known - rng.randrange(0, 3) * 7)
            sl = await st.read(Q, after, rng.randrange(1, 20))
            claims, cursor = await st.claim(rec.name, after, sl.upto, [m.seq for m in sl.messages], f"n{i}",
                                            LATER)
            assert cursor >= sl.upto
            assert all(after < c.seq <= sl.upto for c in claims)
            got.extend(c.seq for c in claims)
            known = cursor

    try:
        await asyncio.gather(*(claimer(i) for i in range(8)))
    finally:
        if extra is not None:
            await extra.close()
    assert sorted(got) == want  # every seq once: none twice, none lost
    cursor, pending = await s.group_position(rec.name)
    assert cursor >= want[-1] and pending == len(want)


async def test_reclaim_after_visibility_lowest_seq_first(engine: Engine) -> None:
    s = engine.store
    rec = await new_group(s)
    seqs = [m.seq for m in await fill(s, 5)]
    claims, _ = await take(s, rec.name, "n1", visible_at_ms=1000)
    assert [c.seq for c in claims] == seqs
    assert await s.reclaim(rec.name, "n2", 999, 5000, 10) == []  # still hidden
    assert await s.reclaim(rec.name, "n2", 1000, 5000, 0) == []
    two = await s.reclaim(rec.name, "n2", 1000, 5000, 2)
    assert [(c.seq, c.deliveries) for c in two] == [(q, 2) for q in seqs[:2]]
    assert not {c.token for c in two} & {c.token for c in claims}
    assert await s.settle(rec.name, [(claims[0].seq, claims[0].token)]) == []  # the old handle is dead
    rest = await s.reclaim(rec.name, "n3", 1000, 5000, 10)
    assert [c.seq for c in rest] == seqs[2:]
    assert await s.reclaim(rec.name, "n3", 4999, 6000, 10) == []  # every claim is hidden until 5000 now
    again = await s.reclaim(rec.name, "n4", 5000, 9000, 1)
    assert [(c.seq, c.deliveries) for c in again] == [(seqs[0], 3)]
    assert await s.settle(rec.name, [(again[0].seq, again[0].token)]) == [seqs[0]]
    assert await s.group_position(rec.name) == (seqs[-1], 4)
    assert await s.reclaim("nope", "n1", 1, 2, 10) == []


async def test_reclaim_orders_by_seq_not_by_visibility(engine: Engine) -> None:
    s = engine.store
    rec = await new_group(s)
    await fill(s, 3)
    (a, b, c), _ = await take(s, rec.name, "n1", visible_at_ms=100)
    moved = await s.set_visibility(rec.name, [(a.seq, a.token)], 300)
    moved += await s.set_visibility(rec.name, [(c.seq, c.token)], 200)
    assert [m.seq for m in moved] == [a.seq, c.seq]
    # a became visible last, but is the lowest seq.
    first = await s.reclaim(rec.name, "n2", 400, LATER, 2)
    assert [m.seq for m in first] == [a.seq, b.seq]
    # A caller whose clock is behind (150 < 200) does not get c, although the last call found it due.
    assert await s.reclaim(rec.name, "n3", 150, LATER, 10) == []
    last = await s.reclaim(rec.name, "n3", 200, LATER, 10)
    assert [(m.seq, m.deliveries) for m in last] == [(c.seq, 2)]


async def test_settle_removes_current_handles_only(engine: Engine) -> None:
    s = engine.store
    rec = await new_group(s)
    await fill(s, 4)
    claims, cursor = await take(s, rec.name, "n1")
    h = [(c.seq, c.token) for c in claims]
    assert await s.settle(rec.name, []) == []
    assert await s.settle(rec.name, [h[0], (h[1][0], h[1][1] + 999_999), h[2]]) == [h[0][0], h[2][0]]
    assert await s.settle(rec.name, [h[0]]) == []  # settled already
    assert await s.group_position(rec.name) == (cursor, 2)
    assert await s.settle("nope", h) == []
    assert sorted(await s.settle(rec.name, [h[3], h[1], h[3]])) == [h[1][0], h[3][0]]
    assert await s.group_position(rec.name) == (cursor, 0)


async def test_set_visibility_gives_a_new_token(engine: Engine) -> None:
    s = engine.store
    rec = await new_group(s)
    await fill(s, 3)
    (a, b, c), _ = await take(s, rec.name, "n1", visible_at_ms=LATER)
    requeued = await s.set_visibility(rec.name, [(a.seq, a.token), (b.seq, b.token + 12345)], 0)
    assert len(requeued) == 1 and requeued[0].seq == a.seq and requeued[0].deliveries == 1
    assert requeued[0].token != a.token
    assert await s.set_visibility(rec.name, [(a.seq, a.token)], 0) == []  # the old handle is dead
    assert await s.settle(rec.name, [(a.seq, a.token)]) == []
    got = await s.reclaim(rec.name, "n2", 1, LATER, 10)  # 0: visible now
    assert [(x.seq, x.deliveries) for x in got] == [(a.seq, 2)]
    later = await s.set_visibility(rec.name, [(c.seq, c.token)], 2 * LATER)
    assert [x.seq for x in later] == [c.seq]
    assert [x.seq for x in await s.reclaim(rec.name, "n2", LATER, 3 * LATER, 10)] == [a.seq, b.seq]
    assert [x.seq for x in await s.reclaim(rec.name, "n2", 2 * LATER, LATER, 10)] == [c.seq]
    assert await s.settle(rec.name, [(c.seq, later[0].token)]) == []  # reclaimed since: a new token again
    assert await s.set_visibility("nope", [(a.seq, a.token)], 0) == []
    assert await s.set_visibility(rec.name, [], 0) == []


async def test_ready_claims_are_those_visible_now(engine: Engine) -> None:
    """What a queue's ready count adds to its unclaimed backlog: requeued, lapsed and released claims, not those
    a consumer holds (RabbitMQ's message count leaves out the unacked)."""
    s = engine.store
    rec = await new_group(s)
    await fill(s, 5)
    (a, b, c, d, e), _ = await take(s, rec.name, "n1", visible_at_ms=1000)
    assert await s.ready_claims(rec.name, 999) == []
    await s.set_visibility(rec.name, [(c.seq, c.token)], 0)  # requeued
    await s.set_visibility(rec.name, [(a.seq, a.token)], 2000)  # held longer
    await s.settle(rec.name, [(e.seq, e.token)])
    assert await s.ready_claims(rec.name, 999) == [c.seq]
    assert await s.ready_claims(rec.name, 1000) == [b.seq, c.seq, d.seq]  # b and d lapsed
    got = await s.reclaim(rec.name, "n2", 1000, LATER, 1)  # reclaimed: held again
    assert [x.seq for x in got] == [b.seq]
    assert await s.ready_claims(rec.name, 1000) == [c.seq, d.seq]
    assert await s.release_owner(rec.name, "n2") == 1
    assert await s.ready_claims(rec.name, 2000) == [a.seq, b.seq, c.seq, d.seq]
    assert await s.ready_claims("nope", 1000) == []


async def test_release_owner_makes_its_claims_visible(engine: Engine) -> None:
    s = engine.store
    # Names and owners that share a prefix at a ':' must not mix.
    g1, g2 = "x", "x:y"
    await s.put_group(GroupRecord(g1, [Q], start_seq=await sealed(s)))
    await s.put_group(GroupRecord(g2, [Q], start_seq=await sealed(s)))
    await fill(s, 3)
    c1, _ = await take(s, g1, "n1")
    c2, _ = await take(s, g2, "y:n1")
    cursor = (await s.group_position(g1))[0]
    c3, _ = await s.claim(g1, cursor, cursor + 100, [cursor + 50, cursor + 60], "n2", LATER)
    assert await s.release_owner(g1, "y:n1") == 0
    assert await s.release_owner(g2, "n1") == 0
    assert await s.release_owner(g1, "n1") == 3
    assert await s.release_owner(g1, "n1") == 0
    got = await s.reclaim(g1, "n3", 1, LATER, 10)
    assert [(c.seq, c.deliveries) for c in got] == [(c.seq, 2) for c in c1]
    assert await s.release_owner(g1, "n3") == 3
    assert await s.release_owner(g1, "n2") == 2
    assert await s.release_owner(g2, "y:n1") == 3
    assert [c.seq for c in await s.reclaim(g1, "n4", 1, LATER, 10)] == sorted(c.seq for c in c1 + c3)
    assert await s.release_owner("nope", "n1") == 0
    assert await s.settle(g2, [(c.seq, c.token) for c in c2]) == [c.seq for c in c2]  # the token stays


async def test_delete_group_drops_its_claims(engine: Engine) -> None:
    s = engine.store
    rec = await new_group(s)
    await fill(s, 3)
    claims, _ = await take(s, rec.name, "n1", visible_at_ms=0)
    await s.delete_group(rec.name)
    assert await s.group_position(rec.name) == (-1, 0)
    assert await s.settle(rec.name, [(c.seq, c.token) for c in claims]) == []
    assert await s.reclaim(rec.name, "n1", 1, LATER, 10) == []
    assert await s.release_owner(rec.name, "n1") == 0
    # Declared again: a new cursor, no claims, and no handle of the old group matches a new claim.
    await s.put_group(GroupRecord(rec.name, [Q], start_seq=rec.start_seq))
    assert await s.group_position(rec.name) == (rec.start_seq, 0)
    again, _ = await take(s, rec.name, "n2")
    assert [(c.seq, c.deliveries) for c in again] == [(c.seq, 1) for c in claims]
    assert await s.settle(rec.name, [(c.seq, c.token) for c in claims]) == []
    assert await s.group_position(rec.name) == (again[-1].seq, 3)


async def test_fetch_by_seq(engine: Engine) -> None:
    s = engine.store
    batch = [msg(f"t/{i}", "a" if i % 2 else "b") for i in range(6)]
    await s.append(batch)
    seqs = [m.seq for m in batch]
    got = await s.fetch([seqs[4], seqs[1], seqs[1], s.last_seq() + 10**6, 0, -3, seqs[2]])
    assert [m.seq for m in got] == [seqs[1], seqs[2], seqs[4]]
    assert [content(m) for m in got] == [content(batch[i]) for i in (1, 2, 4)]
    assert await s.fetch([]) == []


# --- persistence ------------------------------------------------------------------------------------------


async def test_groups_survive_a_restart(engine: Engine) -> None:
    s = engine.store
    name = "amqp/v h/q:1 ü"  # spaces, ':' and non-ASCII in the name
    rec = GroupRecord(name, [Q], start_seq=await sealed(s), attrs={"x-expires": 5, "deep": {"l": [1, None]}})
    await s.put_group(rec)
    batch = await fill(s, 6)
    seqs = [m.seq for m in batch]
    claims, _ = await take(s, name, "n1")
    assert await s.settle(name, [(claims[0].seq, claims[0].token)]) == [seqs[0]]
    (moved,) = await s.set_visibility(name, [(claims[1].seq, claims[1].token)], 0)
    # A read sealed past the log's end, claimed: the cursor is above every seq appended so far.
    sl = await s.read(Q, seqs[-1], 10, seal=seqs[-1] + 1000)
    _, cursor = await s.claim(name, seqs[-1], sl.upto, [], "n1", LATER)
    assert cursor == sl.upto >= seqs[-1] + 1000
    tokens = {c.token for c in claims} | {moved.token}
    await s.sync()
    s = await engine.reopen()
    assert await s.get_group(name) == rec
    assert await s.list_groups() == [rec]
    assert await s.group_position(name) == (cursor, 5)
    assert await s.settle(name, [(claims[1].seq, claims[1].token)]) == []  # dead before the restart
    assert await s.settle(name, [(claims[2].seq, claims[2].token)]) == [seqs[2]]
    (back,) = await s.reclaim(name, "n2", 1, LATER, 10)
    assert (back.seq, back.deliveries) == (seqs[1], 2) and back.token > max(tokens)
    assert await s.release_owner(name, "n1") == 3
    assert [c.seq for c in await s.reclaim(name, "n2", 1, LATER, 10)] == seqs[3:]
    (late,) = await fill(s, 1)
    assert late.seq > cursor  # never below what the group's cursor passed
    fresh, _ = await take(s, name, "n2")
    assert [c.seq for c in fresh] == [late.seq] and fresh[0].token > max(tokens)
    assert [content(m) for m in await s.fetch(seqs)] == [content(m) for m in batch]


async def test_embedded_groups_survive_many_rewrites_and_a_reopen(tmp_path: Path) -> None:
    s = EmbeddedStore(tmp_path / "data")
    await s.open()
    try:
        await s.put_group(GroupRecord("g", [Q]))
        await s.put_group(GroupRecord("dead", [Q]))
        await s.claim("dead", 0, 5, [1, 2, 3], "n1", LATER)
        await s.delete_group("dead")
        cursor = 0
        rounds = 3
        tokens: set[int] = set()
        for _ in range(rounds):  # claim and settle: the newest claims' records are rewritten, then deleted
            claims, cursor = await s.claim("g", cursor, cursor + 2000, range(cursor + 1, cursor + 2001), "n1",
                                           LATER)
            tokens |= {c.token for c in claims}
            # Settling the newest claims of each round: compaction drops every record of the highest tokens.
            assert len(await s.settle("g", [(c.seq, c.token) for c in claims[2:]])) == 1998
        kept = claims[:2]
        assert await s.release_owner("g", "n1") == 2 * rounds  # visible now; tokens unchanged
        position = await s.group_position("g")
        assert position == (cursor, 2 * rounds)
    finally:
        await s.close()
    s = EmbeddedStore(tmp_path / "data")
    await s.open()
    try:
        assert await s.group_position("g") == position
        assert await s.group_position("dead") == (-1, 0)
        assert await s.settle("g", [(kept[1].seq, kept[1].token + 1)]) == []
        assert await s.settle("g", [(kept[1].seq, kept[1].token)]) == [kept[1].seq]
        assert s.last_seq() >= cursor
        # The token counter survived: no new token repeats one handed out before, although the claims that had
        # the highest ones were settled and deleted.
        again = await s.reclaim("g", "n2", 1, LATER, 2 * rounds)
        assert len(again) == 2 * rounds - 1 and again[0].seq == 1 and kept[1].seq not in {c.seq for c in again}
        assert min(c.token for c in again) > max(tokens)
    finally:
        await s.close()


async def test_pending_claims_list_handles_holders_and_times(engine: Engine) -> None:
    """What an operator lists of a group (delayed publishes): every pending claim above a seq, in seq order, with
    the handle that settles it, its holder and when it shows again; settled ones are gone, a listed handle goes
    stale once the claim is taken again."""
    s = engine.store
    rec = await new_group(s)
    await fill(s, 4)
    (a, b, c, d), _ = await take(s, rec.name, "n1", visible_at_ms=5000)
    moved = await s.set_visibility(rec.name, [(b.seq, b.token)], 7000)
    await s.settle(rec.name, [(c.seq, c.token)])
    listed = await s.pending_claims(rec.name, 0, 10)
    assert [(p.seq, p.deliveries, p.token, p.visible_at_ms, p.owner) for p in listed] == [
        (a.seq, 1, a.token, 5000, "n1"), (b.seq, 1, moved[0].token, 7000, "n1"), (d.seq, 1, d.token, 5000, "n1")]
    assert [p.seq for p in await s.pending_claims(rec.name, a.seq, 1)] == [b.seq]
    assert await s.settle(rec.name, [(listed[0].seq, listed[0].token)]) == [a.seq]
    again = await s.reclaim(rec.name, "n2", 5000, LATER, 10)
    assert [x.seq for x in again] == [d.seq]
    assert await s.settle(rec.name, [(d.seq, listed[2].token)]) == []  # reclaimed since: the listed handle is stale
    assert [(p.seq, p.owner) for p in await s.pending_claims(rec.name, 0, 10)] == [(b.seq, "n1"), (d.seq, "n2")]
    assert await s.pending_claims(rec.name, 0, 0) == []
    assert await s.pending_claims("nope", 0, 10) == []
