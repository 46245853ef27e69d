"""The Redis store's session indexes, paging and bounded epochs (`store.redis.meta`), on a real redis-server.

- the indexes a starting node reads (online, due, counted filters and shared members) stay equal to
  what every stored session says, through random puts, claims and deletes;
- what a start reads does not grow with the number of stored sessions (the bytes Redis sends);
- epochs are bounded (client ids without a record are forgotten after `epoch_ttl`) and still fence off a
  stale writer after that;
- a store written without the indexes is indexed once at open, a page at a time.
"""
# ruff: noqa: F811 - the fixtures imported from the support module are requested by name as parameters

from __future__ import annotations

import random
import time

import pytest
import redis.asyncio as aioredis

from tests.store.redis.redis_cluster_support import OPEN, opened, server  # noqa: F401 - fixtures by name
from tests.store.redis_server import RedisServer, command
from tests.waiting import until
from tidewire.store.base import NEVER_EXPIRES, SHARED_PREFIX, SessionRecord, SubscriptionRecord, counted_filter
from tidewire.store.redis.engine import RedisStore

FILTERS = ["a/+", "b/#", "c/1", "$share/g1/a/+", "$share/g2/x", "p2p#c1"]


def rec(client_id: str, filters: list[str], online: bool = False, expiry: int = 60, epoch: int = 0) -> SessionRecord:
    subs = {f: SubscriptionRecord(f, 1) for f in filters}
    return SessionRecord(client_id, 5, expiry, subs, disconnected_at_ms=0 if online else 1_000_000, epoch=epoch)


async def truth(s: RedisStore) -> tuple[set[str], dict[str, int], dict[str, set[str]]]:
    """Online ids, filter counts and shared members, from every stored session."""
    online: set[str] = set()
    counts: dict[str, int] = {}
    members: dict[str, set[str]] = {}
    for r in await s.list_sessions():
        if r.client_id.startswith(SHARED_PREFIX):
            continue
        if r.disconnected_at_ms == 0:
            online.add(r.client_id)
        for f in r.subscriptions:
            if counted_filter(f):
                counts[f] = counts.get(f, 0) + 1
                if f.startswith(SHARED_PREFIX):
                    members.setdefault(f, set()).add(r.client_id)
    return online, counts, members


async def assert_indexed(s: RedisStore) -> None:
    online, counts, members = await truth(s)
    assert set(await s.online_sessions()) == online
    assert await s.subscription_filters() == counts
    for f in ("$share/g1/a/+", "$share/g2/x"):
        assert set(await s.shared_members(f)) == members.get(f, set())


async def test_indexes_follow_puts_claims_and_deletes(server: RedisServer, opened: OPEN) -> None:
    s = await opened(server.url)
    rng = random.Random(7)
    epochs: dict[str, int] = {}
    for step in range(600):
        cid = rng.choice([f"c{i}" for i in range(40)] + ["$share/g1/a/+", "$share/g2/x"])
        op = rng.random()
        if op < 0.5:
            filters = rng.sample(FILTERS, rng.randint(0, 4))
            assert await s.put_session(rec(cid, filters, online=rng.random() < 0.3, epoch=epochs.get(cid, 0)))
        elif op < 0.7:
            _, epochs[cid] = await s.claim_session(cid, "n1")
        elif op < 0.8:  # a stale writer: refused, and the indexes unchanged
            if epochs.get(cid, 0) > 0:
                assert not await s.put_session(rec(cid, ["z/+"], epoch=epochs[cid] - 1))
        else:
            await s.delete_session(cid, rng.choice([-1, epochs.get(cid, 0)]))
        if step % 50 == 0:
            await assert_indexed(s)
    await assert_indexed(s)
    assert "z/+" not in await s.subscription_filters()


async def test_paging_returns_every_session_once(server: RedisServer, opened: OPEN) -> None:
    s = await opened(server.url)
    await s.put_sessions([rec(f"c{i}", ["a/+"]) for i in range(2500)])
    pages = [page async for page in s._meta.session_pages(count=300)]
    ids = [r.client_id for page in pages for r in page]
    assert sorted(ids) == sorted(f"c{i}" for i in range(2500))
    assert len(pages) > 5 and max(len(p) for p in pages) < 1000  # HSCAN COUNT is a hint: about 300 a page
    assert await s.subscription_filters() == {"a/+": 2500}


