"""Invisibility renewal for push consumers, as the RocketMQ 5 proxy does it: a push consumer receives with
`auto_renew` and no invisible duration, and never calls ChangeInvisibleDuration while its listener runs. The
server keeps each message it handed out that way hidden, renewing its claim before it lapses, until the client
settles it (ack, nack, dead letter), for at most `max_ms` in all (then the claim lapses and the message goes to
another consumer), and lets the client's messages go (visible after `RELEASE_DELAY_MS`) when it leaves this node
(NotifyClientTermination, or its telemetry stream ends, as when the client process dies).

A renewal gives the claim a new token (`ConsumerGroups.requeue`), while the client keeps the receipt handle it
got: `settle` maps that handle to the claim's current token, after any renewal of it still running.
`RenewalTable` is the pure bookkeeping (the clock's milliseconds passed in); `Renewals` runs it against the
consumer groups.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from tidewire.gateway.core.clock import Clock
from tidewire.store.base import Claim

log = logging.getLogger("tidewire.rocketmq")

RELEASE_DELAY_MS = 1000  # a departed client's messages show again after this (the proxy's invisibleTimeMillisWhenClear)
MAX_HELD = 100_000  # messages renewed at once on a node; past this a delivery just lapses after its duration
STOP_WAIT_S = 2.0

Key = tuple[str, int, int]  # (group, seq, the token the client's receipt handle names)
Requeue = Callable[[str, list[tuple[int, int]], int], Awaitable[list[Claim]]]  # ConsumerGroups.requeue


@dataclass(slots=True)
class Held:
    client_id: str
    token: int  # the claim's current token
    visible_at_ms: int  # when the current claim lapses
    since_ms: int  # when it was handed out
    renewing: asyncio.Future[None] | None = field(default=None)


class RenewalTable:
    """Which handed-out messages are renewed, and which are due: no I/O, no clock of its own."""

    def __init__(self, invisible_ms: int, max_ms: int, capacity: int = MAX_HELD) -> None:
        self.invisible_ms = invisible_ms
        self.max_ms = max_ms
        self.capacity = capacity
        self.held: dict[Key, Held] = {}

    def hold(self, group: str, client_id: str, claim: Claim, now_ms: int) -> bool:
        if len(self.held) >= self.capacity:
            return False
        self.held[(group, claim.seq, claim.token)] = Held(client_id, claim.token, now_ms + self.invisible_ms, now_ms)
        return True

    def due(self, now_ms: int) -> tuple[list[Key], list[Key]]:
        """(to renew now: less than half the duration left; to give up: renewed for `max_ms` already)."""
        renew: list[Key] = []
        expired: list[Key] = []
        for key, held in self.held.items():
            if held.renewing is not None or held.visible_at_ms - now_ms > self.invisible_ms // 2:
                continue
            (expired if now_ms - held.since_ms >= self.max_ms else renew).append(key)
        return renew, expired

    def of_client(self, client_id: str) -> list[Key]:
        return [key for key, held in self.held.items() if held.client_id == client_id]


class Renewals:
    """The node's renewals of push consumers' messages (one per RocketMQ listener)."""

    def __init__(self, requeue: Requeue, clock: Clock, invisible_ms: int, max_ms: int) -> None:
        self.requeue = requeue
        self.clock = clock
        self.table = RenewalTable(invisible_ms, max_ms)
        self.renewed = 0  # claims extended (a counter for tests and logs)
        self._task: asyncio.Task[None] | None = None
        self._releases: set[asyncio.Task[None]] = set()

    @property
    def invisible_ms(self) -> int:
        return self.table.invisible_ms

    def _now_ms(self) -> int:
        return int(self.clock.time() * 1000)

    def hold(self, group: str, client_id: str, claims: Sequence[Claim]) -> None:
        """Renew these claims, just handed to `client_id` with `invisible_ms`, until settled."""
        now = self._now_ms()
        for claim in claims:
            self.table.hold(group, client_id, claim, now)
        if self._task is None and self.table.held:
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def settle(self, group: str, handles: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
        """The handles as the store knows them now; each stops being renewed (the client settles it)."""
        current = []
        for seq, token in handles:
            held = self.table.held.pop((group, seq, token), None)
            if held is not None and held.renewing is not None:
                await asyncio.shield(held.renewing)
            current.append((seq, held.token if held is not None else token))
        return current

    def client_gone(self, client_id: str) -> None:
        """`client_id` left this node: its messages show again shortly, to any consumer."""
        by_group: dict[str, list[tuple[int, int]]] = {}
        for key in self.table.of_client(client_id):
            held = self.table.held.pop(key)
            if held.renewing is None:  # one being renewed lapses at its new time instead
                by_group.setdefault(key[0], []).append((key[1], held.token))
        for group, handles in by_group.items():
            task = asyncio.get_running_loop().create_task(self._release(group, handles))
            self._releases.add(task)
            task.add_done_callback(self._releases.discard)

    async def _release(self, group: str, handles: list[tuple[int, int]]) -> None:
        try:
            await self.requeue(group, handles, RELEASE_DELAY_MS)
        except Exception as exc:  # they show when their claims lapse
            log.warning("rocketmq.release_failed", extra={"group": group, "error": repr(exc)})

    async def _loop(self) -> None:
        while self.table.held:
            await asyncio.sleep(self.table.invisible_ms / 4000)
            renew, expired = self.table.due(self._now_ms())
            for key in expired:
                del self.table.held[key]  # its claim lapses: another consumer gets the message
            if expired:
                log.info("rocketmq.renewal_ended", extra={"messages": len(expired)})
            await asyncio.gather(*(self._renew(key) for key in renew))
        self._task = None

    async def _renew(self, key: Key) -> None:
        held = self.table.held.get(key)
        if held is None:
            return
        done = held.renewing = asyncio.get_running_loop().create_future()
        try:
            claims = await self.requeue(key[0], [(key[1], held.token)], self.table.invisible_ms)
        except Exception as exc:  # tried again at the next tick, while the claim lasts
            log.warning("rocketmq.renew_failed", extra={"group": key[0], "error": repr(exc)})
            claims = None
        finally:
            held.renewing = None
            done.set_result(None)
        if claims == []:  # settled or lapsed meanwhile: nothing left to renew
            self.table.held.pop(key, None)
        elif claims:
            held.token = claims[0].token
            held.visible_at_ms = self._now_ms() + self.table.invisible_ms
            self.renewed += 1

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self._releases:
            await asyncio.wait(self._releases, timeout=STOP_WAIT_S)
