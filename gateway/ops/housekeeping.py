"""The node's periodic chores: `$SYS` stats, offsets of idle sessions, session expiry and eviction over
`max_stored_sessions`, letting go of offline sessions' wildcard filters nobody holds any more, store retention, the
retained bytes of tenants with a cap."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from tidewire.gateway.core.retry import Backoff, stop_if_cancelled
from tidewire.gateway.core.tenants import measure_retained
from tidewire.store.base import P2P_PREFIX

if TYPE_CHECKING:
    from tidewire.gateway.node import Node

log = logging.getLogger("tidewire.node")

RETENTION_INTERVAL = 60.0  # s between retention passes
EXPIRE_BATCH = 1000  # sessions expired per tick at most: a backlog drains over the next ticks
EVICT_CONCURRENCY = 64  # sessions evicted at once (each is a few store round trips)
EVICT_HORIZON_MS = 2**62  # "due" by then: every session that expires at all, soonest first


async def housekeeping_loop(node: Node) -> None:
    clock = node.clock
    retention_due = 0.0
    filters_due = clock.monotonic() + node.settings.stored_filters_check_interval
    stats_due = clock.monotonic() + node.settings.sys_interval
    tenants_due = 0.0  # measured at once: the caps hold from the first publishes
    retry = Backoff("housekeeping", clock, node.store_health)  # about every second: how an idle node notices
    while True:
        # Wake for the stats when they are due: a fixed 1 s nap that wakes a hair early skips a whole period.
        await asyncio.sleep(max(0.01, min(1.0, stats_due - clock.monotonic())))
        interval = node.settings.sys_interval
        if clock.monotonic() >= stats_due - 0.005:
            stats_due = max(stats_due + interval, clock.monotonic() + interval / 2)
            node.sys.stats(node.counters, gauges(node))
        node.offsets_due()
        try:
            await expire_sessions(node)
            await evict_sessions(node)
            if clock.monotonic() >= filters_due:
                filters_due = clock.monotonic() + node.settings.stored_filters_check_interval
                await node.subscriptions.wildcards.prune_stored()
            if clock.monotonic() >= retention_due:
                enforce = getattr(node.store, "enforce_retention", None)
                if enforce is not None:
                    await enforce()
                retention_due = clock.monotonic() + RETENTION_INTERVAL
            if clock.monotonic() >= tenants_due:
                tenants_due = clock.monotonic() + node.settings.tenant_measure_interval
                for tenant in node.tenants.all():
                    if tenant.limits.max_retained_bytes:
                        await measure_retained(node.store, tenant)
        except Exception as exc:  # tried again on the next tick; the nap above is the backoff
            stop_if_cancelled()
            retry.failed(exc)
            continue
        retry.succeeded()


async def expire_sessions(node: Node) -> None:
    """Drop stored sessions whose client stayed away past their expiry interval (the store's expiry index)."""
    now = int(node.clock.time() * 1000)
    for client_id in await node.store.due_sessions(now, EXPIRE_BATCH):
        if client_id in node.connections:
            continue
        await node.writes.session_settled(client_id)  # the record saved at its disconnect, not an older one
        record = await node.store.get_session(client_id)
        if record is not None and node.sessions.expired(record, now):
            await node.sessions.drop_stored(record, record.epoch)  # not if a node claimed it since it was read
            log.info("session.expired", extra={"client_id": client_id})


async def evict_sessions(node: Node) -> None:
    """Over `max_stored_sessions`, expire early the offline sessions nearest their expiry (the same index, read
    past now); a session that never expires is never evicted."""
    cap = node.settings.max_stored_sessions
    if cap <= 0:
        return
    excess = await node.store.session_count() - cap
    if excess <= 0:
        return
    due = await node.store.due_sessions(EVICT_HORIZON_MS, min(excess, EXPIRE_BATCH))
    for i in range(0, len(due), EVICT_CONCURRENCY):  # a flood of new sessions outpaces one store round trip each
        await asyncio.gather(*(_evict(node, client_id, cap) for client_id in due[i : i + EVICT_CONCURRENCY]))


async def _evict(node: Node, client_id: str, cap: int) -> None:
    if client_id in node.connections:
        return
    await node.writes.session_settled(client_id)  # the record saved at its disconnect, not an older one
    record = await node.store.get_session(client_id)
    if record is not None and record.disconnected_at_ms:
        await node.sessions.drop_stored(record, record.epoch)  # not if a node claimed it since it was read
        node.counters.sessions_evicted += 1
        log.info("session.evicted", extra={"client_id": client_id, "max_stored_sessions": cap})


def gauges(node: Node) -> dict[str, int]:
    """The node's current levels for `$SYS/brokers/<node>/stats/...` (counters are kept by the node)."""
    subscriptions = node.subscriptions
    return {"clients/connected": len(node.connections),
            "subscriptions/count": sum(1 for conn in node.connections.values() if conn.session is not None
                                       for f in conn.session.subscriptions if not f.startswith(P2P_PREFIX)),
            "queues/local": len(subscriptions.readers),
            "queues/wildcard": len(subscriptions.wildcards),
            "shared/groups": len(subscriptions.groups),
            **node.topology.gauges(), **lake_gauges(node)}


def lake_gauges(node: Node) -> dict[str, int]:
    """The lake's event buffer (`--lake` only): `lake/events/recorded`, `lake/events/dropped/<reason>`."""
    events = node.events
    if events is None:
        return {}
    return {"lake/events/recorded": events.recorded,
            **{f"lake/events/dropped/{reason}": count for reason, count in events.losses().items()}}