async def start_reads(url: str, port: int) -> int:
    """The bytes Redis sends for what a node's start asks of the store (a fresh store: open, the start calls)."""
    command(port, "CONFIG", "RESETSTAT")
    before = int(_info(port, "stats")["total_net_output_bytes"])
    s = RedisStore(url)
    await s.open()
    try:
        await s.online_sessions()
        for f in await s.subscription_filters():
            if f.startswith(SHARED_PREFIX):
                await s.shared_members(f)
        await s.due_sessions(0, 1000)
    finally:
        await s.close()
    return int(_info(port, "stats")["total_net_output_bytes"]) - before


def _info(port: int, section: str) -> dict[str, str]:
    text = command(port, "INFO", section).decode()
    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)


@pytest.mark.slow  # 20,000 sessions written
async def test_a_start_reads_what_is_online_not_what_is_stored(server: RedisServer) -> None:
    async def fill(first: int, n: int) -> None:
        async with RedisStore(server.url) as s:
            await s.put_sessions([rec(f"c{i}", [f"f/{i % 10}/+", "$share/g/a/+"] if i % 100 == 0
                                      else [f"f/{i % 10}/+"], expiry=NEVER_EXPIRES) for i in range(first, n)])

    await fill(0, 2000)
    small = await start_reads(server.url, server.port)
    await fill(2000, 20_000)
    large = await start_reads(server.url, server.port)
    # Ten times the sessions: the start reads the same (the shared group has 10x the members; that is all).
    assert large < small * 1.5 + 20_000, (small, large)


async def test_epochs_of_clients_without_a_record_are_forgotten_and_still_fence(server: RedisServer,
                                                                             opened: OPEN) -> None:
    s = await opened(server.url, epoch_ttl=0.2)
    raw = aioredis.Redis.from_url(server.url)
    try:
        # A persistent session, taken over by another node, then deleted: its stale writer holds epoch 1.
        _, stale = await s.claim_session("dev", "n1")
        assert await s.put_session(rec("dev", ["a/+"], epoch=stale))
        _, fresh = await s.claim_session("dev", "n2")
        await s.delete_session("dev", fresh)
        for i in range(500):  # clean sessions: claimed, never written
            _, epoch = await s.claim_session(f"clean{i}", "n1")
            assert int(await raw.hget("{tw}:ep", f"clean{i}")) == epoch  # kept while its writer may write
        time.sleep(0.25)  # past epoch_ttl (server time, so no clock to pass in)

        async def bounded() -> bool:
            await s.claim_session("tick", "n1")
            return int(await raw.hlen("{tw}:ep")) <= 2

        await until(bounded, timeout=10)
        # After its epoch went: the stale writer is still refused, nothing comes back.
        assert not await s.put_session(rec("dev", ["a/+"], epoch=stale))
        assert not await s.put_session(rec("dev", ["a/+"], epoch=fresh - 1))
        assert await s.get_session("dev") is None
        # A new claim is above every earlier one, and its writes land.
        _, again = await s.claim_session("dev", "n3")
        assert again > fresh
        assert await s.put_session(rec("dev", ["a/+"], epoch=again))
        assert await s.subscription_filters() == {"a/+": 1}
    finally:
        await raw.aclose()


async def test_a_store_without_the_indexes_is_indexed_once_at_open(server: RedisServer, opened: OPEN) -> None:
    s = await opened(server.url)
    await s.put_sessions([rec(f"c{i}", ["a/+", "$share/g/x"] if i % 2 else ["b/#"], online=i % 3 == 0)
                          for i in range(2300)])
    await s.put_session(rec("$share/g/x", []))
    raw = aioredis.Redis.from_url(server.url)
    try:
        # As an earlier build left it: no filter, group or member index, no tombstones, every epoch ever seen.
        await raw.delete("{tw}:sf", "{tw}:flt", "{tw}:grp", "{tw}:shm:$share/g/x", "{tw}:tomb", "{tw}:idx",
                         "{tw}:on")
        await raw.hset("{tw}:ep", mapping={f"gone{i}": 3 for i in range(1500)})
        fresh = await opened(server.url, epoch_ttl=0.2)
        await assert_indexed(fresh)
        assert await fresh.subscription_filters() == {"a/+": 1150, "$share/g/x": 1150, "b/#": 1150}
        assert await raw.zcard("{tw}:tomb") == 1500  # the stray epochs now expire
        again = await opened(server.url)  # built once: a second open leaves the counts as they are
        assert await again.subscription_filters() == {"a/+": 1150, "$share/g/x": 1150, "b/#": 1150}
        assert not await fresh.put_session(rec("gone1", [], epoch=2))  # fenced as before
    finally:
        await raw.aclose()
