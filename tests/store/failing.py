"""A test engine: wraps a real store and makes chosen calls raise `OSError` until switched back.

Failures are injected before the inner store is touched, so a failed call changes nothing (the contract a
retrying caller relies on: a failed `append` may be retried as is, without duplicates).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from tidewire.store.base import (
    Ban,
    Claim,
    GroupRecord,
    LogSlice,
    Message,
    PendingClaim,
    SessionRecord,
    Slice,
    Store,
    WillRecord,
)

CALLS = frozenset({"append", "sync", "read", "get_session", "claim_session", "put_session", "delete_session",
                   "list_sessions", "online_sessions", "due_sessions", "session_count", "queue_tail",
                   "subscription_filters",
                   "shared_members", "set_offsets", "set_retained", "retained_usage", "match_retained", "put_will",
                   "delete_will", "list_wills", "add_wildcards", "remove_wildcards", "release_wildcards", "wildcards",
                   "lease", "release",
                   "put_group", "get_group", "list_groups", "delete_group", "claim", "reclaim", "settle",
                   "set_visibility", "release_owner", "group_position", "ready_claims", "pending_claims", "fetch",
                   "read_log", "hold_log",
                   "log_holds", "get_bans", "put_ban", "delete_ban", "join_group", "leave_group", "subscribed",
                   "add_group", "group_members", "release_members", "get_document", "put_document"})


class FailingStore:
    """`fail("append", "sync")` makes those calls raise until `heal()`; `failures` counts the raised ones."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.failing: set[str] = set()
        self.failures: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()

    def fail(self, *calls: str) -> None:
        unknown = set(calls) - CALLS
        if unknown:
            raise ValueError(f"not a store call: {sorted(unknown)}")
        self.failing.update(calls)

    def heal(self, *calls: str) -> None:
        """Stop failing `calls` (every call when none is named)."""
        if calls:
            self.failing.difference_update(calls)
        else:
            self.failing.clear()

    def _check(self, call: str) -> None:
        self.calls[call] += 1
        if call in self.failing:
            self.failures[call] += 1
            raise OSError(f"injected store failure: {call}")

    async def open(self) -> None:
        await self.inner.open()

    async def close(self) -> None:
        await self.inner.close()

    async def append(self, messages: Sequence[Message], wildcard_version: int = -1) -> int | None:
        self._check("append")
        return await self.inner.append(messages, wildcard_version)

    async def sync(self) -> None:
        self._check("sync")
        await self.inner.sync()

    async def read(self, queue: str, after_seq: int, limit: int, seal: int = 0) -> Slice:
        self._check("read")
        return await self.inner.read(queue, after_seq, limit, seal)

    def last_seq(self) -> int:
        return self.inner.last_seq()

    async def add_wildcards(self, filters: Sequence[str], holder: str) -> int:
        self._check("add_wildcards")
        return await self.inner.add_wildcards(filters, holder)

    async def remove_wildcards(self, filters: Sequence[str], holder: str) -> int:
        self._check("remove_wildcards")
        return await self.inner.remove_wildcards(filters, holder)

    async def release_wildcards(self, holder: str) -> int:
        self._check("release_wildcards")
        return await self.inner.release_wildcards(holder)

    async def wildcards(self) -> tuple[int, frozenset[str]]:
        self._check("wildcards")
        return await self.inner.wildcards()

    async def subscribed(self, filters: Sequence[str]) -> bool:
        self._check("subscribed")
        return await self.inner.subscribed(filters)

    async def add_group(self, record: GroupRecord) -> bool:
        self._check("add_group")
        return await self.inner.add_group(record)

    async def join_group(self, group: str, member: str, node: str, process: str, exclusive: bool) -> int:
        self._check("join_group")
        return await self.inner.join_group(group, member, node, process, exclusive)

    async def leave_group(self, group: str, member: str) -> int:
        self._check("leave_group")
        return await self.inner.leave_group(group, member)

    async def group_members(self, group: str) -> int:
        self._check("group_members")
        return await self.inner.group_members(group)

    async def release_members(self, node: str, process: str = "") -> list[str]:
        self._check("release_members")
        return await self.inner.release_members(node, process)

    async def lease(self, key: str, owner: str, ttl_ms: int) -> int:
        self._check("lease")
        return await self.inner.lease(key, owner, ttl_ms)

    async def release(self, key: str, owner: str) -> None:
        self._check("release")
        await self.inner.release(key, owner)

    async def get_session(self, client_id: str) -> SessionRecord | None:
        self._check("get_session")
        return await self.inner.get_session(client_id)

    def session_absent(self, client_id: str) -> bool:
        return False  # only a round trip could tell

    async def claim_session(self, client_id: str, owner: str) -> tuple[SessionRecord | None, int]:
        self._check("claim_session")
        return await self.inner.claim_session(client_id, owner)

    async def put_session(self, record: SessionRecord) -> bool:
        self._check("put_session")
        return await self.inner.put_session(record)

    async def delete_session(self, client_id: str, epoch: int = -1) -> None:
        self._check("delete_session")
        await self.inner.delete_session(client_id, epoch)

    async def list_sessions(self) -> list[SessionRecord]:
        self._check("list_sessions")
        return await self.inner.list_sessions()

    async def online_sessions(self) -> list[str]:
        self._check("online_sessions")
        return await self.inner.online_sessions()

    async def queue_tail(self, queue: str, after_seq: int, limit: int) -> tuple[int, list[int]]:
        self._check("queue_tail")
        return await self.inner.queue_tail(queue, after_seq, limit)

    async def session_count(self) -> int:
        self._check("session_count")
        return await self.inner.session_count()

    async def due_sessions(self, now_ms: int, limit: int) -> list[str]:
        self._check("due_sessions")
        return await self.inner.due_sessions(now_ms, limit)

    async def subscription_filters(self) -> dict[str, int]:
        self._check("subscription_filters")
        return await self.inner.subscription_filters()

    async def shared_members(self, group_key: str) -> list[str]:
        self._check("shared_members")
        return await self.inner.shared_members(group_key)

    async def set_offsets(self, offsets: dict[str, tuple[int, int, int]]) -> None:
        self._check("set_offsets")
        await self.inner.set_offsets(offsets)

    async def set_retained(self, topic: str, message: Message | None) -> None:
        self._check("set_retained")
        await self.inner.set_retained(topic, message)

    async def retained_usage(self) -> tuple[int, int]:
        self._check("retained_usage")
        return await self.inner.retained_usage()

    async def match_retained(self, topic_filter: str, after: str | None = None, limit: int = 0,
                             max_bytes: int = 0) -> list[Message]:
        self._check("match_retained")
        return await self.inner.match_retained(topic_filter, after, limit, max_bytes)

    async def put_will(self, will: WillRecord) -> None:
        self._check("put_will")
        await self.inner.put_will(will)

    async def delete_will(self, client_id: str) -> None:
        self._check("delete_will")
        await self.inner.delete_will(client_id)

    async def list_wills(self) -> list[WillRecord]:
        self._check("list_wills")
        return await self.inner.list_wills()

    async def get_document(self, name: str) -> tuple[int, bytes]:
        self._check("get_document")
        return await self.inner.get_document(name)

    async def put_document(self, name: str, value: bytes, expected: int) -> int:
        self._check("put_document")
        return await self.inner.put_document(name, value, expected)

    async def get_bans(self) -> list[Ban]:
        self._check("get_bans")
        return await self.inner.get_bans()

    async def put_ban(self, ban: Ban) -> None:
        self._check("put_ban")
        await self.inner.put_ban(ban)

    async def delete_ban(self, kind: str, who: str, expired_before: float | None = None) -> bool:
        self._check("delete_ban")
        return await self.inner.delete_ban(kind, who, expired_before)

    async def put_group(self, record: GroupRecord) -> None:
        self._check("put_group")
        await self.inner.put_group(record)

    async def get_group(self, name: str) -> GroupRecord | None:
        self._check("get_group")
        return await self.inner.get_group(name)

    async def list_groups(self) -> list[GroupRecord]:
        self._check("list_groups")
        return await self.inner.list_groups()

    async def delete_group(self, name: str) -> None:
        self._check("delete_group")
        await self.inner.delete_group(name)

    async def claim(self, group: str, after: int, upto: int, seqs: Sequence[int], owner: str,
                    visible_at_ms: int, lanes: Mapping[int, str] | None = None) -> tuple[list[Claim], int]:
        self._check("claim")
        return await self.inner.claim(group, after, upto, seqs, owner, visible_at_ms, lanes)

    async def reclaim(self, group: str, owner: str, now_ms: int, visible_at_ms: int, limit: int) -> list[Claim]:
        self._check("reclaim")
        return await self.inner.reclaim(group, owner, now_ms, visible_at_ms, limit)

    async def settle(self, group: str, handles: Sequence[tuple[int, int]]) -> list[int]:
        self._check("settle")
        return await self.inner.settle(group, handles)

    async def set_visibility(self, group: str, handles: Sequence[tuple[int, int]],
                             visible_at_ms: int) -> list[Claim]:
        self._check("set_visibility")
        return await self.inner.set_visibility(group, handles, visible_at_ms)

    async def release_owner(self, group: str, owner: str) -> int:
        self._check("release_owner")
        return await self.inner.release_owner(group, owner)

    async def group_position(self, group: str) -> tuple[int, int]:
        self._check("group_position")
        return await self.inner.group_position(group)

    async def ready_claims(self, group: str, now_ms: int) -> list[int]:
        self._check("ready_claims")
        return await self.inner.ready_claims(group, now_ms)

    async def pending_claims(self, group: str, after_seq: int, limit: int) -> list[PendingClaim]:
        self._check("pending_claims")
        return await self.inner.pending_claims(group, after_seq, limit)

    async def dedupe_ids(self, scope: str) -> list[str]:
        self._check("dedupe_ids")
        return await self.inner.dedupe_ids(scope)

    async def release_dedupe(self, scope: str, ids: Sequence[str] | None = None) -> None:
        self._check("release_dedupe")
        await self.inner.release_dedupe(scope, ids)

    async def fetch(self, seqs: Sequence[int]) -> list[Message]:
        self._check("fetch")
        return await self.inner.fetch(seqs)

    def log_partitions(self) -> int:
        return self.inner.log_partitions()

    async def read_log(self, partition: int, after_seq: int, limit: int) -> LogSlice:
        self._check("read_log")
        return await self.inner.read_log(partition, after_seq, limit)

    async def hold_log(self, partition: int, holder: str, seq: int) -> None:
        self._check("hold_log")
        await self.inner.hold_log(partition, holder, seq)

    async def log_holds(self, partition: int) -> dict[str, int]:
        self._check("log_holds")
        return await self.inner.log_holds(partition)
