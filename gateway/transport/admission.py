"""Whether a new connection may proceed, for every protocol: refused cleanly (MQTT: a CONNACK with a reason;
AMQP: Connection.Close; RocketMQ: TOO_MANY_REQUESTS; never a reset) when its listener is full, the listener's
connect rate is exceeded, too many connects are already waiting for authentication, the event loop is
overloaded, the node cannot reach its store (`gateway.core.store_health`), or the node is stopping; clients
already connected are served as before. `Admission.refusal` says which, in neutral terms; each protocol answers
it with its own code.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Literal

from tidewire.extensions.authentication import AuthChain, AuthRequest, Identity, Refused
from tidewire.gateway.config import Settings
from tidewire.gateway.core.store_health import StoreHealth
from tidewire.gateway.transport.listeners import Listener

AdmissionKind = Literal["stopping", "unavailable", "busy", "rate"]


@dataclass(frozen=True, slots=True)
class AdmissionRefusal:
    """Why a new connection is turned away: the node is `stopping` (go to another node), `unavailable` (it cannot
    reach its store: go to another node, or come back later), `busy` (full,
    overloaded, too many in authentication) or over its connect `rate`; `detail` for the log and the client."""

    kind: AdmissionKind
    detail: str


class Admission:
    """Node-wide admission state shared by the listeners."""

    __slots__ = ("_sourceless", "draining", "lag_ms", "max_lag_ms", "max_pending", "pending", "store")

    def __init__(self, settings: Settings) -> None:
        self.draining = False  # the node is stopping: /readyz answers 503 and new CONNECTs are refused
        self.store: StoreHealth | None = None  # the node's: while its store is down, new CONNECTs are refused
        self.pending = 0  # CONNECTs being authenticated right now
        self.max_pending = settings.max_pending_connects
        self.max_lag_ms = settings.overload_loop_lag_ms
        self.lag_ms = 0.0
        self._sourceless: dict[tuple[AuthChain, bool], Identity | Refused] = {}

    def sourceless(self, chain: AuthChain, credentials: bool) -> Identity | Refused | None:
        """The answer of an authentication chain with no source, which by its rules depends only on whether the
        client presented credentials (and on `allow_anonymous`): asked once per kind, without a task. None if
        the chain would wait after all (then ask it in a task)."""
        key = (chain, credentials)
        answer = self._sourceless.get(key)
        if answer is None:
            decided = chain.authenticate(AuthRequest("", "" if credentials else None, None))
            try:
                decided.send(None)
            except StopIteration as done:
                answer = self._sourceless[key] = done.value
            else:
                decided.close()
        return answer

    @property
    def overloaded(self) -> bool:
        return bool(self.max_lag_ms) and self.lag_ms > self.max_lag_ms

    def refusal(self, listener: Listener, now: float, reconnecting: bool) -> AdmissionRefusal | None:
        """Why a new connection on `listener` must be refused, or None (then it takes a rate token)."""
        if self.draining:  # a client that got in before the listener closed: let it go to another node now
            return AdmissionRefusal("stopping", "the node is stopping")
        if self.store is not None and self.store.down:  # the details (addresses, errors) are for /readyz, not clients
            return AdmissionRefusal("unavailable", "the store is unreachable")
        if self.overloaded:
            return AdmissionRefusal("busy", f"overloaded (event loop lag {self.lag_ms:.0f} ms)")
        if self.pending >= self.max_pending:
            return AdmissionRefusal("busy", "too many connects in authentication")
        if listener.connections >= listener.max_connections and not reconnecting:
            return AdmissionRefusal("busy", f"max connections on listener {listener.name}")
        if listener.rate is not None and not listener.rate.take(now):
            return AdmissionRefusal("rate", f"connect rate on listener {listener.name}")
        return None

    async def watch_loop_lag(self, interval: float = 0.1) -> None:
        """Sample how late the event loop wakes us: the clearest sign that new work would hurt current work."""
        loop = asyncio.get_running_loop()
        while True:
            start = loop.time()  # the loop's own clock, not the node's: what is measured is how late its timer fired
            await asyncio.sleep(interval)
            sample = (loop.time() - start - interval) * 1000
            # Smoothed: one slow tick (a GC pause, a big batch) is not overload; lag that lasts is.
            self.lag_ms = self.lag_ms * 0.5 + sample * 0.5
