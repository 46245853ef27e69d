"""The append fence: a writer's appends in flight at once land in the order it issued them.

Concurrent appends go out on different connections and may reach Redis in another order. Each names a token of
its own and, per partition, the token of this writer's append before it there; the append script refuses (and
writes nothing) when the partition's fence key does not hold that token, i.e. when the predecessor has not run
there yet. A refused append waits until its predecessor has landed and is sent again unchecked: nothing of this
writer's before it is in flight then. If the predecessor failed, so does the append (it cannot land before it),
and the caller sends both again in order. A partition whose last append failed is unchecked for the next one:
its token may or may not have been written.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
from collections.abc import Iterable

from tidewire.errors import StoreUnavailable


class PredecessorFailed(StoreUnavailable):
    """The append issued before this one failed, so this one was not stored either (send both again, in order)."""


class Ticket:
    """One append's place in the fence: its token, the tokens it expects per partition, and its outcome."""

    __slots__ = ("done", "expect", "predecessors", "token")

    def __init__(self, token: str) -> None:
        self.token = token
        self.expect: dict[int, str] = {}  # partition -> the token before it there ('': unchecked)
        self.predecessors: dict[int, asyncio.Future[None]] = {}
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()


class AppendFence:
    """The tokens of one store instance (one writer): `issue` before the call, `landed` or `failed` after it."""

    def __init__(self) -> None:
        self.id = secrets.token_hex(8)
        self._numbers = itertools.count(1)
        self._last: dict[int, Ticket] = {}  # partition -> the last append issued to it

    def issue(self, partitions: Iterable[int]) -> Ticket:
        ticket = Ticket(f"{self.id}:{next(self._numbers)}")
        for n in partitions:
            before = self._last.get(n)
            ticket.expect[n] = before.token if before is not None else ""
            if before is not None:
                ticket.predecessors[n] = before.done
            self._last[n] = ticket
        return ticket

    async def after_predecessors(self, ticket: Ticket, partitions: Iterable[int]) -> None:
        """Return once the appends before `ticket` on these partitions have landed; raise if one failed."""
        for n in partitions:
            before = ticket.predecessors.get(n)
            if before is None:
                continue  # refused although unchecked: the key vanished (its time to live); nothing is before us
            try:
                await asyncio.shield(before)
            except asyncio.CancelledError:
                if before.cancelled():
                    raise PredecessorFailed("the append before this one was cancelled") from None
                raise
            except Exception as exc:
                raise PredecessorFailed(f"the append before this one failed: {exc}") from exc

    def landed(self, ticket: Ticket) -> None:
        if not ticket.done.done():
            ticket.done.set_result(None)
        ticket.predecessors.clear()

    def failed(self, ticket: Ticket, exc: BaseException) -> None:
        if not ticket.done.done():
            if isinstance(exc, asyncio.CancelledError):
                ticket.done.cancel()
            else:
                ticket.done.set_exception(exc)
                ticket.done.exception()  # retrieved: only the appends after it look at it
        ticket.predecessors.clear()
        for n in ticket.expect:
            if self._last.get(n) is ticket:
                del self._last[n]  # its token may or may not be there: the next append goes unchecked
