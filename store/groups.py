"""Consumer-group state of a one-process engine (definitions, cursors, pending claims) and its KV records.

Pure state: every change is handed to the `persist` callback as KV set/delete records (the embedded engine
appends them to its KV file; they ride its group commit) and applied in memory only once that returned, so a
failed write changes nothing. Records, one per thing that changed:

    GROUP_DEF     name           -> definition JSON (a new group's cursor is its `start_seq`)
    GROUP_CURSOR  name           -> cursor (<q), written when a claim moves it
    GROUP_CLAIM   "<seq> <name>" -> deliveries, token, visible_at_ms (<Iqq) + owner (utf-8), then NUL + lane
                                    (utf-8) for a claim in a lane
    GROUP_CLAIM   ""             -> the token counter (<q), written by compaction only

Tokens come from one counter for every group. After a restart it resumes above every token the file still
names (replayed claims and the counter compaction kept), so no stale handle can match a later claim.

Finding visible claims: each group keeps a heap of (visible_at_ms, seq, token) and a heap of (seq, token) of
claims found due; `reclaim` moves the due ones over, then pops lowest seqs first: O(log n) per claim. Entries
are dropped lazily (an entry whose token is no longer the claim's is stale); heaps are rebuilt when stale
entries outnumber live ones. Claims are also indexed by owner for `release_owner`, and by lane (each lane's
pending seqs in order: its first is the one handed out, the others are held back until it is settled).

`GroupCalls` is the engine's mixin: the async `Store` group calls over its `GroupTable` in `self._groups`.
"""

from __future__ import annotations

import copy
import heapq
import json
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, fields
from struct import Struct

from tidewire.store.base import Claim, GroupRecord, PendingClaim
from tidewire.store.embedded.kv import GROUP_CLAIM, GROUP_CURSOR, GROUP_DEF

GROUP_NAMESPACES = (GROUP_DEF, GROUP_CURSOR, GROUP_CLAIM)

MAX_GROUP_NAME = 1024  # bytes (utf-8) of a group name, in every engine
REBUILD_SLACK = 1024  # stale heap entries tolerated beyond the live ones before a rebuild
HELD = 1 << 52  # the visible_at_ms of a claim held back in its lane: never due (and exact as a Lua number)

_CLAIM = Struct("<Iqq")  # deliveries, token, visible_at_ms; the owner follows
_CURSOR = Struct("<q")
_GROUP_FIELDS = frozenset(f.name for f in fields(GroupRecord))

KVSets = list[tuple[int, str, bytes]]
KVDeletes = list[tuple[int, str]]
Persist = Callable[[KVSets, KVDeletes], None]


def check_group_name(name: str) -> None:
    if not 0 < len(name.encode()) <= MAX_GROUP_NAME:
        raise ValueError(f"a group name must be 1 to {MAX_GROUP_NAME} bytes")


def encode_group(record: GroupRecord) -> bytes:
    return json.dumps(asdict(record), separators=(",", ":")).encode()


def decode_group(value: bytes | str) -> GroupRecord:
    d = json.loads(value)
    return GroupRecord(**{k: v for k, v in d.items() if k in _GROUP_FIELDS})


def copy_group(record: GroupRecord) -> GroupRecord:
    return copy.deepcopy(record)


class _Pending:
    __slots__ = ("deliveries", "lane", "owner", "token", "visible_at")

    def __init__(self, deliveries: int, token: int, visible_at: int, owner: str, lane: str = "") -> None:
        self.deliveries, self.token, self.visible_at, self.owner = deliveries, token, visible_at, owner
        self.lane = lane

    def encode(self) -> bytes:
        tail = self.owner + "\x00" + self.lane if self.lane else self.owner
        return _CLAIM.pack(self.deliveries, self.token, self.visible_at) + tail.encode()


