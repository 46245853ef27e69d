"""Store writes that callers fire and forget, applied in the order they were issued per key.

A session's records are written from several places (open, subscribe, close) without waiting. On a store that
answers late or out of order (any networked engine), an older record could land after a newer one: a session
saved at subscribe time would lose its subscriptions to the record saved when it was created. Here each write
starts only once the previous write of the same key has finished, and a failing store is retried with backoff:
nothing is dropped and nothing is reordered.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Callable

from tidewire.gateway.core.clock import SYSTEM_CLOCK, Clock
from tidewire.gateway.core.retry import Backoff, stop_if_cancelled
from tidewire.store.base import SessionRecord, Store, WillRecord

Write = Callable[[], Awaitable[None]]


class OrderedWrites:
    __slots__ = ("_retry", "_tail")

    def __init__(self, clock: Clock = SYSTEM_CLOCK) -> None:
        self._tail: dict[str, asyncio.Task[None]] = {}  # key -> its last write
        self._retry = Backoff("write", clock)

    def write(self, key: str, make: Write) -> None:
        """Run `make()` after every earlier write of `key`; `make` builds the store call (it may run again)."""
        task = asyncio.get_running_loop().create_task(self._after(self._tail.get(key), make))
        self._tail[key] = task
        task.add_done_callback(functools.partial(self._done, key))

    async def settled(self, key: str) -> None:
        """Wait for every write of `key` issued so far (before reading what they wrote)."""
        task = self._tail.get(key)
        if task is not None:
            await asyncio.wait([task])

    async def close(self, timeout: float) -> int:
        """Wait up to `timeout` for pending writes, then cancel the rest; returns how many were cancelled."""
        pending = set(self._tail.values())
        if not pending:
            return 0
        _, late = await asyncio.wait(pending, timeout=timeout)
        for task in late:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*late, return_exceptions=True)
        return len(late)

    async def _after(self, previous: asyncio.Task[None] | None, make: Write) -> None:
        if previous is not None:
            await asyncio.wait([previous])  # only its order matters here; its outcome is its own
        while True:
            try:
                await make()
            except OSError as exc:
                stop_if_cancelled()
                await asyncio.sleep(self._retry.failed(exc))
                continue
            self._retry.succeeded()
            return

    def _done(self, key: str, task: asyncio.Task[None]) -> None:
        if self._tail.get(key) is task:
            del self._tail[key]
        if not task.cancelled() and task.exception() is not None:
            # Not OSError (those are retried): a bug. Logged like any background task's failure.
            asyncio.get_running_loop().call_exception_handler(
                {"message": "store write failed", "exception": task.exception(), "task": task})


class RecordWrites(OrderedWrites):
    """Session and will records, in the order issued per client."""

    __slots__ = ("_releases", "_store", "_wills")

    def __init__(self, store: Store, clock: Clock = SYSTEM_CLOCK) -> None:
        super().__init__(clock)
        self._store = store
        self._wills: set[str] = set()  # clients whose will was saved here and not dropped since
        self._releases: dict[str, list[str]] = {}  # scope -> key ids waiting for its next release

    def save_session(self, record: SessionRecord) -> None:
        """Fenced by the record's epoch: once another node claimed the session, this write is ignored."""
        async def put() -> None:
            await self._store.put_session(record)

        self.write("s:" + record.client_id, put)

    def drop_session(self, client_id: str, epoch: int = -1) -> None:
        """The session goes, and with it the de-duplication keys of its publishes (scope: its client id). The
        keys go first: two calls (on Redis Cluster the keys live in every partition's slot), and a crash between
        them must not leave keys that a new session's QoS 2 publish under the same packet id would be refused
        as a duplicate by (lost); the other way round it leaves a session that is deleted again."""
        async def drop() -> None:
            await self._store.release_dedupe(client_id)
            await self._store.delete_session(client_id, epoch)

        self.write("s:" + client_id, drop)

    def release_key(self, scope: str, key_id: str) -> None:
        """Release a de-duplication key (`Message.dedupe`); the keys of one scope released while a release of
        it is under way go together in the next one. `keys_settled` waits for it."""
        self.release_keys(scope, [key_id])

    def release_keys(self, scope: str, ids: list[str]) -> None:
        pending = self._releases.get(scope)
        if pending is not None:
            pending += ids
            return
        self._releases[scope] = list(ids)
        taken: list[list[str]] = []

        async def release() -> None:
            if not taken:  # once: a retry sends the same ids
                taken.append(self._releases.pop(scope))
            await self._store.release_dedupe(scope, taken[0])

        self.write("d:" + scope, release)

    async def keys_settled(self, scope: str) -> None:
        await self.settled("d:" + scope)

    def save_will(self, will: WillRecord) -> None:
        self._wills.add(will.client_id)
        self.write("w:" + will.client_id, lambda: self._store.put_will(will))

    def drop_will(self, client_id: str) -> None:
        self._wills.discard(client_id)
        self.write("w:" + client_id, lambda: self._store.delete_will(client_id))

    def idle(self, client_id: str) -> bool:
        """No write of the client's session or will under way, and no will of its saved here and not dropped
        since (on one node: the store holds no will of it)."""
        tail = self._tail
        return client_id not in self._wills and ("s:" + client_id) not in tail and ("w:" + client_id) not in tail

    async def session_settled(self, client_id: str) -> None:
        await self.settled("s:" + client_id)

    async def will_settled(self, client_id: str) -> None:
        await self.settled("w:" + client_id)
