"""The backlog cap's cut (`gateway.sessions.backlog`) over real stores: the new offset keeps exactly the newest
N of a session's queues, overlapping queues included, and the count of what it drops."""

from __future__ import annotations

from pathlib import Path

from tidewire.gateway.sessions.backlog import cap_backlog, cut
from tidewire.store.base import Message, SessionRecord, SubscriptionRecord
from tidewire.store.embedded.engine import EmbeddedStore


def test_cut_keeps_the_newest_distinct_seqs() -> None:
    assert cut([(3, [5, 6, 7])], 3) is None  # at the cap: nothing to drop
    assert cut([(10, [8, 9, 10])], 2) == (8, 8)  # 10 waiting, 2 kept: the offset is the newest dropped
    # two queues, merged: 9 and 10 kept; each queue's count minus its seqs above 8
    assert cut([(4, [2, 4, 6, 10]), (5, [5, 7, 8, 9])], 2) == (8, 4 + 3)


async def test_cap_backlog_moves_the_offset_below_the_newest(tmp_path: Path) -> None:
    store = EmbeddedStore(tmp_path / "data", fsync="never", segment_bytes=4096)
    await store.open()
    try:
        await store.append([Message(f"t/{i}", b"x" * 50, queues=("a/+", "t/#") if i % 2 else ("t/#",))
                            for i in range(200)])
        record = SessionRecord("c", offset=0, subscriptions={
            "a/+": SubscriptionRecord("a/+", 1), "t/#": SubscriptionRecord("t/#", 1, since_seq=10),
            "$share/g/t/#": SubscriptionRecord("$share/g/t/#", 1)})  # a group's cursor is not the session's
        last = store.last_seq()
        assert await cap_backlog(store, record, 0) == 0 and record.offset == 0  # 0: no cap
        # "a/+" holds 100 (all also in "t/#"), "t/#" 190 above its since_seq: counted per queue
        dropped = await cap_backlog(store, record, 25)
        assert record.offset == last - 25
        assert dropped == 100 - 13 + 190 - 25  # the 25 kept: 13 of them also in "a/+"
        assert await cap_backlog(store, record, 25) == 0  # at the cap now
        # a QoS 2 message sent and not PUBREC'd below the cut: not cut this time
        record = SessionRecord("d", offset=0, subscriptions={"t/#": SubscriptionRecord("t/#", 1)},
                               outbound_qos2={7: 3})
        assert await cap_backlog(store, record, 25) == 0 and record.offset == 0
    finally:
        await store.close()