def _decode_pending(value: bytes) -> _Pending:
    d, t, v = _CLAIM.unpack_from(value, 0)
    owner, _, lane = value[_CLAIM.size :].decode().partition("\x00")
    return _Pending(d, t, v, owner, lane)


def _claim_key(name: str, seq: int) -> str:
    return f"{seq} {name}"


class _Group:
    __slots__ = ("by_owner", "cursor", "hidden", "lanes", "pending", "ready", "record")

    def __init__(self, record: GroupRecord, cursor: int) -> None:
        self.record = record
        self.cursor = cursor
        self.pending: dict[int, _Pending] = {}
        self.by_owner: dict[str, set[int]] = {}
        self.hidden: list[tuple[int, int, int]] = []  # heap: (visible_at, seq, token)
        self.ready: list[tuple[int, int]] = []  # heap: (seq, token), found due by an earlier reclaim
        self.lanes: dict[str, deque[int]] = {}  # lane -> its pending seqs, ascending

    def build_lanes(self) -> None:
        self.lanes = {}
        for seq in sorted(self.pending):
            lane = self.pending[seq].lane
            if lane:
                self.lanes.setdefault(lane, deque()).append(seq)

    def index(self, seq: int, p: _Pending) -> None:
        """Index a claim just set in `pending` (its older heap entries go stale by their token)."""
        heapq.heappush(self.hidden, (p.visible_at, seq, p.token))
        self.by_owner.setdefault(p.owner, set()).add(seq)
        if len(self.hidden) + len(self.ready) > 2 * len(self.pending) + REBUILD_SLACK:
            self.rebuild()

    def unown(self, seq: int, owner: str) -> None:
        held = self.by_owner.get(owner)
        if held is not None:
            held.discard(seq)
            if not held:
                del self.by_owner[owner]

    def rebuild(self) -> None:
        self.hidden = [(p.visible_at, s, p.token) for s, p in self.pending.items()]
        heapq.heapify(self.hidden)
        self.ready = []

    def live(self, seq: int, token: int) -> _Pending | None:
        p = self.pending.get(seq)
        return p if p is not None and p.token == token else None


