"""`store.embedded.meta.store.MetaStore` (RocksDB): sessions with fencing and their indexes against a dict model,
retained matching against the trie, wills, group records, reopen, the legacy `meta.kv` import, and kill -9 of a writer
(also while RocksDB compacts)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.store.retained_oracle import RetainedIndex
from tidewire.gateway.core.topics import matches
from tidewire.store.base import NEVER_EXPIRES, GroupRecord, Message, SessionRecord, SubscriptionRecord, WillRecord
from tidewire.store.embedded.kv import GROUP_DEF, OFFSET, RETAINED, SESSION, WILL, KVFile
from tidewire.store.embedded.meta.keys import RETAINED as RETAINED_NS
from tidewire.store.embedded.meta.keys import counted_filter, decode_session_value, encode_session, expiry_deadline
from tidewire.store.embedded.meta.maintenance import check
from tidewire.store.embedded.meta.store import MetaLimits, MetaStore
from tidewire.store.groups import GroupTable
from tidewire.store.records import OFFSETS, encode_message_body, encode_will
from tidewire.store.records import encode_session as legacy_encode_session

ROOT = Path(__file__).resolve().parents[4]
# Tiny memtables: flushes and compactions happen within a few hundred KB of writes.
TINY = MetaLimits(write_buffer_bytes=256 * 1024, block_cache_bytes=1 << 20, max_background_jobs=2)


@pytest.fixture
def meta(tmp_path: Path) -> Iterator[MetaStore]:
    m = MetaStore.open(tmp_path / "meta.rocks")
    yield m
    m.close()


def session(cid: str, **kw: object) -> SessionRecord:
    kw.setdefault("expiry_interval", 300)
    return SessionRecord(
        client_id=cid, protocol_level=5,
        subscriptions={
            "a/+": SubscriptionRecord("a/+", 1, no_local=True, subscription_id=7, since_seq=3),
            "$share/g/b/#": SubscriptionRecord("b/#", 2, retain_as_published=True, retain_handling=2),
            "p2p#" + cid: SubscriptionRecord("p2p#" + cid, 2),
        },
        inbound_qos2=[1, 65535], outbound_pubrel=[9], **kw,  # type: ignore[arg-type]
    )


def consistent(m: MetaStore) -> None:
    found, problems = check(m, batch=7)
    assert found == 0, problems


# --- sessions -------------------------------------------------------------------------------------------------


def test_session_codec_round_trip_and_legacy_json() -> None:
    rec = session("c\u00e9", offset=5, sent_upto=9, disconnected_at_ms=123, owner="n1", epoch=4)
    assert decode_session_value(rec.client_id, encode_session(rec)) == rec
    assert decode_session_value(rec.client_id, legacy_encode_session(rec)) == rec
    with pytest.raises(ValueError):
        decode_session_value("x", encode_session(rec)[:-1])
    with pytest.raises(ValueError):
        decode_session_value("x", b"\x07junk")


def test_sessions_fencing_offsets_and_copies(meta: MetaStore) -> None:
    rec = session("c1", disconnected_at_ms=1000)
    assert meta.put_session(rec)
    rec.subscriptions.clear()  # the store kept its own bytes
    got = meta.get_session("c1")
    assert got == session("c1", disconnected_at_ms=1000)
    got2, epoch = meta.claim_session("c1", "n1")
    assert got2 is not None and (got2.owner, got2.epoch) == ("n1", epoch) and epoch >= 1
    assert not meta.put_session(session("c1", epoch=epoch - 1))  # fenced
    meta.set_offsets({"c1": (10, 11, epoch - 1), "ghost": (50, 50, 0)})  # older epoch, unknown session
    got = meta.get_session("c1")
    assert got is not None and (got.offset, got.sent_upto, got.owner, got.epoch) == (0, 0, "n1", epoch)
    meta.set_offsets({"c1": (10, 11, epoch)})
    got = meta.get_session("c1")
    assert got is not None and (got.offset, got.sent_upto) == (10, 11)
    assert meta.get_session("ghost") is None
    # a claim carries the offsets into the record; the next claim is higher; a missing client gets one too
    _, epoch2 = meta.claim_session("c1", "n2")
    none, epoch3 = meta.claim_session("nobody", "n2")
    assert none is None and epoch3 > epoch2 > epoch
    got = meta.get_session("c1")
    assert got is not None and (got.offset, got.sent_upto, got.owner, got.epoch) == (10, 11, "n2", epoch2)
    meta.delete_session("c1", epoch2 - 1)  # fenced: stays
    assert meta.get_session("c1") is not None
    assert meta.put_sessions([session("c1", epoch=epoch2), session("c1", epoch=epoch2 - 1), session("c2")]) == [
        True, False, True]
    meta.delete_session("c1", epoch2)
    meta.delete_session("c2")
    meta.delete_session("never")
    assert meta.get_session("c1") is None and meta.get_session("c2") is None
    assert meta.counts()["sessions"] == 0 and meta.high_seq() == 11
    consistent(meta)


def test_iteration_indexes_and_reopen(tmp_path: Path) -> None:
    m = MetaStore.open(tmp_path / "db")
    for i in range(25):
        m.put_session(session(f"c{i:02}", disconnected_at_ms=0 if i % 5 == 0 else 1000 + i,
                              expiry_interval=NEVER_EXPIRES if i % 3 == 0 else 10))
    m.put_session(SessionRecord("$share/g/b/#", offset=4, sent_upto=4))
    m.set_offsets({"c07": (70, 71, 0)})
    assert [len(b) for b in m.iter_sessions(10)] == [10, 10, 6]
    assert [r.client_id for b in m.iter_sessions(4, prefix="c1") for r in b] == [f"c{i}" for i in range(10, 20)]
    assert [r.client_id for b in m.iter_sessions(100, prefix="$share/") for r in b] == ["$share/g/b/#"]
    c07 = next(r for b in m.iter_sessions(3) for r in b if r.client_id == "c07")
    assert (c07.offset, c07.sent_upto) == (70, 71)
    online = ["$share/g/b/#"] + [f"c{i:02}" for i in range(0, 25, 5)]
    assert m.online_sessions() == online
    finite = sorted((1000 + i + 10_000, f"c{i:02}") for i in range(25) if i % 5 and i % 3)
    assert m.due_sessions(11_010, 100) == [c for d, c in finite if d <= 11_010]
    assert m.due_sessions(10**15, 3) == [c for _, c in finite[:3]]
    assert m.due_sessions(10**15, 0) == []
    assert m.next_expiry() == finite[0][0]
    assert m.subscription_filters() == {"a/+": 25, "$share/g/b/#": 25}
    assert m.shared_members("$share/g/b/#") == [f"c{i:02}" for i in range(25)]
    assert m.shared_members("$share/g/b") == []
    m.put_session(replace(session("c00"), subscriptions={}, disconnected_at_ms=5, expiry_interval=1))
    assert m.subscription_filters() == {"a/+": 24, "$share/g/b/#": 24}
    assert "c00" not in m.online_sessions() and m.due_sessions(6000, 1) == ["c00"]
    m.set_retained("t/1", Message("t/1", b"x", retain=True))
    m.put_will(WillRecord("c01", Message("dead/c01", b"bye", qos=1)))
    before = ([r for b in m.iter_sessions() for r in b], m.online_sessions(), m.due_sessions(10**15, 100),
              m.subscription_filters(), m.counts())
    m.close()
    m = MetaStore.open(tmp_path / "db")
    after = ([r for b in m.iter_sessions() for r in b], m.online_sessions(), m.due_sessions(10**15, 100),
             m.subscription_filters(), m.counts())
    assert after == before
    assert after[4] == {"sessions": 26, "retained": 1, "retained_bytes": 57, "wills": 1, "high_seq": 71}
    # reopened with our options, not those rocksdict reads back from the OPTIONS file (no filter, own cache)
    assert m.stats()["meta_block_cache_capacity"] == MetaLimits().block_cache_bytes
    options_file = max(p for p in (tmp_path / "db").iterdir() if p.name.startswith("OPTIONS-"))
    assert "filter_policy=bloomfilter" in options_file.read_text()
    assert [m.payload for m in m.match_retained("t/+")] == [b"x"]
    assert [w.message.topic for w in m.list_wills()] == ["dead/c01"]
    consistent(m)
    m.close()


FILTERS = ["a/+", "a/#", "$share/g/a/+", "$share/h/b", "x/y", "p2p#c1", "+/z"]


@st.composite
def session_ops(draw: st.DrawFn) -> list[tuple[object, ...]]:
    ops: list[tuple[object, ...]] = []
    for _ in range(draw(st.integers(1, 30))):
        cid = draw(st.sampled_from(["c1", "c2", "c3", "$share/g/a/+"]))
        kind = draw(st.sampled_from(["put", "put", "del", "claim", "off", "reopen"]))
        if kind == "put":
            subs = draw(st.lists(st.sampled_from(FILTERS), max_size=4, unique=True))
            ops.append((kind, cid, subs, draw(st.sampled_from([0, 1000, 5000])),
                        draw(st.sampled_from([0, 5, NEVER_EXPIRES])), draw(st.integers(0, 6)),
                        draw(st.integers(0, 100))))
        elif kind == "del":
            ops.append((kind, cid, draw(st.integers(-1, 6))))
        elif kind == "off":
            ops.append((kind, cid, draw(st.integers(0, 200)), draw(st.integers(0, 6))))
        else:
            ops.append((kind, cid))
    return ops


@pytest.mark.slow  # several seconds (a real node, a build or a long model run): make test-slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(session_ops())
def test_sessions_and_indexes_follow_a_dict_model(ops: list[tuple[object, ...]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "db"
        m = MetaStore.open(path)
        model: dict[str, SessionRecord] = {}
        last_claim = 0
        try:
            for op in ops:
                kind, cid = op[0], str(op[1])
                old = model.get(cid)
                if kind == "put":
                    subs, disc, expiry, epoch, offset = op[2], op[3], op[4], op[5], op[6]
                    assert isinstance(subs, list)
                    rec = SessionRecord(cid, 5, int(str(expiry)), {f: SubscriptionRecord(f, 1) for f in subs},
                                        int(str(offset)), int(str(offset)), disconnected_at_ms=int(str(disc)),
                                        epoch=int(str(epoch)))
                    ok = old is None or rec.epoch >= old.epoch
                    assert m.put_session(rec) == ok
                    if ok:
                        model[cid] = replace(rec, subscriptions=dict(rec.subscriptions))
                elif kind == "del":
                    epoch = int(str(op[2]))
                    m.delete_session(cid, epoch)
                    if old is not None and (epoch < 0 or epoch >= old.epoch):
                        del model[cid]
                elif kind == "off":
                    m.set_offsets({cid: (int(str(op[2])), int(str(op[2])) + 1, int(str(op[3])))})
                    if old is not None and int(str(op[3])) >= old.epoch:
                        old.offset, old.sent_upto = int(str(op[2])), int(str(op[2])) + 1
                elif kind == "claim":
                    got, epoch = m.claim_session(cid, "n")
                    last_claim = max(last_claim, old.epoch if old is not None else 0) + 1
                    assert epoch == last_claim
                    if old is not None:
                        old.epoch, old.owner = epoch, "n"
                    assert got == old
                else:
                    m.close()
                    m = MetaStore.open(path)
                    last_claim = 0
                for c in ("c1", "c2", "c3", "$share/g/a/+"):
                    assert m.get_session(c) == model.get(c)
            assert m.online_sessions() == sorted(c for c, r in model.items() if r.disconnected_at_ms == 0)
            deadlines = sorted((d, c) for c, r in model.items() if (d := expiry_deadline(r)) is not None)
            assert m.due_sessions(2000, 10) == [c for d, c in deadlines if d <= 2000]
            assert m.due_sessions(10**15, 10) == [c for _, c in deadlines]
            counted: dict[str, int] = {}
            for r in model.values():
                for f in r.subscriptions:
                    if counted_filter(f):
                        counted[f] = counted.get(f, 0) + 1
            assert m.subscription_filters() == counted
            for g in ("$share/g/a/+", "$share/h/b"):
                assert m.shared_members(g) == sorted(c for c, r in model.items() if g in r.subscriptions)
            assert m.counts()["sessions"] == len(model)
            consistent(m)
        finally:
            m.close()


# --- retained -------------------------------------------------------------------------------------------------


def topics(msgs: list[Message]) -> list[str]:
    return sorted(m.topic for m in msgs)


def test_retained_semantics_of_the_embedded_store(tmp_path: Path) -> None:
    # the cases of tests/store/embedded/test_record_calls.py, against MetaStore
    m = MetaStore.open(tmp_path / "db")
    for t in ["a", "a/b", "a/c", "a/b/c", "x/b", "$SYS/load", "$SYS/a/b", "/lead", "a//b"]:
        m.set_retained(t, Message(t, t.encode(), retain=True))
    m.set_retained("a/b", Message("a/b", b"new", retain=True))
    m.set_retained("x/b", None)
    m.set_retained("not/there", None)

    def check_matches(store: MetaStore) -> None:
        assert topics(store.match_retained("a/b")) == ["a/b"]
        assert [m.payload for m in store.match_retained("a/b")] == [b"new"]
        assert topics(store.match_retained("a/+")) == ["a/b", "a/c"]
        assert topics(store.match_retained("a/#")) == ["a", "a//b", "a/b", "a/b/c", "a/c"]
        assert topics(store.match_retained("+/b")) == ["a/b"]
        assert topics(store.match_retained("#")) == ["/lead", "a", "a//b", "a/b", "a/b/c", "a/c"]
        assert topics(store.match_retained("+")) == ["a"]
        assert topics(store.match_retained("+/+")) == ["/lead", "a/b", "a/c"]
        assert topics(store.match_retained("$SYS/#")) == ["$SYS/a/b", "$SYS/load"]
        assert topics(store.match_retained("$SYS/+")) == ["$SYS/load"]
        assert topics(store.match_retained("a/+/b")) == ["a//b"]
        assert store.match_retained("x/#") == []
        assert len(store.match_retained("#", limit=2)) == 2
        assert store.counts()["retained"] == 8

    check_matches(m)
    m.close()
    m = MetaStore.open(tmp_path / "db")
    check_matches(m)
    m.close()


LEVELS = ["a", "b", "", "$SYS", "$x", "a.b", "a0", "\u00e9"]
topic_st = st.lists(st.sampled_from(LEVELS), min_size=1, max_size=4).map("/".join)
filter_st = st.tuples(st.lists(st.sampled_from([*LEVELS, "+"]), min_size=0, max_size=4),
                      st.booleans()).map(lambda t: "/".join([*t[0], "#"] if t[1] or not t[0] else t[0]))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(topic_st, st.booleans()), min_size=1, max_size=40), st.lists(filter_st, min_size=1,
                                                                                           max_size=15))
def test_retained_matching_agrees_with_the_trie(meta: MetaStore, writes: list[tuple[str, bool]],
                                                filters: list[str]) -> None:
    for key, _ in list(meta.scan(RETAINED_NS)):
        meta.set_retained(key[1:].decode(), None)  # the fixture's store is shared by every example
    trie = RetainedIndex()
    for i, (t, keep) in enumerate(writes):
        msg = Message(t, b"%d" % i, retain=True) if keep else None
        meta.set_retained(t, msg)
        if msg is None:
            trie.delete(t)
        else:
            trie.set(t, msg)
    for f in filters:
        want = sorted((m.topic, m.payload) for m in trie.match(f))
        assert sorted((m.topic, m.payload) for m in meta.match_retained(f)) == want, f
        assert all(matches(f, t) for t, _ in want)
        cut = [(m.topic, m.payload) for m in meta.match_retained(f, limit=2)]
        assert len(cut) == min(2, len(want)) and set(cut) <= set(want)
        # Pages of 2, each after the last topic of the one before: all of them once, in bytewise topic order.
        paged: list[tuple[str, bytes]] = []
        while page := meta.match_retained(f, limit=2, after=paged[-1][0] if paged else None):
            paged += [(m.topic, m.payload) for m in page]
        assert paged == sorted(want, key=lambda tp: tp[0].encode()), f
    assert meta.counts()["retained"] == len(trie)


# --- wills and groups -------------------------------------------------------------------------------------------


def test_wills_and_group_records_round_trip(tmp_path: Path) -> None:
    m = MetaStore.open(tmp_path / "db")
    m.put_will(WillRecord("c1", Message("dead/c1", b"bye", qos=1, retain=True, properties=b"\x03\x00\x01x"), 30,
                          owner="n1"))
    m.put_will(WillRecord("c2", Message("dead/c2", b"")))
    m.put_will(WillRecord("c2", Message("dead/c2", b"again")))
    m.delete_will("c1")
    m.delete_will("never")
    table = GroupTable(m.write, lambda: None)
    table.put_group(GroupRecord("amqp/v/q", ["q/#"], start_seq=5, attrs={"x": 1}))
    claims, cursor = table.claim("amqp/v/q", 5, 9, [6, 7, 8], "n1", 1000)
    assert [c.seq for c in claims] == [6, 7, 8] and cursor == 9
    table.settle("amqp/v/q", [(6, claims[0].token)])
    m.write(sets=[(GROUP_DEF + 2, "1 amqp/v/gone", b"\x01\x00\x00\x00" + bytes(16))])  # a claim of no group
    m.close()
    m = MetaStore.open(tmp_path / "db")
    assert [(w.client_id, w.message.payload) for w in m.list_wills()] == [("c2", b"again")]
    assert m.counts()["wills"] == 1
    table = GroupTable(m.write, lambda: None)
    m.replay(table.replay)
    table.loaded()
    assert table.group_position("amqp/v/q") == (9, 2)
    assert table.get_group("amqp/v/q") == GroupRecord("amqp/v/q", ["q/#"], start_seq=5, attrs={"x": 1})
    seen: list[str] = []
    m.replay(lambda ns, key, value: seen.append(key))
    assert "1 amqp/v/gone" not in seen and len(seen) == 5  # the dead claim was deleted; "" is the token counter
    m.close()


# --- legacy import ----------------------------------------------------------------------------------------------


def write_legacy(path: Path) -> None:
    kv = KVFile(path)
    kv.open(lambda ns, key, value: None)
    kv.write(sets=[(SESSION, "c1", legacy_encode_session(session("c1", disconnected_at_ms=7, epoch=3))),
                   (SESSION, "c2", legacy_encode_session(session("c2"))),
                   (OFFSET, "c1", OFFSETS.pack(40, 41)), (OFFSET, "ghost", OFFSETS.pack(1, 1)),
                   (RETAINED, "r/1", encode_message_body(Message("r/1", b"one", retain=True), 12)),
                   (RETAINED, "r/2", encode_message_body(Message("r/2", b"two", retain=True), 13)),
                   (WILL, "c1", encode_will(WillRecord("c1", Message("dead/c1", b"bye"), 5))),
                   (GROUP_DEF, "amqp/v/q", b'{"name":"amqp/v/q","filters":["q"],"start_seq":3}')])
    kv.write(sets=[(SESSION, "c3", legacy_encode_session(session("c3")))], deletes=[(SESSION, "c2"), (RETAINED, "r/2")])
    kv.close()


def test_legacy_meta_kv_is_imported_once(tmp_path: Path) -> None:
    legacy = tmp_path / "meta.kv"
    write_legacy(legacy)
    (tmp_path / "meta.rocks.importing").mkdir()  # a crashed earlier import: discarded
    (tmp_path / "meta.rocks.importing" / "junk").write_bytes(b"x")
    m = MetaStore.open(tmp_path / "meta.rocks", legacy_kv=legacy)
    assert not legacy.exists() and (tmp_path / "meta.kv.imported").exists()
    assert not (tmp_path / "meta.rocks.importing").exists()
    c1 = m.get_session("c1")
    assert c1 is not None and c1 == session("c1", disconnected_at_ms=7, epoch=3, offset=40, sent_upto=41)
    assert m.get_session("c2") is None and m.get_session("ghost") is None
    assert m.get_session("c3") == session("c3")
    assert [(x.topic, x.payload, x.seq) for x in m.match_retained("r/#")] == [("r/1", b"one", 12)]
    assert [w.client_id for w in m.list_wills()] == ["c1"]
    assert m.counts() == {"sessions": 2, "retained": 1, "retained_bytes": 59, "wills": 1, "high_seq": 41}
    assert m.online_sessions() == ["c3"] and m.due_sessions(10**9, 10) == ["c1"]
    table = GroupTable(m.write, lambda: None)
    m.replay(table.replay)
    assert table.group_position("amqp/v/q") == (3, 0)
    consistent(m)
    m.close()
    # imported, then crashed before renaming meta.kv: the database is kept, the file renamed
    os.rename(tmp_path / "meta.kv.imported", legacy)
    m = MetaStore.open(tmp_path / "meta.rocks", legacy_kv=legacy)
    assert not legacy.exists() and m.counts()["sessions"] == 2
    m.close()


# --- kill -9 ------------------------------------------------------------------------------------------------


def crash_record(cid: str) -> SessionRecord:
    h = sum(cid.encode())
    return SessionRecord(cid, 5, 60 if h % 2 else NEVER_EXPIRES,
                         {f"dev/{cid}/+": SubscriptionRecord(f"dev/{cid}/+", 1, since_seq=h),
                          "$share/g/cmd/#": SubscriptionRecord("$share/g/cmd/#", 1),
                          "long/" + "x" * 300: SubscriptionRecord("long/" + "x" * 300, 0)},
                         h, h, disconnected_at_ms=0 if h % 3 == 0 else 10_000 + h)


def crash_child(path: str, round_: int) -> None:
    """Writer run in a child process: prints each batch's operations, then `ack` once they are synced."""
    m = MetaStore.open(path, limits=TINY)
    rng = random.Random(round_)
    live = [r.client_id for b in m.iter_sessions(500) for r in b]
    n = 0
    while True:
        n += 1
        new = [f"c{round_}-{n}-{i}" for i in range(30)]
        dels = rng.sample(live, min(4, len(live)))
        offs = [c for c in rng.sample(live, min(8, len(live))) if c not in dels]
        print("op", n, " ".join(new), " ".join(dels), " ".join(offs), sep="|", flush=True)
        m.put_sessions([crash_record(c) for c in new])
        for c in dels:
            m.delete_session(c)
        m.set_offsets({c: (n, n + 1, 0) for c in offs})
        m.sync_work()
        print("ack", n, m.stats()["meta_running_compactions"], flush=True)
        live = [c for c in live if c not in dels] + new


