"""A `Store` wrapper that makes every call wait a random time, so concurrent calls run and finish out of order.

It exists to prove that callers never depend on a store that answers at once. The embedded engine finishes
most calls in their first step, so code that forgets an `await`, spawns writes fire-and-forget, or reads a
cache while a refresh is pending works by accident on it; a networked engine (Redis) breaks such code. With
this wrapper the gateway runs on the embedded engine but with the timing of a network: a gateway started with
`delaying_env(ms)` (its `store` setting names `embedded` below) runs on it. Not shipped: tests only.

Each call draws a delay in [0, max_delay_ms] and spends a random part of it before delegating (so concurrent
calls reach the inner store in a different order than issued) and the rest after (so they also complete in a
different order than they ran). Each call keeps its own semantics: it returns only once the inner call
returned, with the inner result or exception. Nothing orders two calls that overlap, as with any networked
store; calls that do not overlap keep their order.
"""

from __future__ import annotations

import asyncio
import copy
import os
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

from tidewire.gateway.config import Settings
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

T = TypeVar("T")


class DelayingStore:
    def __init__(self, inner: Store, max_delay_ms: float, seed: int | None = None) -> None:
        if not max_delay_ms >= 0:
            raise ValueError(f"max_delay_ms must be >= 0, not {max_delay_ms!r}")
        self.inner = inner
        self.max_delay = max_delay_ms / 1000
        # Own generator (not the module one): a seed reproduces a run without touching anyone else's randomness.
        self._rng = random.Random(seed)
        self.calls = 0  # delegated calls, so a test can tell the wrapper was really in the path

    async def _call(self, fn: Callable[[], Awaitable[T]]) -> T:
        total = self._rng.uniform(0, self.max_delay)
        before = self._rng.uniform(0, total)
        await asyncio.sleep(before)
        self.calls += 1
        result = await fn()
        # The inner call is done: a cancellation during the tail still leaves its effect in place, as when a
        # network reply is lost after the server applied the command.
        await asyncio.sleep(total - before)
        return result

    # --- lifecycle ----------------------------------------------------------------------------------------
    async def open(self) -> None:
        await self._call(self.inner.open)

    async def close(self) -> None:
        await self._call(self.inner.close)

    # --- messages -----------------------------------------------------------------------------------------
    async def append(self, messages: Sequence[Message], wildcard_version: int = -1) -> int | None:
        # Snapshot the list now: the caller may reuse it while this call waits to be delegated. The messages
        # themselves stay the caller's objects, since today's callers read the seq the store assigns to them.
        batch = list(messages)
        return await self._call(lambda: self.inner.append(batch, wildcard_version))

    async def sync(self) -> None:
        await self._call(self.inner.sync)

    async def read(self, queue: str, after_seq: int, limit: int, seal: int = 0) -> Slice:
        return await self._call(lambda: self.inner.read(queue, after_seq, limit, seal))

    def last_seq(self) -> int:
        return self.inner.last_seq()

    async def add_wildcards(self, filters: Sequence[str], holder: str) -> int:
        batch = list(filters)
        return await self._call(lambda: self.inner.add_wildcards(batch, holder))

    async def remove_wildcards(self, filters: Sequence[str], holder: str) -> int:
        batch = list(filters)
        return await self._call(lambda: self.inner.remove_wildcards(batch, holder))

    async def release_wildcards(self, holder: str) -> int:
        return await self._call(lambda: self.inner.release_wildcards(holder))

    async def wildcards(self) -> tuple[int, frozenset[str]]:
        return await self._call(self.inner.wildcards)

    async def subscribed(self, filters: Sequence[str]) -> bool:
        return await self._call(lambda: self.inner.subscribed(filters))

    async def add_group(self, record: GroupRecord) -> bool:
        return await self._call(lambda: self.inner.add_group(record))

    async def join_group(self, group: str, member: str, node: str, process: str, exclusive: bool) -> int:
        return await self._call(lambda: self.inner.join_group(group, member, node, process, exclusive))

    async def leave_group(self, group: str, member: str) -> int:
        return await self._call(lambda: self.inner.leave_group(group, member))

    async def group_members(self, group: str) -> int:
        return await self._call(lambda: self.inner.group_members(group))

    async def release_members(self, node: str, process: str = "") -> list[str]:
        return await self._call(lambda: self.inner.release_members(node, process))

    async def lease(self, key: str, owner: str, ttl_ms: int) -> int:
        return await self._call(lambda: self.inner.lease(key, owner, ttl_ms))

    async def release(self, key: str, owner: str) -> None:
        await self._call(lambda: self.inner.release(key, owner))

    # --- sessions and offsets -----------------------------------------------------------------------------
    async def get_session(self, client_id: str) -> SessionRecord | None:
        return await self._call(lambda: self.inner.get_session(client_id))

    def session_absent(self, client_id: str) -> bool:
        return False  # only a round trip could tell

    async def claim_session(self, client_id: str, owner: str) -> tuple[SessionRecord | None, int]:
        return await self._call(lambda: self.inner.claim_session(client_id, owner))

    async def put_session(self, record: SessionRecord) -> bool:
        # A networked engine serializes the record when the call starts; later mutations must not reach it.
        snapshot = copy.deepcopy(record)
        return await self._call(lambda: self.inner.put_session(snapshot))

    async def delete_session(self, client_id: str, epoch: int = -1) -> None:
        await self._call(lambda: self.inner.delete_session(client_id, epoch))

    async def list_sessions(self) -> list[SessionRecord]:
        return await self._call(self.inner.list_sessions)

    async def online_sessions(self) -> list[str]:
        return await self._call(self.inner.online_sessions)

    async def queue_tail(self, queue: str, after_seq: int, limit: int) -> tuple[int, list[int]]:
        return await self._call(lambda: self.inner.queue_tail(queue, after_seq, limit))

    async def session_count(self) -> int:
        return await self._call(lambda: self.inner.session_count())

    async def due_sessions(self, now_ms: int, limit: int) -> list[str]:
        return await self._call(lambda: self.inner.due_sessions(now_ms, limit))

    async def subscription_filters(self) -> dict[str, int]:
        return await self._call(self.inner.subscription_filters)

    async def shared_members(self, group_key: str) -> list[str]:
        return await self._call(lambda: self.inner.shared_members(group_key))

    async def set_offsets(self, offsets: dict[str, tuple[int, int, int]]) -> None:
        snapshot = dict(offsets)  # the caller may keep filling its dict for the next batch
        await self._call(lambda: self.inner.set_offsets(snapshot))

    # --- retained -----------------------------------------------------------------------------------------
    async def set_retained(self, topic: str, message: Message | None) -> None:
        snapshot = copy.deepcopy(message)
        await self._call(lambda: self.inner.set_retained(topic, snapshot))

    async def retained_usage(self) -> tuple[int, int]:
        return await self._call(lambda: self.inner.retained_usage())

    async def match_retained(self, topic_filter: str, after: str | None = None, limit: int = 0,
                             max_bytes: int = 0) -> list[Message]:
        return await self._call(lambda: self.inner.match_retained(topic_filter, after, limit, max_bytes))

    # --- wills --------------------------------------------------------------------------------------------
    async def put_will(self, will: WillRecord) -> None:
        snapshot = copy.deepcopy(will)
        await self._call(lambda: self.inner.put_will(snapshot))

    async def delete_will(self, client_id: str) -> None:
        await self._call(lambda: self.inner.delete_will(client_id))

    async def list_wills(self) -> list[WillRecord]:
        return await self._call(self.inner.list_wills)

    # --- versioned documents (bytes are immutable: no snapshot needed) ---------------------------------------
    async def get_document(self, name: str) -> tuple[int, bytes]:
        return await self._call(lambda: self.inner.get_document(name))

    async def put_document(self, name: str, value: bytes, expected: int) -> int:
        return await self._call(lambda: self.inner.put_document(name, value, expected))

    # --- bans (a Ban is frozen: no snapshot needed) ---------------------------------------------------------
    async def get_bans(self) -> list[Ban]:
        return await self._call(self.inner.get_bans)

    async def put_ban(self, ban: Ban) -> None:
        await self._call(lambda: self.inner.put_ban(ban))

    async def delete_ban(self, kind: str, who: str, expired_before: float | None = None) -> bool:
        return await self._call(lambda: self.inner.delete_ban(kind, who, expired_before))

    # --- consumer groups (arguments snapshot when the call starts, as a networked engine serializes them) -------
    async def put_group(self, record: GroupRecord) -> None:
        snapshot = copy.deepcopy(record)
        await self._call(lambda: self.inner.put_group(snapshot))

    async def get_group(self, name: str) -> GroupRecord | None:
        return await self._call(lambda: self.inner.get_group(name))

    async def list_groups(self) -> list[GroupRecord]:
        return await self._call(self.inner.list_groups)

    async def delete_group(self, name: str) -> None:
        await self._call(lambda: self.inner.delete_group(name))

    async def claim(self, group: str, after: int, upto: int, seqs: Sequence[int], owner: str,
                    visible_at_ms: int, lanes: Mapping[int, str] | None = None) -> tuple[list[Claim], int]:
        batch = list(seqs)
        return await self._call(lambda: self.inner.claim(group, after, upto, batch, owner, visible_at_ms, lanes))

    async def reclaim(self, group: str, owner: str, now_ms: int, visible_at_ms: int, limit: int) -> list[Claim]:
        return await self._call(lambda: self.inner.reclaim(group, owner, now_ms, visible_at_ms, limit))

    async def settle(self, group: str, handles: Sequence[tuple[int, int]]) -> list[int]:
        batch = list(handles)
        return await self._call(lambda: self.inner.settle(group, batch))

    async def set_visibility(self, group: str, handles: Sequence[tuple[int, int]],
                             visible_at_ms: int) -> list[Claim]:
        batch = list(handles)
        return await self._call(lambda: self.inner.set_visibility(group, batch, visible_at_ms))

    async def release_owner(self, group: str, owner: str) -> int:
        return await self._call(lambda: self.inner.release_owner(group, owner))

    async def group_position(self, group: str) -> tuple[int, int]:
        return await self._call(lambda: self.inner.group_position(group))

    async def ready_claims(self, group: str, now_ms: int) -> list[int]:
        return await self._call(lambda: self.inner.ready_claims(group, now_ms))

    async def pending_claims(self, group: str, after_seq: int, limit: int) -> list[PendingClaim]:
        return await self._call(lambda: self.inner.pending_claims(group, after_seq, limit))

    async def dedupe_ids(self, scope: str) -> list[str]:
        return await self._call(lambda: self.inner.dedupe_ids(scope))

    async def release_dedupe(self, scope: str, ids: Sequence[str] | None = None) -> None:
        await self._call(lambda: self.inner.release_dedupe(scope, ids))

    async def fetch(self, seqs: Sequence[int]) -> list[Message]:
        batch = list(seqs)
        return await self._call(lambda: self.inner.fetch(batch))

    # --- the log for readers --------------------------------------------------------------------------------
    def log_partitions(self) -> int:
        return self.inner.log_partitions()

    async def read_log(self, partition: int, after_seq: int, limit: int) -> LogSlice:
        return await self._call(lambda: self.inner.read_log(partition, after_seq, limit))

    async def hold_log(self, partition: int, holder: str, seq: int) -> None:
        await self._call(lambda: self.inner.hold_log(partition, holder, seq))

    async def log_holds(self, partition: int) -> dict[str, int]:
        return await self._call(lambda: self.inner.log_holds(partition))

    # --- engine extras --------------------------------------------------------------------------------------
    async def enforce_retention(self) -> int:
        """Forwarded when the inner engine has it (the node looks it up with getattr); 0 otherwise."""
        enforce: Callable[[], Awaitable[int]] | None = getattr(self.inner, "enforce_retention", None)
        if enforce is None:
            return 0
        return await self._call(enforce)


REPO = Path(__file__).resolve().parents[2]


def embedded(settings: Settings, delay_ms: str = "5", seed: str = "") -> DelayingStore:
    """The node's embedded engine answering 0..`delay_ms` ms late: what `store = "tests.store.delaying:embedded"`
    builds (the gateway's import-string engines)."""
    from tidewire.gateway.server import build_store  # the node's own engine, as it would build it

    inner = build_store(settings.model_copy(update={"store": "embedded"}))
    return DelayingStore(inner, float(delay_ms), int(seed) if seed else None)


def delaying_env(delay_ms: float) -> dict[str, str]:
    """Environment for a gateway process on the delaying engine: the setting, and the path its import needs
    (a gateway runs in its own work directory)."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return {"TIDEWIRE_STORE": f"tests.store.delaying:embedded?delay_ms={delay_ms:g}", "PYTHONPATH": path}