class GroupTable:
    """Every consumer group of one engine. Methods mirror `store.base.Store`'s group calls, synchronously."""

    def __init__(self, persist: Persist, applied: Callable[[], None]) -> None:
        self._persist = persist
        self._applied = applied  # after each change is in memory too (the engine may compact its file then)
        self._groups: dict[str, _Group] = {}
        self._token = 0  # last token handed out, over every group

    def _token_record(self, n: int) -> tuple[int, str, bytes]:
        """The token counter after reserving n more, persisted with the claims that take them: an engine that
        deletes records (RocksDB) must not forget a token whose claim was settled, or a later one repeats it."""
        return GROUP_CLAIM, "", _CURSOR.pack(self._token + n)

    def _next_tokens(self, n: int) -> int:
        """Reserve n tokens; returns the first."""
        first = self._token + 1
        self._token += n
        return first

    # --- replay and compaction ------------------------------------------------------------------------------
    def replay(self, ns: int, key: str, value: bytes | None) -> bool:
        """Apply one KV record read at open. False if it belongs to no group (a dead record to forget)."""
        if ns == GROUP_DEF:
            if value is None:
                self._groups.pop(key, None)
                return True
            rec = decode_group(value)
            g = self._groups.get(key)
            if g is None:
                self._groups[key] = _Group(rec, rec.start_seq)
            else:
                g.record = rec
            return True
        if ns == GROUP_CURSOR:
            g = self._groups.get(key)
            if g is None or value is None:
                return g is not None
            (g.cursor,) = _CURSOR.unpack(value)
            return True
        if not key:
            if value is not None:
                self._token = max(self._token, _CURSOR.unpack(value)[0])
            return True
        seq_text, _, name = key.partition(" ")
        g = self._groups.get(name)
        if g is None:
            return False
        seq = int(seq_text)
        if value is None:
            p = g.pending.pop(seq, None)
            if p is not None:
                g.unown(seq, p.owner)
            return True
        p = _decode_pending(value)
        old = g.pending.get(seq)
        if old is not None:
            g.unown(seq, old.owner)
        g.pending[seq] = p
        g.by_owner.setdefault(p.owner, set()).add(seq)
        self._token = max(self._token, p.token)
        return True

    def loaded(self) -> None:
        """After replay: build the visibility heaps once."""
        for g in self._groups.values():
            g.rebuild()
            g.build_lanes()

    def live_records(self) -> Iterator[tuple[int, str, bytes]]:
        for name, g in self._groups.items():
            yield GROUP_DEF, name, encode_group(g.record)
            yield GROUP_CURSOR, name, _CURSOR.pack(g.cursor)
            for seq, p in g.pending.items():
                yield GROUP_CLAIM, _claim_key(name, seq), p.encode()
        yield GROUP_CLAIM, "", _CURSOR.pack(self._token)

    def max_cursor(self) -> int:
        return max((g.cursor for g in self._groups.values()), default=0)

    # --- definitions ----------------------------------------------------------------------------------------
    def put_group(self, record: GroupRecord) -> None:
        check_group_name(record.name)
        value = encode_group(record)
        self._persist([(GROUP_DEF, record.name, value)], [])
        rec = decode_group(value)  # the stored copy, as it would read back
        g = self._groups.get(record.name)
        if g is None:
            self._groups[record.name] = _Group(rec, rec.start_seq)
        else:
            g.record = rec
        self._applied()

    def get_group(self, name: str) -> GroupRecord | None:
        g = self._groups.get(name)
        return None if g is None else copy_group(g.record)

    def list_groups(self) -> list[GroupRecord]:
        return [copy_group(g.record) for g in self._groups.values()]

    def delete_group(self, name: str) -> None:
        g = self._groups.get(name)
        if g is None:
            return
        deletes: KVDeletes = [(GROUP_DEF, name), (GROUP_CURSOR, name)]
        deletes += [(GROUP_CLAIM, _claim_key(name, s)) for s in g.pending]
        self._persist([], deletes)
        del self._groups[name]
        self._applied()

    def group_position(self, name: str) -> tuple[int, int]:
        g = self._groups.get(name)
        return (-1, 0) if g is None else (g.cursor, len(g.pending))

    def ready_claims(self, name: str, now_ms: int) -> list[int]:
        g = self._groups.get(name)
        return [] if g is None else sorted(s for s, p in g.pending.items() if p.visible_at <= now_ms)

    def pending_claims(self, name: str, after_seq: int, limit: int) -> list[PendingClaim]:
        g = self._groups.get(name)
        if g is None or limit <= 0:
            return []
        seqs = heapq.nsmallest(limit, (s for s in g.pending if s > after_seq))
        return [PendingClaim(s, (p := g.pending[s]).deliveries, p.token, p.visible_at, p.owner) for s in seqs]

    # --- claims ---------------------------------------------------------------------------------------------
    def claim(self, name: str, after: int, upto: int, seqs: Sequence[int], owner: str,
              visible_at_ms: int, lanes: Mapping[int, str] | None = None) -> tuple[list[Claim], int]:
        g = self._groups.get(name)
        if g is None:
            return [], -1
        cursor = g.cursor
        if cursor < after:
            return [], cursor
        new = sorted({s for s in seqs if cursor < s <= upto})  # above upto: a later claim could take it again
        first = self._token + 1
        made: list[tuple[int, _Pending]] = []
        busy: set[str] = set()  # lanes this call starts (a lane in `g.lanes` has a pending claim)
        for i, s in enumerate(new):
            lane = lanes.get(s, "") if lanes else ""
            if lane and (lane in busy or lane in g.lanes):
                made.append((s, _Pending(0, first + i, HELD, "", lane)))  # 0: not handed out yet
            else:
                made.append((s, _Pending(1, first + i, visible_at_ms, owner, lane)))
                if lane:
                    busy.add(lane)
        sets: KVSets = [(GROUP_CLAIM, _claim_key(name, s), p.encode()) for s, p in made]
        if made:
            sets.append(self._token_record(len(made)))
        moved = upto > cursor
        if moved:
            sets.append((GROUP_CURSOR, name, _CURSOR.pack(upto)))
        if sets:
            self._persist(sets, [])
        self._next_tokens(len(made))
        for s, p in made:
            g.pending[s] = p
            g.index(s, p)
            if p.lane:
                g.lanes.setdefault(p.lane, deque()).append(s)
        if moved:
            g.cursor = upto
        if sets:
            self._applied()
        return [Claim(s, 1, p.token) for s, p in made if p.visible_at != HELD], g.cursor

    def reclaim(self, name: str, owner: str, now_ms: int, visible_at_ms: int, limit: int) -> list[Claim]:
        g = self._groups.get(name)
        if g is None or limit <= 0:
            return []
        hidden, ready = g.hidden, g.ready
        while hidden and hidden[0][0] <= now_ms:
            _, s, t = heapq.heappop(hidden)
            if g.live(s, t) is not None:
                heapq.heappush(ready, (s, t))
        taken: list[tuple[int, _Pending]] = []
        seen: set[int] = set()  # a released claim may have two live entries
        while ready and len(taken) < limit:
            s, t = heapq.heappop(ready)
            p = g.live(s, t)
            if p is None or s in seen:
                continue
            if p.visible_at > now_ms:  # found due by a caller whose clock ran ahead of this one's
                heapq.heappush(hidden, (p.visible_at, s, t))
                continue
            taken.append((s, p))
            seen.add(s)
        first = self._token + 1
        news = [(s, _Pending(p.deliveries + 1, first + i, visible_at_ms, owner, p.lane))
                for i, (s, p) in enumerate(taken)]
        try:
            if news:
                self._persist([*((GROUP_CLAIM, _claim_key(name, s), p.encode()) for s, p in news),
                               self._token_record(len(news))], [])
        except BaseException:
            for s, p in taken:
                heapq.heappush(ready, (s, p.token))
            raise
        self._next_tokens(len(news))
        for (s, old), (_, p) in zip(taken, news, strict=True):
            g.unown(s, old.owner)
            g.pending[s] = p
            g.index(s, p)
        if news:
            self._applied()
        return [Claim(s, p.deliveries, p.token) for s, p in news]

    def settle(self, name: str, handles: Sequence[tuple[int, int]]) -> list[int]:
        g = self._groups.get(name)
        if g is None:
            return []
        done: dict[int, _Pending] = {}
        for s, t in handles:
            p = g.live(s, t)
            if p is not None:
                done[s] = p
        if not done:
            return []
        # A settled lane's next claim, held back until now, is due at once (its token kept: no handle had it).
        freed: dict[int, _Pending] = {}
        for lane in {p.lane for p in done.values() if p.lane}:
            nxt = next((s for s in g.lanes.get(lane, ()) if s not in done), None)
            back = g.pending.get(nxt) if nxt is not None else None
            if nxt is not None and back is not None and back.visible_at == HELD:
                freed[nxt] = _Pending(back.deliveries, back.token, 0, "", lane)
        self._persist([(GROUP_CLAIM, _claim_key(name, s), p.encode()) for s, p in freed.items()],
                      [(GROUP_CLAIM, _claim_key(name, s)) for s in done])
        for s, p in done.items():
            del g.pending[s]
            g.unown(s, p.owner)
            if p.lane:
                held = g.lanes[p.lane]
                if held[0] == s:
                    held.popleft()  # the usual case: a lane's first is settled
                else:
                    held.remove(s)
                if not held:
                    del g.lanes[p.lane]
        for s, p in freed.items():
            g.pending[s] = p  # owner "" before and after
            heapq.heappush(g.ready, (s, p.token))
        self._applied()
        return list(done)

    def set_visibility(self, name: str, handles: Sequence[tuple[int, int]], visible_at_ms: int) -> list[Claim]:
        g = self._groups.get(name)
        if g is None:
            return []
        moved: dict[int, _Pending] = {}
        for s, t in handles:
            p = g.live(s, t)
            if p is not None and s not in moved:
                moved[s] = p
        first = self._token + 1
        news = [(s, _Pending(p.deliveries, first + i, visible_at_ms, p.owner, p.lane))
                for i, (s, p) in enumerate(moved.items())]
        if not news:
            return []
        self._persist([*((GROUP_CLAIM, _claim_key(name, s), p.encode()) for s, p in news),
                       self._token_record(len(news))], [])
        self._next_tokens(len(news))
        for s, p in news:
            g.pending[s] = p
            g.index(s, p)
        self._applied()
        return [Claim(s, p.deliveries, p.token) for s, p in news]

    def release_owner(self, name: str, owner: str) -> int:
        g = self._groups.get(name)
        if g is None:
            return 0
        held = sorted(g.by_owner.get(owner, ()))
        if not held:
            return 0
        # Nobody holds them now (owner ""), visible at once; the token stays: the owner's handles are gone.
        news = [(s, _Pending(g.pending[s].deliveries, g.pending[s].token, 0, "", g.pending[s].lane)) for s in held]
        self._persist([(GROUP_CLAIM, _claim_key(name, s), p.encode()) for s, p in news], [])
        del g.by_owner[owner]
        for s, p in news:
            g.pending[s] = p
            heapq.heappush(g.ready, (s, p.token))  # due whatever the caller's clock
            g.by_owner.setdefault("", set()).add(s)
        self._applied()
        return len(news)