class CrashModel:
    """What the writer acknowledged: offsets of each live session, None once deleted; and the batch in flight."""

    def __init__(self) -> None:
        self.acked: dict[str, tuple[int, int] | None] = {}
        self.pending: list[str] = []
        self.in_flight: set[str] = set()

    def line(self, line: str) -> tuple[int, int] | None:
        """Apply one line of the child; (batch, running compactions) for an ack."""
        if line.startswith("op"):
            self.pending = line.rstrip("\n").split("|")
            self.in_flight = {c for part in self.pending[2:] for c in part.split()}
            return None
        _, n, running = line.split()
        _, n_op, new, dels, offs = self.pending
        assert n == n_op
        for c in new.split():
            r = crash_record(c)
            self.acked[c] = (r.offset, r.sent_upto)
        for c in dels.split():
            self.acked[c] = None
        for c in offs.split():
            self.acked[c] = (int(n), int(n) + 1)
        self.in_flight = set()
        return int(n), int(running)


@pytest.mark.slow  # several seconds (a real node, a build or a long model run): make test-slow
def test_kill_9_loses_nothing_acknowledged(tmp_path: Path) -> None:
    path = tmp_path / "db"
    model = CrashModel()
    killed_compacting = 0
    for round_ in range(5):
        child = subprocess.Popen(
            [sys.executable, "-c", f"from tests.store.embedded.meta.test_store import crash_child; "
                                   f"crash_child({str(path)!r}, {round_})"],
            cwd=ROOT, stdout=subprocess.PIPE, text=True)
        assert child.stdout is not None
        acks = compacting = running = 0
        try:
            for line in child.stdout:
                ack = model.line(line)
                if ack is None:
                    continue
                acks += 1
                running = ack[1]
                compacting += running > 0
                # odd rounds: die while RocksDB reports a compaction running (or after enough batches)
                if acks >= 150 or (round_ % 2 and running > 0 and acks > 20) or (not round_ % 2 and acks > 40):
                    break
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait()
            for line in child.stdout:  # what it printed before it died: the batch in flight, maybe its ack
                model.line(line)
            child.stdout.close()
        m = MetaStore.open(path, limits=TINY)
        try:
            for c, want in model.acked.items():
                if c in model.in_flight:
                    continue  # in flight when killed: either way
                got = m.get_session(c)
                if want is None:
                    assert got is None, c
                else:
                    assert got is not None, c
                    assert replace(got, offset=0, sent_upto=0) == replace(crash_record(c), offset=0, sent_upto=0)
                    assert (got.offset, got.sent_upto) == want, c
            for c in model.in_flight:  # the next round starts from whatever the in-flight batch left
                got = m.get_session(c)
                model.acked[c] = None if got is None else (got.offset, got.sent_upto)
            consistent(m)
            print(f"round {round_}: {acks} batches acknowledged, {compacting} with a compaction running, "
                  f"killed {'while compacting' if running > 0 else 'between compactions'}")
            killed_compacting += round_ % 2 == 1 and running > 0
        finally:
            m.close()
    assert sum(1 for v in model.acked.values() if v is not None) > 100
    assert killed_compacting >= 1  # at least one kill landed while RocksDB reported a compaction running


def test_dedupe_keys_by_scope_and_those_above_the_log_dropped(meta: MetaStore) -> None:
    # "a" and "a\0x" share a byte prefix: each scope lists only its own ids.
    meta.hold_dedupe([("a", "1", 5), ("a", "2", 10), ("a\x00x", "3", 6), ("b", "1", 12)])
    assert sorted(meta.dedupe_ids("a")) == ["1", "2"] and meta.dedupe_ids("a\x00x") == ["3"]
    assert meta.dedupe_seqs([("a", "2"), ("b", "1"), ("b", "2")]) == [10, 12, None]
    # After a crash the log ends at seq 9: the keys of messages it lost go (their senders send them again).
    assert meta.drop_dedupe_above(9) == 2
    assert meta.dedupe_ids("a") == ["1"] and meta.dedupe_ids("b") == []
    meta.release_dedupe("a", None)
    assert meta.dedupe_ids("a") == [] and meta.dedupe_ids("a\x00x") == ["3"]
