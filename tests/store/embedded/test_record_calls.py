"""Sessions, offsets, wills and retained messages of EmbeddedStore, the import of a legacy KV file, and the
retained trie."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tests.store.retained_oracle import RetainedIndex
from tidewire.store.base import Message, SessionRecord, SubscriptionRecord, WillRecord
from tidewire.store.embedded.engine import EmbeddedStore
from tidewire.store.embedded.kv import OFFSET, RETAINED, SESSION, KVFile
from tidewire.store.records import OFFSETS, encode_message_body, encode_session


async def reopen(path: Path) -> EmbeddedStore:
    s = EmbeddedStore(path)
    await s.open()
    return s


def session(cid: str, **kw: object) -> SessionRecord:
    return SessionRecord(
        client_id=cid, protocol_level=5, expiry_interval=300,
        subscriptions={
            "a/+": SubscriptionRecord("a/+", 1, no_local=True, subscription_id=7, since_seq=3),
            "b/#": SubscriptionRecord("b/#", 2, retain_as_published=True, retain_handling=2),
        },
        inbound_qos2=[1, 2], outbound_pubrel=[9], **kw,  # type: ignore[arg-type]
    )


async def test_sessions_and_offsets_round_trip(tmp_path: Path) -> None:
    s = await reopen(tmp_path)
    rec = session("c1", disconnected_at_ms=123)
    await s.put_session(rec)
    await s.put_session(session("c2"))
    rec.offset = 999  # the store kept its own copy
    got = await s.get_session("c1")
    assert got == session("c1", disconnected_at_ms=123)
    assert got is not None
    got.subscriptions.clear()
    assert (await s.get_session("c1")) == session("c1", disconnected_at_ms=123)
    await s.set_offsets({"c1": (10, 12, 0), "c2": (4, 4, 0), "ghost": (50, 50, 0)})
    await s.set_offsets({"c1": (11, 12, 0)})
    assert await s.get_session("ghost") is None
    await s.sync()
    await s.close()

    s = await reopen(tmp_path)
    c1 = await s.get_session("c1")
    assert c1 is not None and (c1.offset, c1.sent_upto) == (11, 12)
    assert c1.subscriptions["a/+"] == SubscriptionRecord(
        "a/+", 1, no_local=True, subscription_id=7, since_seq=3
    )
    assert sorted(r.client_id for r in await s.list_sessions()) == ["c1", "c2"]
    assert s.last_seq() == 12  # offsets count when choosing the next seq
    # a later put wins over earlier offsets; delete removes session and offsets
    await s.put_session(session("c1"))
    await s.delete_session("c2")
    await s.delete_session("unknown")
    await s.close()

    s = await reopen(tmp_path)
    c1 = await s.get_session("c1")
    assert c1 is not None and (c1.offset, c1.sent_upto) == (0, 0)
    assert await s.get_session("c2") is None
    assert [r.client_id for r in await s.list_sessions()] == ["c1"]
    await s.close()


async def test_wills_round_trip(tmp_path: Path) -> None:
    s = await reopen(tmp_path)
    w = WillRecord("c1", Message("dead/c1", b"bye", qos=1, retain=True, properties=b"\x03\x00\x01x"), 30)
    await s.put_will(w)
    await s.put_will(WillRecord("c2", Message("dead/c2", b"")))
    await s.delete_will("c2")
    await s.delete_will("never")
    await s.close()
    s = await reopen(tmp_path)
    wills = await s.list_wills()
    assert len(wills) == 1
    got = wills[0]
    assert (got.client_id, got.delay_interval) == ("c1", 30)
    m = got.message
    assert (m.topic, m.payload, m.qos, m.retain) == ("dead/c1", b"bye", 1, True)
    assert m.properties == b"\x03\x00\x01x"
    await s.close()


def topics(msgs: list[Message]) -> list[str]:
    return sorted(m.topic for m in msgs)


async def test_retained_set_replace_delete_and_match(tmp_path: Path) -> None:
    s = await reopen(tmp_path)
    for t in ["a", "a/b", "a/c", "a/b/c", "x/b", "$SYS/load", "$SYS/a/b", "/lead", "a//b"]:
        await s.set_retained(t, Message(t, t.encode(), retain=True))
    await s.set_retained("a/b", Message("a/b", b"new", retain=True))
    await s.set_retained("x/b", None)
    await s.set_retained("not/there", None)

    async def check(store: EmbeddedStore) -> None:
        assert topics(await store.match_retained("a/b")) == ["a/b"]
        assert [m.payload for m in await store.match_retained("a/b")] == [b"new"]
        assert topics(await store.match_retained("a/+")) == ["a/b", "a/c"]
        assert topics(await store.match_retained("a/#")) == ["a", "a//b", "a/b", "a/b/c", "a/c"]
        assert topics(await store.match_retained("+/b")) == ["a/b"]
        assert topics(await store.match_retained("#")) == ["/lead", "a", "a//b", "a/b", "a/b/c", "a/c"]
        assert topics(await store.match_retained("+")) == ["a"]
        assert topics(await store.match_retained("+/+")) == ["/lead", "a/b", "a/c"]
        assert topics(await store.match_retained("$SYS/#")) == ["$SYS/a/b", "$SYS/load"]
        assert topics(await store.match_retained("$SYS/+")) == ["$SYS/load"]
        assert topics(await store.match_retained("a/+/b")) == ["a//b"]
        assert await store.match_retained("x/#") == []
        assert store.stats()["retained"] == 8

    await check(s)
    await s.close()
    s = await reopen(tmp_path)
    await check(s)
    await s.close()


def test_retained_index_prunes_empty_branches() -> None:
    idx = RetainedIndex()
    m = Message("a/b/c", b"1")
    idx.set("a/b/c", m)
    assert idx.get("a/b/c") is m and idx.get("a/b") is None
    assert idx.delete("a/b/c")
    assert not idx.delete("a/b/c")
    assert len(idx) == 0 and idx._root.children == {}


async def test_latest_values_survive_many_rewrites(tmp_path: Path) -> None:
    s = await reopen(tmp_path)
    payload = b"p" * 2000  # 60 rounds rewrite ~2.5 MB of retained values: past the 1 MB threshold
    for round_ in range(60):
        await s.put_session(session("c1", disconnected_at_ms=round_))
        await s.set_offsets({f"c{i}": (round_, round_ + 1, 0) for i in range(1, 4)})
        for t in range(20):
            await s.set_retained(f"r/{t}", Message(f"r/{t}", payload + b"%d" % round_, retain=True))
        await s.put_will(WillRecord("w", Message("w", b"%d" % round_)))
        if round_ == 0:
            await s.put_session(session("c2"))
            await s.put_session(session("gone"))
            await s.set_retained("r/gone", Message("r/gone", b"x"))
        if round_ == 1:
            await s.delete_session("gone")
            await s.set_retained("r/gone", None)
    await s.set_offsets({"c1": (77, 78, 0)})
    await s.close()
    s = await reopen(tmp_path)
    c1 = await s.get_session("c1")
    assert c1 is not None and (c1.disconnected_at_ms, c1.offset, c1.sent_upto) == (59, 77, 78)
    c2 = await s.get_session("c2")
    assert c2 is not None and (c2.offset, c2.sent_upto) == (59, 60)
    assert await s.get_session("gone") is None
    assert sorted(r.client_id for r in await s.list_sessions()) == ["c1", "c2"]
    got = await s.match_retained("r/#")
    assert len(got) == 20 and all(m.payload == payload + b"59" for m in got)
    assert [w.message.payload for w in await s.list_wills()] == [b"59"]
    await s.close()


async def test_a_legacy_kv_file_is_imported_without_its_torn_tail(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A data directory of a build before RocksDB: its `meta.kv` is imported once, a torn last record cut."""
    kv = KVFile(tmp_path / "meta.kv")
    kv.open(lambda ns, key, value: None)
    kv.write(sets=[(SESSION, "c1", encode_session(session("c1")))])
    kv.write(sets=[(RETAINED, "r/1", encode_message_body(Message("r/1", b"kept", retain=True), 4))])
    kv.write(sets=[(OFFSET, "c1", OFFSETS.pack(5, 6))])
    kv.close()
    data = (tmp_path / "meta.kv").read_bytes()
    (tmp_path / "meta.kv").write_bytes(data[:-3])  # the offsets record is torn
    with caplog.at_level(logging.WARNING, logger="tidewire.store"):
        s = await reopen(tmp_path)
    assert "cutting" in caplog.text
    c1 = await s.get_session("c1")
    assert c1 is not None and (c1.offset, c1.sent_upto) == (0, 0)
    assert [m.payload for m in await s.match_retained("r/+")] == [b"kept"]
    await s.set_offsets({"c1": (8, 9, 0)})
    await s.close()
    assert not (tmp_path / "meta.kv").exists() and (tmp_path / "meta.kv.imported").exists()
    s = await reopen(tmp_path)
    c1 = await s.get_session("c1")
    assert c1 is not None and (c1.offset, c1.sent_upto) == (8, 9)
    await s.close()


def test_kv_file_compaction_threshold(tmp_path: Path) -> None:
    kv = KVFile(tmp_path / "m.kv", compact_min_bytes=1000)
    kv.open(lambda ns, key, value: None)
    for i in range(100):
        kv.write(sets=[(1, "k", b"v" * 50 + bytes([i]))])
    assert kv.needs_compaction()
    kv.compact([(1, "k", b"final")])
    assert not kv.needs_compaction()
    kv.close()
    seen: list[tuple[int, str, bytes | None]] = []
    kv2 = KVFile(tmp_path / "m.kv")
    kv2.open(lambda ns, key, value: seen.append((ns, key, value)))
    assert seen == [(1, "k", b"final")]
    kv2.close()