class GroupCalls:
    """The async group calls of `store.base.Store` over `self._groups`: a one-process engine's mixin."""

    _groups: GroupTable

    async def put_group(self, record: GroupRecord) -> None:
        self._groups.put_group(record)

    async def add_group(self, record: GroupRecord) -> bool:
        if self._groups.get_group(record.name) is not None:
            return False
        self._groups.put_group(record)
        return True

    async def get_group(self, name: str) -> GroupRecord | None:
        return self._groups.get_group(name)

    async def list_groups(self) -> list[GroupRecord]:
        return self._groups.list_groups()

    async def delete_group(self, name: str) -> None:
        self._groups.delete_group(name)

    async def claim(self, group: str, after: int, upto: int, seqs: Sequence[int], owner: str,
                    visible_at_ms: int, lanes: Mapping[int, str] | None = None) -> tuple[list[Claim], int]:
        return self._groups.claim(group, after, upto, seqs, owner, visible_at_ms, lanes)

    async def reclaim(self, group: str, owner: str, now_ms: int, visible_at_ms: int, limit: int) -> list[Claim]:
        return self._groups.reclaim(group, owner, now_ms, visible_at_ms, limit)

    async def settle(self, group: str, handles: Sequence[tuple[int, int]]) -> list[int]:
        return self._groups.settle(group, handles)

    async def set_visibility(self, group: str, handles: Sequence[tuple[int, int]],
                             visible_at_ms: int) -> list[Claim]:
        return self._groups.set_visibility(group, handles, visible_at_ms)

    async def release_owner(self, group: str, owner: str) -> int:
        return self._groups.release_owner(group, owner)

    async def group_position(self, group: str) -> tuple[int, int]:
        return self._groups.group_position(group)

    async def ready_claims(self, group: str, now_ms: int) -> list[int]:
        return self._groups.ready_claims(group, now_ms)

    async def pending_claims(self, group: str, after_seq: int, limit: int) -> list[PendingClaim]:
        return self._groups.pending_claims(group, after_seq, limit)
