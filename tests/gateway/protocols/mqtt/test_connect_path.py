"""The pieces that keep a connect cheap: shared connection deadlines, sampled connect/disconnect log lines,
`$SYS` events batched per tick and published only when somebody can read them, and the record writes' view of
what a client has under way."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import pytest

from tests.waiting import until
from tidewire.extensions.authentication import AuthChain, AuthRequest
from tidewire.gateway.config import Settings
from tidewire.gateway.core.writes import RecordWrites
from tidewire.gateway.ops.logs import Sampled
from tidewire.gateway.ops.sys_topics import SysTopics
from tidewire.gateway.transport.admission import Admission
from tidewire.gateway.transport.deadlines import DEADLINE_TICK_S, Deadlines
from tidewire.store.base import Message, WillRecord
from tidewire.store.embedded.engine import EmbeddedStore


class Clock:
    """A connection's side of a deadline: records when it was told, files itself again `again` times."""

    def __init__(self, deadlines: Deadlines, again: int = 0) -> None:
        self.deadlines = deadlines
        self.again = again
        self.told: list[float] = []

    def deadline_due(self, now: float) -> None:
        self.told.append(time.monotonic())
        if self.again:
            self.again -= 1
            self.deadlines.file(self, now + 0.15)


async def test_deadlines_fire_in_order_never_early_and_at_most_a_tick_late() -> None:
    deadlines = Deadlines()
    start = time.monotonic()
    late, early = Clock(deadlines), Clock(deadlines)
    deadlines.file(late, start + 0.3)
    deadlines.file(early, start + 0.1)
    await until(lambda: early.told and late.told, timeout=3, what="both deadlines told")
    assert len(early.told) == 1 and len(late.told) == 1
    assert early.told[0] < late.told[0]
    for clock, due in ((early, start + 0.1), (late, start + 0.3)):
        assert due - 0.003 <= clock.told[0] <= due + DEADLINE_TICK_S + 0.1, (clock.told[0] - start, due - start)
    assert len(deadlines) == 0


async def test_a_discarded_deadline_is_not_told_and_one_filed_again_is() -> None:
    deadlines = Deadlines()
    gone, again = Clock(deadlines), Clock(deadlines, again=2)
    bucket = deadlines.file(gone, time.monotonic() + 0.1)
    deadlines.file(again, time.monotonic() + 0.1)
    bucket.discard(gone)
    await until(lambda: len(again.told) == 3, timeout=3, what="told, filed again twice, told twice more")
    assert gone.told == []  # it was due in the tick of the first of those
    assert len(deadlines) == 0


async def test_a_deadline_that_closes_another_of_its_bucket_is_safe() -> None:
    deadlines = Deadlines()
    when = time.monotonic() + 0.1

    class Closer(Clock):
        def deadline_due(self, now: float) -> None:
            super().deadline_due(now)
            for other in others:
                bucket.discard(other)  # e.g. a takeover closes another connection due in the same tick

    others = [Clock(deadlines) for _ in range(5)]
    closer = Closer(deadlines)
    bucket = deadlines.file(closer, when)
    for other in others:
        deadlines.file(other, when)
    await until(lambda: closer.told, timeout=3, what="the closer told")  # the whole bucket is done in that tick
    assert len(closer.told) == 1
    assert all(len(o.told) <= 1 for o in others)  # some may have come before the closer; none twice
    later = Clock(deadlines)
    deadlines.file(later, time.monotonic() + 0.1)
    await until(lambda: later.told, timeout=3, what="a deadline filed afterwards told")  # the timer lives on
    assert len(later.told) == 1


async def test_sampled_lines_up_to_the_rate_then_one_summary(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("tidewire.test.sampled")
    sampled = Sampled(logger, "clients.activity", rate=5, burst=3, interval=0.2)
    with caplog.at_level(logging.INFO, logger="tidewire.test.sampled"):
        allowed = [sampled.line("connected") for _ in range(10)]
        assert allowed[:3] == [True, True, True]
        assert allowed.count(True) == 3  # the burst; the rest are counted
        await until(lambda: any(r.getMessage() == "clients.activity" for r in caplog.records), timeout=3,
                    what="the summary at the end of the interval")
    summaries = [r for r in caplog.records if r.getMessage() == "clients.activity"]
    assert len(summaries) == 1
    assert summaries[0].__dict__["unlogged"] == 7
    assert summaries[0].__dict__["connected"] == 7  # counted from the first unlogged one


async def test_sampled_is_silent_when_info_is_off() -> None:
    logger = logging.getLogger("tidewire.test.sampled_off")
    logger.setLevel(logging.WARNING)
    sampled = Sampled(logger, "clients.activity", rate=1, burst=1, interval=0.05)
    assert not any(sampled.line("connected") for _ in range(5))


async def test_sys_events_are_published_in_one_batch_after_the_tick_and_only_when_read() -> None:
    published: list[Message] = []
    sys_topics = SysTopics("n1", published.append)
    sys_topics.audience = lambda topic: "/watched/" in topic
    sys_topics.event("watched", "connected", address="127.0.0.1:1", proto_ver=4)
    sys_topics.event("nobody", "connected", address="127.0.0.1:2", proto_ver=4)
    sys_topics.event("watched", "disconnected", address="127.0.0.1:1", proto_ver=4, reason="gone")
    assert published == []  # not in the caller's call: CONNACK first
    await asyncio.sleep(0)  # the tick ends: the batch goes out in the next turn of the loop
    assert [m.topic for m in published] == ["$SYS/brokers/n1/clients/watched/connected",
                                            "$SYS/brokers/n1/clients/watched/disconnected"]
    assert b'"reason": "gone"' in published[1].payload


async def test_sys_events_without_an_audience_check_are_all_published() -> None:
    published: list[Message] = []
    sys_topics = SysTopics("n1", published.append)
    for i in range(3):
        sys_topics.event(f"c{i}", "connected", address="x", proto_ver=5)
    await asyncio.sleep(0)  # the tick ends: the batch goes out in the next turn of the loop
    assert len(published) == 3


async def test_record_writes_know_what_a_client_has_under_way(tmp_path: Path) -> None:
    store = EmbeddedStore(tmp_path, fsync="never")
    await store.open()
    try:
        writes = RecordWrites(store)
        assert writes.idle("c1")
        writes.save_will(WillRecord("c1", Message("w/c1", b"bye", 1, False, b"", 0)))
        assert not writes.idle("c1")
        await writes.will_settled("c1")
        assert not writes.idle("c1")  # its will is stored
        writes.drop_will("c1")
        await writes.will_settled("c1")
        assert writes.idle("c1")
        assert len(await store.list_wills()) == 0
    finally:
        await store.close()


@pytest.mark.parametrize("allow_anonymous", [True, False])
@pytest.mark.parametrize("credentials", [True, False])
async def test_a_sourceless_chain_is_answered_without_waiting_as_it_would_answer(
        allow_anonymous: bool, credentials: bool) -> None:
    chain = AuthChain((), allow_anonymous)
    admission = Admission(Settings())
    answer = admission.sourceless(chain, credentials)
    expected = await chain.authenticate(AuthRequest("c1", "alice" if credentials else None,
                                                    b"secret" if credentials else None, "127.0.0.1:1"))
    assert answer == expected
    assert admission.sourceless(chain, credentials) is answer  # asked once
