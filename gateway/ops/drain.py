"""Graceful drain of a stopping node (SIGTERM/SIGINT): the order of the steps and the time they get.

1. `node.draining = True` first: /readyz answers 503, so a load balancer sends no new client here.
2. Stop accepting on every listener: the MQTT listeners, then each backend (AMQP, RocketMQ, the lake exporter),
   whose `stop()` closes its own listener and then its connections (AMQP: Connection.Close 320, unacked
   messages requeued for the other consumers).
3. `Node.stop`: stop reading MQTT clients, let what they already sent be stored and acknowledged (PUBACK/PUBREC),
   then disconnect them, `DISCONNECT_BATCH` per event-loop turn: 5.0 clients get DISCONNECT 0x8B (Server shutting
   down), or 0x9C (Use another server) with the Server Reference when `server_reference` is set; 3.1.1 clients
   see the connection closed. Then it flushes: wills, session records, offsets, the last appends and their acks.
   Then what records the node's own stopping finishes (`finish`: the lake's events exporter writes the
   disconnects and acks of step 3).
4. Leave the cluster (the others re-balance at once instead of after the member TTL), after the clients are gone:
   a client reconnecting elsewhere has its old node answer the takeover kick meanwhile.
5. Close the store.

All of it within `drain_timeout`: each step gets what is left (a backend at most half of it; the node keeps
`_RESERVE_S` back for steps 4 and 5, and leaving the cluster half of that for the store); a step that overruns is
cut, logged as `drain.step_timeout`, and the next ones still run.

Wills. MQTT 5.0 3.1.2.5: the server publishes the will once the connection is closed without a DISCONNECT 0x00
from the client, when the Will Delay Interval has passed or the session has ended, whichever is first; a server
closing the connection is one of those cases (3.1.1 3.1.2.5: the will is removed only once published or on the
client's DISCONNECT). So a will whose delay is 0 (every 3.1.1 will; a 5.0 session that ends with its connection)
is published during the drain and stored by its flush, as Mosquitto 2.0 (`context__send_will` for every client
at shutdown) and EMQX (a channel ended for any reason but a client DISCONNECT, a kick or a takeover) do.
A delayed will of a persistent session is not published now (Mosquitto publishes it too, with a FIXME saying it
should instead be kept and restored): its stored record stays, the client has its delay to come back, here or on
another node (which deletes it). A single node's next start publishes it once what is left of its delay has
passed, counted from the disconnect (`gateway.sessions.wills.delay_left`); in a cluster, a survivor or the next start
publishes it at once, as the client may come back on any node.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from tidewire.gateway.core.clock import Clock
from tidewire.gateway.protocols.mqtt.codec import PropertyId, ReasonCode
from tidewire.gateway.transport.accept_loop import AcceptLoop

if TYPE_CHECKING:
    from tidewire.gateway.config import Settings
    from tidewire.gateway.node import Node
    from tidewire.gateway.protocols.mqtt.lifecycle import ChannelBase

log = logging.getLogger("tidewire.drain")

DISCONNECT_BATCH = 128  # connections disconnected per event-loop turn: 10k DISCONNECT writes never hold the loop
QUIESCE_S = 1.0  # at most this long (and a quarter of the node's budget) for publishes read to be acknowledged
POLL_S = 0.005  # how often the drain looks whether what it waits for is done
_RESERVE_S = 1.0  # kept back from the node's flush for leaving the cluster and closing the store
_RESERVE_SHARE = 0.2  # ... or this share of drain_timeout when that is less


class _Closing(Protocol):
    def is_closing(self) -> bool: ...


class _Closable(Protocol):
    def close(self) -> None: ...


class _Stoppable(Protocol):
    async def stop(self) -> None: ...


@runtime_checkable
class _Finishing(Protocol):
    async def finish(self) -> None: ...


class _Store(Protocol):
    async def close(self) -> None: ...


def shutdown_disconnect(settings: Settings) -> tuple[int, dict[int, Any]]:
    """The reason code and properties of the DISCONNECT a stopping node sends its MQTT 5 clients."""
    if settings.server_reference:
        return ReasonCode.USE_ANOTHER_SERVER, {PropertyId.SERVER_REFERENCE: settings.server_reference,
                                               PropertyId.REASON_STRING: "server shutting down: use another server"}
    return ReasonCode.SERVER_SHUTTING_DOWN, {PropertyId.REASON_STRING: "server shutting down"}


class Budget:
    """What is left of one deadline on `clock`, for steps run one after the other."""

    __slots__ = ("clock", "deadline", "started")

    def __init__(self, seconds: float, clock: Clock) -> None:
        self.clock = clock
        self.started = clock.monotonic()
        self.deadline = self.started + seconds

    def left(self) -> float:
        return max(0.0, self.deadline - self.clock.monotonic())

    def elapsed_ms(self) -> int:
        return round((self.clock.monotonic() - self.started) * 1000)

    async def run(self, step: str, work: Awaitable[None], limit: float | None = None) -> bool:
        """Await `work` for what is left (at most `limit` s); False, logged, when it was cut or failed."""
        timeout = self.left() if limit is None else min(limit, self.left())
        try:
            await asyncio.wait_for(work, timeout)
        except TimeoutError:
            log.warning("drain.step_timeout", extra={"step": step, "timeout_s": round(timeout, 3)})
            return False
        except Exception:  # one failing step (a store already gone) must not keep the others from running
            log.exception("drain.step_failed", extra={"step": step})
            return False
        return True


async def quiesce(conns: Sequence[ChannelBase], seconds: float, failing: Callable[[], bool], clock: Clock) -> None:
    """Stop reading every client, then wait (at most `seconds` on `clock`, not while the store is `failing`) until
    what they already sent is stored and acknowledged: a publisher gets its PUBACK rather than sending it again
    elsewhere."""
    for conn in conns:
        conn.pause_publishes()
    until = clock.monotonic() + seconds
    waiting = [conn for conn in conns if conn.unacked_in > 0]
    while waiting and not failing() and clock.monotonic() < until:
        await asyncio.sleep(POLL_S)
        waiting = [conn for conn in waiting if conn.unacked_in > 0]


async def disconnect_all(conns: Sequence[ChannelBase], reason: int, properties: dict[int, Any] | None) -> None:
    """`conn.shutdown(reason, properties)` for each, `DISCONNECT_BATCH` per loop turn so that acks, the flush
    and other clients' traffic run between batches."""
    for start in range(0, len(conns), DISCONNECT_BATCH):
        for conn in conns[start:start + DISCONNECT_BATCH]:
            conn.shutdown(reason, properties)
        await asyncio.sleep(0)


