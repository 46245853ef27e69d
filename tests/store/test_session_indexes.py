"""What a starting node reads instead of every session, on every engine: sessions marked online, the expiry
index, the counts of wildcard and shared filters, shared members and the shared groups' records."""

from __future__ import annotations

from tests.store.conftest import Engine
from tidewire.store.base import NEVER_EXPIRES, SessionRecord, SubscriptionRecord

NOW = 1_800_000_000_000


def session(cid: str, *filters: str, online: bool = False, expiry: int = 60, epoch: int = 0) -> SessionRecord:
    return SessionRecord(cid, protocol_level=5, expiry_interval=expiry,
                         subscriptions={f: SubscriptionRecord(f, 1) for f in filters},
                         disconnected_at_ms=0 if online else NOW, epoch=epoch)


async def test_online_and_due_sessions_follow_puts_and_deletes(engine: Engine) -> None:
    s = engine.store
    await s.put_session(session("on", online=True))
    await s.put_session(session("soon", expiry=10))
    await s.put_session(session("later", expiry=100))
    await s.put_session(session("never", expiry=NEVER_EXPIRES))
    await s.put_session(SessionRecord("$share/g/a/+", offset=3))  # a group's record: neither online nor due
    assert await s.online_sessions() == ["on"]
    assert await s.due_sessions(NOW + 10_000, 10) == ["soon"]
    assert await s.due_sessions(NOW + 100_000, 10) == ["soon", "later"]  # soonest first
    assert await s.due_sessions(NOW + 100_000, 1) == ["soon"]
    assert await s.due_sessions(NOW + 10**12, 10) == ["soon", "later"]  # never expiring: never due

    await s.put_session(session("on", expiry=5))  # went offline
    await s.put_session(session("soon", online=True))  # came back
    assert await s.online_sessions() == ["soon"]
    assert await s.due_sessions(NOW + 10_000, 10) == ["on"]
    await s.delete_session("on")
    await s.delete_session("soon")
    assert await s.online_sessions() == []
    assert await s.due_sessions(NOW + 100_000, 10) == ["later"]
    if engine.persistent:
        s = await engine.reopen()
        assert await s.due_sessions(NOW + 100_000, 10) == ["later"]


async def test_a_fenced_put_changes_no_index(engine: Engine) -> None:
    s = engine.store
    _, epoch = await s.claim_session("c", "n1")
    await s.put_session(session("c", "a/+", online=True, epoch=epoch))
    assert not await s.put_session(session("c", "b/#", expiry=1, epoch=epoch - 1))
    assert await s.online_sessions() == ["c"]
    assert await s.due_sessions(NOW + 10**9, 10) == []
    assert await s.subscription_filters() == {"a/+": 1}


async def test_filter_counts_members_and_groups(engine: Engine) -> None:
    s = engine.store
    share = "$share/g/jobs/#"
    await s.put_session(session("a", "x/+", "y/#", share, "plain/topic"))
    await s.put_session(session("b", "x/+", share))
    await s.put_session(session("c", "plain/topic"))
    await s.put_session(SessionRecord(share, offset=7))
    assert await s.subscription_filters() == {"x/+": 2, "y/#": 1, share: 2}
    assert sorted(await s.shared_members(share)) == ["a", "b"]
    assert await s.shared_members("$share/other/x") == []

    await s.put_session(session("a", "x/+"))  # unsubscribed from two
    await s.delete_session("b")
    assert await s.subscription_filters() == {"x/+": 1}
    assert await s.shared_members(share) == []
    if engine.persistent:
        s = await engine.reopen()
        assert await s.subscription_filters() == {"x/+": 1}


async def test_subscribed_sees_stored_sessions_exact_topics_and_counted_filters(engine: Engine) -> None:
    s = engine.store
    assert not await s.subscribed(["dev/1/cmd", "dev/#"])
    await s.put_session(session("a", "dev/1/cmd", "x/+"))  # offline, persistent
    await s.put_session(session("b", "dev/#", "dev/2/cmd", online=True))
    await s.put_session(SessionRecord("$share/g/grp/topic", offset=3))  # a group's record: not a subscriber
    assert await s.subscribed(["dev/1/cmd"]) and await s.subscribed(["dev/2/cmd"])
    assert await s.subscribed(["nothing", "dev/#"]) and await s.subscribed(["x/+"])
    assert not await s.subscribed(["dev/3/cmd", "dev/1", "grp/topic", "x/#", "p2p#a"])
    await s.put_session(session("a", "x/+"))  # unsubscribed from dev/1/cmd
    await s.put_session(session("b", "dev/2/cmd", online=True))  # ... from dev/#
    assert not await s.subscribed(["dev/1/cmd", "dev/#"])
    assert await s.subscribed(["dev/2/cmd"])
    if engine.persistent:
        s = await engine.reopen()
        assert await s.subscribed(["dev/2/cmd"]) and not await s.subscribed(["dev/1/cmd"])
    await s.delete_session("b")
    assert not await s.subscribed(["dev/2/cmd"])
    assert await s.shared_members("grp/topic") == []  # the exact index is no shared group's membership
