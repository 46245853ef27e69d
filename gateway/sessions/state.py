"""What a session holds between deliveries, and how an idle one holds less: its record, subscriptions, P2P
subscription, cursor and in-flight table.

Most clients of a fleet connect clean and stay idle: they are never sent a P2P message, never subscribe, never
have anything in flight. Such a session starts with no record, no P2P subscription and a shared empty in-flight
table, and makes each when it first needs it (a subscription, a P2P message, a save, a takeover, a delivery),
with the values it would have had from its start. `Session` (gateway/sessions/session.py) delivers on top.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from tidewire.gateway.sessions.parts import Inflight, SessionOwner
from tidewire.store.base import P2P_PREFIX, SHARED_PREFIX, SessionRecord, SubscriptionRecord, p2p_queue

K = TypeVar("K")
V = TypeVar("V")


class ReadOnlyEmpty(dict[K, V]):
    """An empty table that idle sessions share in place of one each: assigning into it raises, so a session that
    forgot to make its own fails loudly instead of sharing state."""

    def __setitem__(self, key: K, value: V) -> None:
        raise TypeError("a shared empty table is read only")


_NOTHING_IN_FLIGHT: dict[int, Inflight] = ReadOnlyEmpty()
_NO_SUBSCRIPTIONS: dict[str, SubscriptionRecord] = ReadOnlyEmpty()


class SessionState:
    __slots__ = ("_record", "client_id", "cursor", "filtered", "inflight", "level", "owner", "p2p_pending",
                 "p2p_sub", "plain", "read_check", "resend_pids", "stored", "stream_subs")

    def __init__(self, owner: SessionOwner, record: SessionRecord | None, stored: bool, client_id: str, level: int,
                 start: int) -> None:
        """`record` None: a session started clean, `client_id` at `level` from seq `start`, which makes its record
        when it first needs one."""
        self.owner = owner
        self._record = record
        if record is not None:
            client_id, level, start = record.client_id, record.protocol_level, record.offset
        self.client_id = client_id
        self.level = level
        self.cursor = start
        self.inflight = _NOTHING_IN_FLIGHT
        # Filters the ACL grants only in part: each delivery through them is checked with `read_check`.
        self.filtered: set[str] | None = None
        self.read_check: Callable[[str], bool] | None = None
        self.stream_subs: tuple[SubscriptionRecord, ...] = ()  # a tuple: most sessions have none, and () is free
        # May the store hold a record of this session? False only for one started clean and never saved, which
        # has nothing to delete when it ends.
        self.stored = stored
        # The P2P queue has one reader and is not cached: it is read from the store when notify says so.
        self.p2p_sub: SubscriptionRecord | None = None
        self.p2p_pending = False
        self.plain = True  # no subscription needs per-message options: the fast path applies
        # QoS 2 messages sent before a move and not PUBREC'd: seq -> the packet id they are sent again under (the
        # receiver recognises the resend by it); the ids are kept from new messages until then.
        self.resend_pids: dict[int, int] | None = None
        if record is not None:
            for pid in record.outbound_pubrel:
                entry = self._tracked()[pid] = Inflight(None, 2, False, 0.0)
                entry.released = True
            if record.outbound_qos2:
                self.resend_pids = {seq: pid for pid, seq in record.outbound_qos2.items()}
        self.subscriptions_changed()

    @property
    def record(self) -> SessionRecord:
        record = self._record
        if record is None:
            # `cursor` is still the start: only a delivery from one of its queues moves it, and the session has a
            # queue only once it has a record.
            record = self._record = SessionRecord(self.client_id, self.level, 0, offset=self.cursor,
                                                  sent_upto=self.cursor, owner=self.owner.node_id)
        return record

    @property
    def subscriptions(self) -> dict[str, SubscriptionRecord]:
        """Read only (a session without a record shares an empty table): add through `record.subscriptions`."""
        record = self._record
        return record.subscriptions if record is not None else _NO_SUBSCRIPTIONS

    def subscriptions_changed(self) -> None:
        subscriptions = self.subscriptions
        if not subscriptions:  # a new session, before it has even its P2P queue
            self.stream_subs, self.p2p_sub, self.plain = (), None, not self.filtered
            return
        self.stream_subs = tuple(s for s in subscriptions.values()
                                 if not s.filter.startswith((SHARED_PREFIX, P2P_PREFIX)))
        self.p2p_sub = subscriptions.get(p2p_queue(self.client_id))
        self.plain = not self.filtered and not any(
            s.no_local or s.retain_as_published or s.subscription_id for s in self.stream_subs)

    def own_p2p(self) -> SubscriptionRecord:
        """The subscription to its P2P queue. A session started clean has none until it is needed (a message sent
        to it, a save, a takeover): made then from where the session started, as if made at its start."""
        sub = self.p2p_sub
        if sub is None:
            queue = p2p_queue(self.client_id)
            record = self.record
            sub = record.subscriptions.get(queue)
            if sub is None:
                # `record.offset` is still the start: `snapshot`, the one place that moves it, makes this first.
                sub = record.subscriptions[queue] = SubscriptionRecord(queue, 2, since_seq=record.offset)
            self.p2p_sub = sub
        return sub

    def p2p_notified(self) -> None:
        """Something was sent to its P2P queue (`gateway.core.dispatch`): read it at the next pull."""
        self.own_p2p()
        self.p2p_pending = True

    def committed_offset(self) -> int:
        """Every seq at or below this is handled; the oldest unacknowledged stream message holds it back."""
        low = self.cursor
        for entry in self.inflight.values():
            if entry.stream and not entry.released and entry.message is not None and entry.message.seq <= low:
                low = entry.message.seq - 1
        return low

    def snapshot(self) -> SessionRecord:
        """The record to save (every save takes one, so the session counts as stored from here on)."""
        self.stored = True
        self.own_p2p()  # restored, it reads its P2P queue from where it started, not from its restore
        record = self.record
        record.offset = self.committed_offset()
        record.sent_upto = max(record.sent_upto, self.cursor)
        record.outbound_pubrel = [pid for pid, e in self.inflight.items() if e.released]
        sent = {pid: e.message.seq for pid, e in self.inflight.items()
                if e.qos == 2 and e.stream and not e.released and e.message is not None}
        if self.resend_pids:  # not sent again yet on this connection
            sent.update((pid, seq) for seq, pid in self.resend_pids.items())
        record.outbound_qos2 = sent
        return record

    def _tracked(self) -> dict[int, Inflight]:
        """The in-flight table to add to: the session's own, made on its first delivery."""
        inflight = self.inflight
        if inflight is _NOTHING_IN_FLIGHT:
            inflight = self.inflight = {}
        return inflight