async def wait_closed(connections: Sequence[_Closing], timeout: float, clock: Clock) -> int:
    """Until every connection is closing (the client closed after reading our last packet, or its close drain
    ran out) or `timeout` s on `clock`: our DISCONNECTs have left the process. Returns how many were still open."""
    deadline = clock.monotonic() + timeout
    open_ = [t for t in connections if not t.is_closing()]
    while open_ and clock.monotonic() < deadline:
        await asyncio.sleep(POLL_S)
        open_ = [t for t in open_ if not t.is_closing()]
    return len(open_)


async def drain(node: Node, listeners: Sequence[_Closable], backends: Sequence[_Stoppable],
                fabric: _Stoppable | None, store: _Store) -> None:
    """Steps 1 to 5 of the module docstring within `node.settings.drain_timeout`; logs drain.started/done."""
    settings = node.settings
    budget = Budget(settings.drain_timeout, node.clock)
    node.draining = True
    conns = list(node.connections.values())
    mqtt5 = sum(1 for conn in conns if conn.level >= 5)
    reason, properties = shutdown_disconnect(settings)
    log.info("drain.started", extra={"connections": len(conns), "mqtt5": mqtt5, "mqtt311": len(conns) - mqtt5,
                                     "backends": len(backends), "reason_code": hex(reason),
                                     "timeout_s": settings.drain_timeout})
    for listener in listeners:
        listener.close()
    cut: list[str] = []
    for backend in backends:  # each closes its listener first, then its connections; half of what is left
        name = type(backend).__name__
        if not await budget.run(f"stop {name}", backend.stop(), budget.left() / 2):
            cut.append(name)
    # Only our accept loops: a plain asyncio server's wait_closed also waits for its connections (closed below).
    loops = [lst.wait_closed() for lst in listeners if isinstance(lst, AcceptLoop)]
    if loops and not await budget.run("listeners", _gather(loops), budget.left() / 2):
        cut.append("listeners")
    reserve = min(_RESERVE_S, settings.drain_timeout * _RESERVE_SHARE)
    # The node keeps to its own timeout; should a step of it hang, it is cut with half the reserve still left.
    if not await budget.run("stop node", node.stop(reason, properties, timeout=max(0.0, budget.left() - reserve)),
                            budget.left() - reserve / 2):
        cut.append("node")
    for backend in backends:
        if isinstance(backend, _Finishing) and not await budget.run(f"finish {type(backend).__name__}",
                                                                    backend.finish(), budget.left() / 2):
            cut.append(type(backend).__name__)
    if fabric is not None and not await budget.run("leave cluster", fabric.stop(), budget.left() / 2):
        cut.append("cluster")
    if not await budget.run("close store", store.close()):
        cut.append("store")
    log.info("drain.done", extra={"connections": len(conns), "mqtt5": mqtt5, "mqtt311": len(conns) - mqtt5,
                                  "left_online": len(node.connections), "cut": ",".join(cut) or "none",
                                  "elapsed_ms": budget.elapsed_ms()})


async def _gather(waits: Sequence[Awaitable[None]]) -> None:
    await asyncio.gather(*waits)
