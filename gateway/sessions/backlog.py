"""The cap on what an offline persistent session keeps (`max_queued_messages`): on its return only the newest
messages of its backlog are delivered, the older ones are dropped.

A message is stored once, in the shared log; a session is a cursor (`SessionRecord.offset`) over its queues, so
its backlog is the span of those queues after the cursor, and the log's retention (not the session) bounds the
disk. Capping a session is therefore moving its cursor: when a stored session is resumed and more than N
messages wait after its offset, the offset moves to just below the N newest. Nothing is removed from the log (other
sessions may still want those messages), and the cap costs nothing while the session is away.

Policy: the OLDEST go first (as EMQX's mqueue; Mosquitto's max_queued_messages refuses the newest instead). The
newest telemetry is what a returning client needs, and a cursor can only skip a prefix: the log cannot drop a
message for one session, so "drop the newest" would cost a per-session exclusion list.

Cheap and exact: `Store.queue_tail` answers, per queue, how many seqs are above the cursor and the newest N+1 of
them, read from the end of the queue's index (embedded: the sealed segments' index runs, a bisection in the
oldest one; Redis: ZCOUNT and ZREVRANGEBYSCORE), never by walking the backlog. The (N+1)-th newest seq of their
union is the new offset. The dropped count is each queue's count minus its seqs above that offset; a message
that sits in two of the session's queues (overlapping filters) counts once per queue. A session that had a QoS 2
message sent and not PUBREC'd when it left is not cut below that message (the receiver may hold its packet id):
its cap waits for a later return.
"""

from __future__ import annotations

from collections.abc import Sequence

from tidewire.store.base import SHARED_PREFIX, SessionRecord, Store


def queue_bounds(record: SessionRecord) -> dict[str, int]:
    """The session's own queues (shared groups have their own cursor) and where each one's backlog starts."""
    return {sub.filter: max(record.offset, sub.since_seq) for sub in record.subscriptions.values()
            if not sub.filter.startswith(SHARED_PREFIX)}


def cut(tails: Sequence[tuple[int, list[int]]], limit: int) -> tuple[int, int] | None:
    """From each queue's (count above its start, its newest `limit` + 1 seqs): (new offset, messages dropped),
    or None when at most `limit` distinct messages wait."""
    newest = sorted({s for _, seqs in tails for s in seqs})
    if len(newest) <= limit:
        return None
    offset = newest[-limit - 1]  # the newest message dropped: the `limit` kept are above it
    dropped = sum(count - sum(1 for s in seqs if s > offset) for count, seqs in tails)
    return offset, dropped


async def cap_backlog(store: Store, record: SessionRecord, limit: int) -> int:
    """Move a resumed session's offset so that at most `limit` messages wait (0: no cap); how many were dropped."""
    bounds = queue_bounds(record)
    if limit <= 0 or not bounds:
        return 0
    tails = [await store.queue_tail(queue, after, limit + 1) for queue, after in bounds.items()]
    found = cut(tails, limit)
    if found is None:
        return 0
    offset, dropped = found
    if any(seq <= offset for seq in record.outbound_qos2.values()):
        return 0
    record.offset = offset
    return dropped
