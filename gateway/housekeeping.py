"""The node's periodic chores: `$SYS` stats, offsets of idle sessions, session expiry, store retention."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from gateway.retry import Backoff, stop_if_cancelled

if TYPE_CHECKING:
    from gateway.node import Node

RETENTION_INTERVAL = 60.0  # s between retention passes


async def housekeeping_loop(node: Node) -> None:
    retention_due = 0.0
    stats_due = time.monotonic() + node.settings.sys_interval
    retry = Backoff("housekeeping")
    while True:
        # Wake for the stats when they are due: a fixed 1 s nap that wakes a hair early skips a whole period.
        await asyncio.sleep(max(0.01, min(1.0, stats_due - time.monotonic())))
        interval = node.settings.sys_interval
        if time.monotonic() >= stats_due - 0.005:
            stats_due = max(stats_due + interval, time.monotonic() + interval / 2)
            node.sys.stats(node.counters, node.gauges())
        node.offsets_due()
        try:
            await node.expire_sessions()
            if time.monotonic() >= retention_due:
                enforce = getattr(node.store, "enforce_retention", None)
                if enforce is not None:
                    await enforce()
                retention_due = time.monotonic() + RETENTION_INTERVAL
        except Exception as exc:  # tried again on the next tick; the nap above is the backoff
            stop_if_cancelled()
            retry.failed(exc)
            continue
        retry.succeeded()
