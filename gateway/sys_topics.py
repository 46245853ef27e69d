"""`$SYS` topics: client lifecycle events and periodic broker statistics, published as ordinary messages.

Events go to `$SYS/brokers/<node>/clients/<clientId>/<event>` with a JSON payload; statistics to
`$SYS/brokers/<node>/stats/...` (uptime included). Backend consumers subscribe like any topic;
`#` and `+` never match them (the `$` rule).

Events are published in one batch per loop tick, after the callbacks that made them (a CONNACK is never held up
by its event), and only those somebody can read (`audience`): in a connect storm nobody watches, an event would
otherwise cost more than the connect itself, and a new store queue per client. `activity` samples the log lines
of connects and disconnects.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import Any

from gateway.events import SUBSCRIBED, UNSUBSCRIBED, EventBuffer
from gateway.logs import Sampled
from store.base import Message

EVENTS = ("connected", "disconnected", "subscribed", "unsubscribed", "takeover")
# Connect and disconnect lines: this many per second at info; past that, counted in a `clients.activity` line
ACTIVITY_LINES_PER_S = 10.0
ACTIVITY_LINES_BURST = 50
ACTIVITY_SUMMARY_S = 10.0

log = logging.getLogger("tidewire.conn")


class Counters:
    """Message and byte counters of one node (plain ints: updated once per batch, not per message)."""

    __slots__ = ("bytes_in", "bytes_out", "dropped", "messages_in", "messages_out")

    def __init__(self) -> None:
        self.messages_in = 0
        self.bytes_in = 0
        self.messages_out = 0
        self.bytes_out = 0
        self.dropped = 0


class SysTopics:
    def __init__(self, node_id: str, publish: Callable[[Message], None], enabled: bool = True) -> None:
        self.prefix = f"$SYS/brokers/{node_id}"
        self._node = node_id
        self._publish = publish
        self.enabled = enabled
        self.started_at = time.time()
        self.events: EventBuffer | None = None
        # May anybody read a message of this topic, now or later? None: assume so (every event is published).
        self.audience: Callable[[str], bool] | None = None
        self.activity = Sampled(log, "clients.activity", rate=ACTIVITY_LINES_PER_S, burst=ACTIVITY_LINES_BURST,
                                interval=ACTIVITY_SUMMARY_S)  # what may be logged of connects and disconnects
        self._pending: list[tuple[str, str, int, dict[str, Any]]] = []  # (client id, event, ms, fields)

    @staticmethod
    def _record(events: EventBuffer, now_ms: int, client_id: str, event: str, fields: dict[str, Any]) -> None:
        if event == "takeover":
            return  # the old connection's "disconnected" (reason: session taken over) follows at once
        if event in (SUBSCRIBED, UNSUBSCRIBED):
            qos = fields.get("qos")
            granted = qos if isinstance(qos, int) and qos < 0x80 else None
            events.add(event, now_ms, client_id, "mqtt", fields.get("topic"), None, granted,
                       reason=None if granted is not None or qos is None else f"0x{qos:02x}")
        else:
            events.add(event, now_ms, client_id, "mqtt", reason=fields.get("reason"),
                       detail=fields.get("username") or fields.get("address"))

    def event(self, client_id: str, event: str, **fields: Any) -> None:
        """A client lifecycle event: published under $SYS (if enabled and read by anybody) with the next batch,
        and recorded for the lake (if set)."""
        now_ms = int(time.time() * 1000)
        if self.events is not None:
            self._record(self.events, now_ms, client_id, event, fields)
        if not self.enabled:
            return
        if not self._pending:
            asyncio.get_running_loop().call_soon(self.flush)
        self._pending.append((client_id, event, now_ms, fields))

    def flush(self) -> None:
        """Publish the events made since the last batch."""
        pending, self._pending = self._pending, []
        audience = self.audience
        for client_id, event, now_ms, fields in pending:
            topic = f"{self.prefix}/clients/{client_id}/{event}"
            if audience is not None and not audience(topic):
                continue
            body = {"clientid": client_id, "event": event, "ts": now_ms, "node": self._node, **fields}
            self._publish(Message(topic, json.dumps(body).encode(), 0, False, b"", now_ms))

    def stats(self, counters: Counters, gauges: dict[str, int]) -> None:
        if not self.enabled:
            return
        now_ms = int(time.time() * 1000)
        values: dict[str, int | float] = {
            "messages/in": counters.messages_in, "messages/out": counters.messages_out,
            "bytes/in": counters.bytes_in, "bytes/out": counters.bytes_out,
            "messages/dropped": counters.dropped, **gauges,
        }
        for name, value in values.items():
            # retained, so a consumer that subscribes between two rounds sees the current value at once
            self._publish(Message(f"{self.prefix}/stats/{name}", str(value).encode(), 0, True, b"", now_ms))
        uptime = int(time.time() - self.started_at)
        self._publish(Message(f"{self.prefix}/stats/uptime", str(uptime).encode(), 0, True, b"", now_ms))
