"""The store interface every engine implements (embedded now, Redis later), and the records it keeps.

Offsets are global log sequence numbers (`seq`): every message appended gets the next seq, and a queue is an
ordered index of the seqs indexed into it. A consumer's position in any queue is "the last seq handled", so one
cursor can walk the merge of several queues, and seq gaps (after retention or a crash) are harmless.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol, runtime_checkable

NEVER_EXPIRES = 0xFFFFFFFF
# Which protocol a message came in by (`Message.protocol`; stored in the record, see store.records).
PROTOCOL_MQTT = 0
PROTOCOL_AMQP = 1
PROTOCOL_ROCKETMQ = 2
PROTOCOL_BRIDGE = 3  # MQTT from another broker's bridge connection (Mosquitto's try_private, or a Tidewire's)
PROTOCOL_NAMES = ("mqtt", "amqp", "rocketmq", "bridge")
# A client's P2P queue. '#' can't appear in a topic name or inside a filter level: no clash with other queues.
P2P_PREFIX = "p2p#"


def p2p_queue(client_id: str) -> str:
    return P2P_PREFIX + client_id


# A shared subscription, `$share/<group>/<filter>`: its group is the consumer group of that name. (Before, a
# group's offset was a session record under that client id: the engines still leave such records out of counts.)
SHARED_PREFIX = "$share/"


def counted_filter(topic_filter: str) -> bool:
    """A filter `Store.subscription_filters` counts: shared subscriptions and wildcards (not a P2P queue)."""
    if topic_filter.startswith(SHARED_PREFIX):
        return True
    return ("+" in topic_filter or "#" in topic_filter) and not topic_filter.startswith(P2P_PREFIX)


# How a stored session's exact-topic subscription is indexed among the members of a filter (`shared_members`):
# under this mark and the topic, so that `subscribed` finds an offline subscriber of a topic.
EXACT_MARK = "\x01"


def indexed_filter(topic_filter: str) -> str | None:
    """The name a session's subscription is indexed under for `subscribed`: a counted filter as it is, an exact
    topic marked (`EXACT_MARK`); None for a P2P queue."""
    if counted_filter(topic_filter):
        return topic_filter
    return None if topic_filter.startswith(P2P_PREFIX) else EXACT_MARK + topic_filter


def expiry_deadline(record: SessionRecord) -> int | None:
    """When a stored session expires (ms), or None: online, or never expiring."""
    if record.disconnected_at_ms == 0 or record.expiry_interval >= NEVER_EXPIRES:
        return None
    return record.disconnected_at_ms + record.expiry_interval * 1000


@dataclass(slots=True, eq=False)
class Message:
    """One application message, stored once and indexed into `queues`.

    `properties` is the stored property block (`store.properties`: by design the content of an MQTT 5 property
    block, which MQTT forwards unchanged), without topic alias, subscription identifiers and message expiry,
    which depend on the receiver or the clock.
    """

    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    properties: bytes = b""
    timestamp_ms: int = 0
    expires_at_ms: int = 0  # 0: never
    publisher: str = ""  # client id of the publisher ("" for internal), for no-local later
    queues: tuple[str, ...] = ()
    seq: int = -1  # assigned by Store.append
    protocol: int = PROTOCOL_MQTT  # PROTOCOL_*: the ingress it came by (internal messages count as MQTT)
    # Encoded PUBLISH packets keyed by (protocol level, qos, retain); filled lazily by the gateway so the same
    # bytes are shared across subscribers. Not persisted.
    encoded: dict[tuple[object, ...], tuple[bytes, bytes]] | None = None
    # A de-duplication key (scope, id), opaque to the store: `Store.append` records it with the message in the
    # same atomic write and stores nothing for a message whose key is already held (see `Store.append`). The
    # scope groups a sender's keys (listed and released together); not persisted in the record.
    dedupe: tuple[str, str] | None = None
    duplicate: bool = False  # set by `append`: the key was held, nothing stored, `seq` is the held message's
    # Queues the publisher's routing chose besides those of its topic (AMQP headers exchanges, exchange-to-exchange
    # bindings, alternate exchanges: `gateway.protocols.amqp.routing`); indexed into with them. Not persisted.
    routes: tuple[str, ...] = ()
    # A delayed publish's due time (ms; 0: none): the node stores it on the internal topic of waiting messages
    # instead, until then (`gateway.core.delayed`). Set by the protocol after its checks. Not persisted.
    due_ms: int = 0


@dataclass(slots=True)
class SubscriptionRecord:
    filter: str  # also the queue name it reads from
    qos: int
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0
    subscription_id: int = 0  # 0: none
    since_seq: int = 0  # messages with seq <= since_seq predate the subscription


@dataclass(slots=True)
class SessionRecord:
    """A persistent session as kept in the store while the client is away (and while it is online)."""

    client_id: str
    protocol_level: int = 4
    expiry_interval: int = NEVER_EXPIRES  # seconds after disconnect; NEVER_EXPIRES for 3.1.1 clean=0
    subscriptions: dict[str, SubscriptionRecord] = field(default_factory=dict)
    offset: int = 0  # every seq <= offset in the session's queues is handled (delivered and acked)
    sent_upto: int = 0  # highest seq ever sent: resends at or below it carry DUP
    inbound_qos2: list[int] = field(default_factory=list)  # packet ids PUBREC'd, awaiting PUBREL
    outbound_pubrel: list[int] = field(default_factory=list)  # packet ids PUBREL'd, awaiting PUBCOMP
    # QoS 2 messages sent and not PUBREC'd yet: packet id -> seq (resent under the same id after a move)
    outbound_qos2: dict[int, int] = field(default_factory=dict)
    disconnected_at_ms: int = 0  # 0 while online
    owner: str = ""  # node id that claimed the session last ("" on one node)
    epoch: int = 0  # fencing token: bumped by every claim; writes carrying an older epoch are ignored


@dataclass(slots=True)
class WillRecord:
    client_id: str
    message: Message
    delay_interval: int = 0  # seconds (MQTT 5 will delay)
    owner: str = ""  # node id of the client's connection (a survivor publishes the wills of a dead node)


BAN_KINDS = ("clientid", "username", "peerhost")


@dataclass(slots=True, frozen=True)
class Ban:
    """A cluster-wide ban (kept in the store, so every node enforces it): connections whose client id, user name or
    peer address (`who`: an address or a CIDR network for "peerhost") match are refused until `until`."""

    kind: str  # one of BAN_KINDS
    who: str
    reason: str = ""
    at: float = 0.0  # epoch seconds when it was made
    until: float | None = None  # epoch seconds when it lapses; None: never

    def expired(self, now: float) -> bool:
        return self.until is not None and self.until <= now


def encode_ban(ban: Ban) -> bytes:
    """A ban as stored by every engine (JSON: the key an engine files it under is its own business)."""
    return json.dumps({"kind": ban.kind, "who": ban.who, "reason": ban.reason, "at": ban.at, "until": ban.until},
                      separators=(",", ":")).encode()


def decode_ban(value: bytes) -> Ban | None:
    """A stored ban; None for bytes that are not one (a newer build's, or damage: skipped, never raised)."""
    try:
        d = json.loads(value)
        until = d.get("until")
        ban = Ban(str(d["kind"]), str(d["who"]), str(d.get("reason", "")), float(d.get("at", 0.0)),
                  None if until is None else float(until))
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    return ban if ban.kind in BAN_KINDS else None


class Slice(NamedTuple):
    """A read's answer: `messages` ascending by seq, and `upto`: the queue is complete in (after_seq, upto].

    Every message of the queue with after_seq < seq <= upto is in `messages`; when the list was cut at the
    limit, `upto` is the last message's seq. `upto` also covers every append that completed (on any node)
    before the read began, and no append that starts after the read gets a seq <= upto: a reader merging
    several queues never moves its cursor past a message that was not yet visible."""

    messages: list[Message]
    upto: int


class LogSlice(NamedTuple):
    """`read_log`'s answer: the partition's records with after_seq < seq <= upto, ascending by seq.

    Cut at the limit, `upto` is the last record's seq; otherwise no append that completes later gets a seq <= upto
    in this partition, so a tailing reader may move its position to `upto`. `trimmed`: the highest seq retention
    has removed from this partition (0: none yet); a reader whose position is below it lost those records."""

    messages: list[Message]
    upto: int
    trimmed: int


class LogSource(Protocol):
    """The log as a reader sees it: partitions read in seq order from a position, and holds that keep retention
    from removing what a reader has not read yet. Every `Store` is one; a read-only tail of an embedded data
    directory (another process) is another."""

    def log_partitions(self) -> int:
        """How many partitions the log has (1 for the embedded engine, P for Redis). Seqs are unique across
        partitions and ascending within each; each partition is read on its own."""

    async def read_log(self, partition: int, after_seq: int, limit: int) -> LogSlice:
        """Up to `limit` records of `partition` with seq > after_seq (every message appended there, whatever
        its queues), and how far that answer is complete (see `LogSlice`)."""

    async def hold_log(self, partition: int, holder: str, seq: int) -> None:
        """Keep retention from removing records of `partition` with seq > `seq` for `holder` (a reader's
        checkpoint), unless the engine was configured to ignore holds; `seq` < 0 drops the hold."""

    async def log_holds(self, partition: int) -> dict[str, int]:
        """Every hold on `partition`: holder -> seq."""

    async def lease(self, key: str, owner: str, ttl_ms: int) -> int:
        """As `Store.lease`: one holder at a time (one bridge per partition)."""

    async def release(self, key: str, owner: str) -> None: ...


def append_depth(store: object) -> int:
    """How many appends of one caller the store keeps in call order while they are in flight: an engine whose
    appends wait on a network may say more than 1 in an `append_depth` attribute (the Redis engine: 2, kept in
    order by its fence); without one, appends go one at a time. Such an engine takes an append's place in the
    order when it is called, before its first wait, and an append placed after a failed one fails too."""
    depth = getattr(store, "append_depth", 1)
    return depth if isinstance(depth, int) and depth > 1 else 1


@runtime_checkable  # an engine named by an import string is checked once, at start
class Store(Protocol):
    """Async, batched interface of a store engine. Every call may be a network round trip in another engine."""

    async def open(self) -> None:
        """Open or recover: rebuild indexes from the log, cut a torn tail."""

    async def close(self) -> None:
        """Flush and sync everything, release files."""

    # --- messages -------------------------------------------------------------------------------------
    async def append(self, messages: Sequence[Message], wildcard_version: int = -1) -> int | None:
        """Append a batch in order, assign each `seq` (ascending), index into each `message.queues`.

        Returns when the batch is readable by `read` (written, not necessarily synced). `wildcard_version` is
        the version of the wildcard set the queues were computed with (-1: unchecked); if the store's is
        newer, raise `StaleWildcards` and store nothing. Returns `after`: every message the store holds with
        a seq in (after, the batch's last seq] is one of the batch's (None: the store cannot tell), which lets
        a cache complete up to `after` take the batch without reading it back.

        A message with a `dedupe` key is stored only if no message holds that key yet, and the key then holds
        it, in the same atomic write as the message (a crash leaves both or neither). If the key is held (by
        an earlier batch or an earlier message of this one), nothing is stored for it: its `seq` becomes the
        holder's and `duplicate` is set. A key is held until `release_dedupe`."""

    async def sync(self) -> None:
        """Return once everything appended (and every offset/session write) before the call is durable
        according to the fsync policy. Concurrent callers share one fsync (group commit)."""

    async def read(self, queue: str, after_seq: int, limit: int, seal: int = 0) -> Slice:
        """Up to `limit` messages of `queue` with seq > after_seq, and up to where that answer is complete.

        `seal`: unless the answer is cut at the limit, make `upto >= seal` (a partitioned engine raises the
        sequences of its partitions so that no later append gets a seq <= seal)."""

    async def queue_tail(self, queue: str, after_seq: int, limit: int) -> tuple[int, list[int]]:
        """How many messages of `queue` have a seq > after_seq, and the seqs of the newest `limit` of them,
        ascending: counted and read from the end of the queue's index, never by walking the messages (a
        session's backlog cap, `gateway.sessions.backlog`)."""

    def last_seq(self) -> int:
        """A sealed high-water mark: no append that starts after this returns gets a seq <= it. Cheap, no I/O
        (a local value, possibly behind the store's): a new subscription or session starts here."""

    # --- the cluster-wide wildcard set (queues are indexed for every filter in it) --------------------------
    async def add_wildcards(self, filters: Sequence[str], holder: str) -> int:
        """`holder` (a node id) holds each filter (its first local subscriber of it). Idempotent per holder: a
        retried or repeated add counts once. Returns the new wildcard set version; every append that starts after
        this returns indexes into these filters."""

    async def remove_wildcards(self, filters: Sequence[str], holder: str) -> int:
        """`holder` no longer holds the filters (a no-op for those it did not hold); a filter no holder holds
        leaves the set. Returns the new version."""

    async def release_wildcards(self, holder: str) -> int:
        """Remove every filter `holder` holds (a node declared dead: its holds would index its filters forever).
        Returns the new version."""

    async def wildcards(self) -> tuple[int, frozenset[str]]:
        """The wildcard set and its version."""

    # --- sessions and offsets (fenced: a write carrying an epoch below the stored one is ignored) ---------
    async def get_session(self, client_id: str) -> SessionRecord | None: ...

    def session_absent(self, client_id: str) -> bool:
        """True only if the store knows at once, with nothing to wait for, that it holds no session of the client
        (a clean connect then needs no store call); False if it holds one or cannot tell without waiting."""
        ...

    async def claim_session(self, client_id: str, owner: str) -> tuple[SessionRecord | None, int]:
        """Take the client's session for node `owner`: bump its epoch, record the owner, and return the stored
        record (None if none) and the new epoch. An engine shared by several nodes keeps the epoch even
        without a record, so a node that lost the client can no longer write its session back, nor its offsets."""

    async def put_session(self, record: SessionRecord) -> bool:
        """Store the record unless the stored epoch is higher than `record.epoch`; False if fenced off."""

    async def delete_session(self, client_id: str, epoch: int = -1) -> None:
        """Remove the session and its offsets (only if its epoch is not above `epoch`; -1: unconditionally)."""

    async def list_sessions(self) -> list[SessionRecord]:
        """Every stored session (maintenance and tests: a node starts from the indexes below)."""

    # --- what a starting node needs, without reading every session -------------------------------------------
    async def online_sessions(self) -> list[str]:
        """Client ids of stored sessions marked online (`disconnected_at_ms == 0`), shared groups excluded: at a
        start, those whose node died without parking them."""

    async def due_sessions(self, now_ms: int, limit: int) -> list[str]:
        """Up to `limit` client ids of offline sessions whose expiry deadline (`expiry_deadline`) is <= now_ms,
        soonest first."""

    async def session_count(self) -> int:
        """How many sessions the store holds, online and offline, from a counter kept as they change (no scan)."""

    async def subscription_filters(self) -> dict[str, int]:
        """How many stored sessions hold each wildcard or shared (`$share/...`) filter (`counted_filter`)."""

    async def shared_members(self, group_key: str) -> list[str]:
        """Client ids of the stored sessions subscribed to `$share/<group>/<filter>`."""

    async def subscribed(self, filters: Sequence[str]) -> bool:
        """Does a stored session (online or offline; shared groups aside) hold one of `filters` (exact topics or
        counted filters) as a subscription? From the indexes its puts keep (a session stored by an earlier build
        is seen once it is stored again). An AMQP mandatory publish asks it for a topic nothing else reads."""

    async def set_offsets(self, offsets: dict[str, tuple[int, int, int]]) -> None:
        """Batched update of `(offset, sent_upto, epoch)` per client id (a no-op for unknown sessions and for
        an epoch below the stored one)."""

    # --- de-duplication keys (`Message.dedupe`, recorded by `append`) --------------------------------------
    async def dedupe_ids(self, scope: str) -> list[str]:
        """The ids of every key of `scope` still held (a sender that moved learns what it had in flight)."""

    async def release_dedupe(self, scope: str, ids: Sequence[str] | None = None) -> None:
        """Stop holding these keys of `scope` (None: every key of it); a message with one of them is new again."""

    # --- leases: one holder at a time (the node that serves a shared group) ------------------------------
    async def lease(self, key: str, owner: str, ttl_ms: int) -> int:
        """Take or renew lease `key` for `owner` for `ttl_ms`. Returns its epoch (> 0; a new epoch whenever the
        lease is taken anew, so a former holder's fenced writes are ignored), or 0 if someone else holds it."""

    async def release(self, key: str, owner: str) -> None:
        """Give the lease up now if `owner` holds it."""

    # --- retained -----------------------------------------------------------------------------------------
    async def set_retained(self, topic: str, message: Message | None) -> None:
        """Set or replace the retained message of `topic`; None deletes it."""

    async def retained_usage(self) -> tuple[int, int]:
        """(retained messages, bytes the store holds for them), from counters kept as they change (no scan)."""

    async def match_retained(self, topic_filter: str, after: str | None = None, limit: int = 0,
                             max_bytes: int = 0) -> list[Message]:
        """Retained messages whose topic matches the filter, found through an index (no full scan), in topic
        order (bytewise): those after topic `after` (None: from the first), at most `limit` (0: all), ending once
        they reach about `max_bytes` of payload (0: no limit). A page ends at its last topic: the next starts
        after it."""

    # --- wills ----------------------------------------------------------------------------------------------
    async def put_will(self, will: WillRecord) -> None: ...

    async def delete_will(self, client_id: str) -> None: ...

    async def list_wills(self) -> list[WillRecord]:
        """Wills still stored (at startup: their connections died with the previous process)."""

    # --- bans (cluster-wide: every node re-reads them; `gateway.ops.bans`) ---------------------------------------
    async def get_bans(self) -> list[Ban]:
        """Every stored ban, lapsed ones included (the reader deletes those)."""

    async def put_ban(self, ban: Ban) -> None:
        """Create or replace the ban of (`ban.kind`, `ban.who`)."""

    async def delete_ban(self, kind: str, who: str, expired_before: float | None = None) -> bool:
        """Remove the ban of (kind, who); False if there was none. With `expired_before`, only if the stored ban
        lapsed at or before that time, atomically: a lapsed ban's reader never deletes one renewed meanwhile."""

    # --- documents: small versioned values with compare-and-set (the dynamic-security configuration) ----------
    async def get_document(self, name: str) -> tuple[int, bytes]:
        """The document `name` and its version (> 0); (0, b"") when there is none."""

    async def put_document(self, name: str, value: bytes, expected: int) -> int:
        """Replace document `name` with `value` if its version is still `expected` (0: there is none yet), atomically
        across every node: returns the new version (`expected` + 1), or 0 when another writer changed it first
        (nothing written). A retried put whose first attempt landed (the stored version is `expected` + 1 and its
        value is `value`) returns that version again, so a lost reply is no conflict."""

    # --- consumer groups: competing consumers of light queues (AMQP queues, RocketMQ consumer groups) ---------
    async def put_group(self, record: GroupRecord) -> None:
        """Create or replace the group's definition. A new group's cursor starts at `record.start_seq`; an
        existing group keeps its cursor and claims."""

    async def add_group(self, record: GroupRecord) -> bool:
        """Create the group as `put_group` does, atomically unless one of that name exists (then nothing changes):
        True if it was created. Of nodes declaring one queue at once, exactly one creates it."""

    async def get_group(self, name: str) -> GroupRecord | None: ...

    async def list_groups(self) -> list[GroupRecord]: ...

    async def delete_group(self, name: str) -> None:
        """Remove the definition, the cursor, every claim and every member."""

    async def claim(self, group: str, after: int, upto: int, seqs: Sequence[int], owner: str,
                    visible_at_ms: int, lanes: Mapping[int, str] | None = None) -> tuple[list[Claim], int]:
        """Claim new messages. The caller read the group's queues completely over (after, upto] and passes the
        seqs found there (ascending). Atomically: if the stored cursor is below `after`, nothing happens
        (the caller missed nothing but must read from the returned cursor); otherwise every seq in `seqs` above
        the stored cursor is claimed for `owner` (deliveries 1, hidden from others until `visible_at_ms`) and
        the cursor becomes max(cursor, upto). Returns the claims made and the cursor after the call: another
        node's claims already moved it past what this caller read, those seqs are simply not returned.

        `lanes` maps some of the seqs to a lane (a RocketMQ message group): a lane's claims are handed out one
        at a time in seq order. A seq whose lane already has a pending claim is claimed held back (owner "",
        deliveries 0, never due, not returned); `settle` of a lane's first claim makes the next one due at once,
        for `reclaim` (which counts its first delivery). Lanes are part of the claims: they survive
        restarts and go with `delete_group`."""

    async def reclaim(self, group: str, owner: str, now_ms: int, visible_at_ms: int, limit: int) -> list[Claim]:
        """Claim up to `limit` pending messages visible again at `now_ms` (lapsed or released), lowest seq
        first, for `owner` until `visible_at_ms`; each one's `deliveries` goes up by one and gets a new token."""

    async def settle(self, group: str, handles: Sequence[tuple[int, int]]) -> list[int]:
        """Acknowledge claims given as (seq, token): each is removed if its token is still current (a stale
        handle, whose message was claimed again since, is ignored). Returns the seqs removed."""

    async def set_visibility(self, group: str, handles: Sequence[tuple[int, int]],
                             visible_at_ms: int) -> list[Claim]:
        """Move current claims' visibility (0: visible now, a requeue). Each gets a new token, so the old
        handle is dead (RocketMQ's ChangeInvisibleDuration). Stale handles are skipped."""

    async def release_owner(self, group: str, owner: str) -> int:
        """Every claim held by `owner` becomes visible now (its node restarted or died). Returns how many."""

    async def group_position(self, group: str) -> tuple[int, int]:
        """(cursor, number of pending claims); (-1, 0) for an unknown group."""

    async def ready_claims(self, group: str, now_ms: int) -> list[int]:
        """The seqs of the group's pending claims visible at `now_ms` (requeued, lapsed or released: ready to be
        reclaimed), ascending; the rest of its claims are held by consumers. Empty for an unknown group."""

    async def pending_claims(self, group: str, after_seq: int, limit: int) -> list[PendingClaim]:
        """The group's pending claims above `after_seq`, lowest seq first, at most `limit` (a claim held back in
        its lane has owner "" and a `visible_at_ms` never reached). For operators: what a group holds and until
        when (delayed publishes, `gateway.core.delayed`); a listed handle settles the claim while it is current.
        Empty for an unknown group."""

    async def fetch(self, seqs: Sequence[int]) -> list[Message]:
        """Messages by seq, ascending; seqs no longer stored (retention) are left out."""

    # --- who consumes a group now, cluster-wide (`store.members`) ---------------------------------------------
    async def join_group(self, group: str, member: str, node: str, process: str, exclusive: bool) -> int:
        """Register consumer `member` of `group`, held by process `process` (its membership token) of node `node`.
        Atomically refused (-1) while an exclusive member holds the group, or if `exclusive` and the group has
        members; else (idempotent per member) returns how many members the group has now."""

    async def leave_group(self, group: str, member: str) -> int:
        """Unregister `member` (a no-op if it is none); returns how many members are left."""

    async def group_members(self, group: str) -> int:
        """How many members `group` has now."""

    async def release_members(self, node: str, process: str = "") -> list[str]:
        """Unregister the members held by `process` of node `node` (empty: by any process of it, as at the node's
        start, when every earlier one is gone). Returns the groups this left without members."""

    # --- the log for readers (see LogSource) -------------------------------------------------------------
    def log_partitions(self) -> int: ...

    async def read_log(self, partition: int, after_seq: int, limit: int) -> LogSlice: ...

    async def hold_log(self, partition: int, holder: str, seq: int) -> None: ...

    async def log_holds(self, partition: int) -> dict[str, int]: ...


@dataclass(slots=True)
class GroupRecord:
    """A consumer group: one position over the merge of its queues (topic filters, as for a session), shared
    by competing consumers on any node. An AMQP queue (`amqp/<vhost>/<queue>`: its bindings are its filters) or
    a RocketMQ consumer group's subscription (`rmq/<group>/<topic>`)."""

    name: str
    filters: list[str] = field(default_factory=list)
    durable: bool = True
    start_seq: int = 0  # where a new group's cursor starts (the log's last seq when declared)
    created_ms: int = 0
    attrs: dict[str, Any] = field(default_factory=dict)  # the protocol's own settings, JSON values only
    # Filters taken off the group (an AMQP Queue.Unbind) -> the last seq of theirs it still reads: what was
    # routed to it before stays in it until consumed (`gateway.core.consumers`).
    drains: dict[str, int] = field(default_factory=dict)


class PendingClaim(NamedTuple):
    """A claim as `Store.pending_claims` lists it: its handle (seq, token), who holds it and until when."""

    seq: int
    deliveries: int
    token: int
    visible_at_ms: int
    owner: str


class Claim(NamedTuple):
    """A message handed to one consumer of a group. A handle is (seq, token): it acknowledges or moves this
    claim only while the token is current."""

    seq: int
    deliveries: int  # 1 the first time; above 1 means redelivered
    token: int
