"""The append stage of the publish pipeline: published messages into the store in batches, in publish order.

A batch is whatever was published since the last append started. With a store that keeps several appends of
one caller in call order (`store.base.append_depth`: Redis, whose appends wait on a round trip and the script's
work), the next batch is appended while the one before is under way, up to that depth; otherwise (the embedded
store, whose appends do not wait) one at a time, awaited in the caller's own step as before. Batches land in
the order they were taken (the next starts once the one before has called the store, which orders appends by
their calls). An append that fails is sent again alone, in its place, once every append after it
has settled (an append after a failed one can only have landed if the failed one did and its reply was lost):
nothing is reordered, and a batch whose reply was lost may be stored twice (at least once). No new batch is
taken while a failed one waits to land again.

Messages are indexed (`message.queues`: the topic's queues and the `message.routes` a publisher chose) when
their append starts, with the wildcard version they go with; an append refused as stale (`StaleWildcards`:
another node changed the set) is indexed again and sent again (when it was one of several in flight: in its
place, as a failed one).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from tidewire.errors import StaleWildcards
from tidewire.store.base import Message, Store, append_depth


class Indexer(Protocol):
    """What indexes a message into queues (the subscription registry)."""

    @property
    def wildcard_version(self) -> int: ...

    def queues_for(self, topic: str) -> tuple[str, ...]: ...

    async def refresh_wildcards(self) -> None: ...


class Landed:
    """A batch the store took: its messages (seqs assigned), the acks waiting on it, what `append` returned, and
    how long the append took (seconds)."""

    __slots__ = ("acks", "after", "batch", "seconds")

    def __init__(self, batch: list[Message], acks: list[Any], after: int | None, seconds: float) -> None:
        self.batch = batch
        self.acks = acks
        self.after = after
        self.seconds = seconds


class _Append:
    __slots__ = ("acks", "after", "batch", "failed", "sent", "started", "task")

    def __init__(self, batch: list[Message], acks: list[Any], started: float) -> None:
        self.batch = batch
        self.acks = acks
        self.started = started
        self.task: asyncio.Task[int | None] | None = None
        self.after: int | None = None
        self.failed = False
        self.sent = False  # its task has called the store: the store knows its place in the order


class Appends:
    """Batches of (message, ack) taken from `add` into the store; `step` starts appends and returns what landed."""

    def __init__(self, store: Store, indexer: Indexer, monotonic: Callable[[], float],
                 wake: Callable[[], None]) -> None:
        """`wake()` is called when an append in flight ends: the caller's next `step` takes it."""
        self.store = store
        self.depth = append_depth(store)
        self._indexer = indexer
        self._monotonic = monotonic
        self._wake = wake
        self.waiting: list[Message] = []  # published since the last append started
        self._waiting_acks: list[Any] = []
        self._inflight: deque[_Append] = deque()
        self.unlanded = 0  # messages added and not landed yet

    def add(self, message: Message, ack: Any | None) -> None:
        self.waiting.append(message)
        if ack is not None:
            self._waiting_acks.append(ack)
        self.unlanded += 1

    def take_acks(self) -> list[Any]:
        """The acks of everything not landed, taken (the node stops: they are refused)."""
        acks = [ack for a in self._inflight for ack in a.acks] + self._waiting_acks
        for a in self._inflight:
            a.acks = []
        self._waiting_acks = []
        return acks

    async def step(self, wait: bool = False) -> list[Landed]:
        """Land what can land, in order, and start appends up to the depth. `wait`: also wait for the appends
        in flight (the node stops). Raises on a store error; what did not land stays in place for the next step."""
        landed: list[Landed] = []
        inflight = self._inflight
        while inflight:
            head = inflight[0]
            if head.task is not None:
                if not head.task.done():
                    if not wait:
                        break
                    await asyncio.wait({head.task})
                self._settle(head)
            if head.failed:
                if landed:
                    self._wake()  # the rest at the next step
                    return landed  # handed over first: the append again may raise
                for a in inflight:  # the appends after it settle first: one of them may have landed
                    if a.task is not None and a.task.done():
                        self._settle(a)
                under_way = [a.task for a in inflight if a.task is not None]
                if under_way:
                    if not wait:
                        break  # each wakes the caller when it ends
                    await asyncio.wait(under_way)
                    for a in inflight:
                        if a.task is not None:
                            self._settle(a)
                head.after = await self._append(head.batch)
                head.failed = False
            inflight.popleft()
            self.unlanded -= len(head.batch)
            landed.append(Landed(head.batch, head.acks, head.after, self._monotonic() - head.started))
        if not any(a.failed for a in inflight):
            if self.depth == 1:
                if self.waiting and landed:
                    self._wake()  # after what landed is handed over: this append may raise
                elif self.waiting and not inflight:
                    batch, acks = self._take()
                    started = self._monotonic()
                    append = _Append(batch, acks, started)
                    append.failed = True  # until it lands: if this raises, it stays first, to be sent again
                    inflight.append(append)
                    append.after = await self._append(batch)
                    inflight.popleft()
                    self.unlanded -= len(batch)
                    landed.append(Landed(batch, acks, append.after, self._monotonic() - started))
            else:
                # The next starts only once the one before has called the store, which orders appends by their
                # calls: a task created earlier may not have run yet.
                while self.waiting and len(inflight) < self.depth and (not inflight or inflight[-1].sent):
                    self._start()
        return landed

    @property
    def idle(self) -> bool:
        return not self.waiting and not self._inflight

    def _take(self) -> tuple[list[Message], list[Any]]:
        batch, acks = self.waiting, self._waiting_acks
        self.waiting, self._waiting_acks = [], []
        return batch, acks

    def _start(self) -> None:
        batch, acks = self._take()
        append = _Append(batch, acks, self._monotonic())
        indexer = self._indexer
        queues_for = indexer.queues_for
        for message in batch:
            message.queues = queues_for(message.topic)
            if message.routes:
                message.queues = _with_routes(message.queues, message.routes)
        # Any refusal (a stale wildcard set too) fails the task: the batch is sent again in its place by `step`,
        # once the appends after it have settled (they cannot land before it).
        append.task = asyncio.get_running_loop().create_task(self._send(append, indexer.wildcard_version))
        append.task.add_done_callback(lambda _: self._wake())
        self._inflight.append(append)

    async def _send(self, append: _Append, version: int) -> int | None:
        append.sent = True
        self._wake()  # the next batch may start now
        return await self.store.append(append.batch, version)

    @staticmethod
    def _settle(append: _Append) -> None:
        task, append.task = append.task, None
        assert task is not None and task.done()
        if task.cancelled() or task.exception() is not None:
            append.failed = True
        else:
            append.after = task.result()

    async def _append(self, batch: list[Message]) -> int | None:
        indexer = self._indexer
        while True:
            # Indexed here, not when published: the queues and the version they go with are read together.
            queues_for = indexer.queues_for
            for message in batch:
                message.queues = queues_for(message.topic)
                if message.routes:
                    message.queues = _with_routes(message.queues, message.routes)
            try:
                return await self.store.append(batch, indexer.wildcard_version)
            except StaleWildcards:  # another node changed the set: index the batch with the current one
                await indexer.refresh_wildcards()


def _with_routes(queues: tuple[str, ...], routes: tuple[str, ...]) -> tuple[str, ...]:
    """The topic's queues and those the publisher's routing added (each once)."""
    return queues + tuple(q for q in routes if q not in queues)
