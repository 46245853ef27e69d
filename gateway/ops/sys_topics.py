"""`$SYS` topics: client lifecycle events and periodic broker statistics, published as ordinary messages.

Events go to `$SYS/brokers/<node>/clients/<clientId>/<event>` with a JSON payload; statistics to
`$SYS/brokers/<node>/stats/...` (uptime included). Backend consumers subscribe like any topic;
`#` and `+` never match them (the `$` rule).

Events are published in one batch per loop tick, after the callbacks that made them (a CONNACK is never held up
by its event), and only those somebody can read (`audience`): in a connect storm nobody watches, an event would
otherwise cost more than the connect itself, and a new store queue per client. `activity` samples the log lines
of connects and disconnects. The node's counters (`Counters`), which the stats and `admin.metrics` read, are
kept here too.
"""

from __future__ import annotations

import asyncio
import heapq
import json
import logging
from bisect import bisect_left
from collections.abc import Callable, Sequence
from operator import itemgetter
from typing import Any

from tidewire.gateway.core.clock import SYSTEM_CLOCK, Clock
from tidewire.gateway.core.event_buffer import EventBuffer
from tidewire.gateway.ops.logs import Sampled
from tidewire.pipeline.lake.event_names import SUBSCRIBED, UNSUBSCRIBED
from tidewire.store.base import PROTOCOL_AMQP, PROTOCOL_NAMES, PROTOCOL_ROCKETMQ, SHARED_PREFIX, Claim, Message

EVENTS = ("connected", "disconnected", "subscribed", "unsubscribed", "takeover")
# Connect and disconnect lines: this many per second at info; past that, counted in a `clients.activity` line
ACTIVITY_LINES_PER_S = 10.0
ACTIVITY_LINES_BURST = 50
ACTIVITY_SUMMARY_S = 10.0

log = logging.getLogger("tidewire.conn")


# Counters.by_protocol: index = the message's `store.base.PROTOCOL_*` (the ingress it came by); "api", past the
# stored protocols, is the admin API's publishes (stored as MQTT messages, counted apart by `Counters.api_published`).
PROTOCOLS = (*PROTOCOL_NAMES, "api")
PROTOCOL_API = len(PROTOCOL_NAMES)
# Shown from start (0) by the metrics; "retained_quota": a retained publish over a `max_retained_*` cap;
# "queue_full": older messages of an offline session past `max_queued_messages` (gateway.sessions.backlog).
DROP_REASONS = ("store_unavailable", "expired", "too_large", "not_authorized", "retained_quota", "queue_full")
# Upper bounds (s) of the store latency histograms; a last bucket takes everything above.
LATENCY_BOUNDS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                  2.5, 5.0)
TOP_TOPICS_KEPT = 1000  # topics the tally keeps after a prune (it holds at most twice as many)
TOP_TOPICS_STRIDE = 16  # in a batch of at least this many messages one in this many is tallied, with this weight


class Latency:
    """A histogram of seconds with fixed buckets (`LATENCY_BOUNDS` and above): one `observe` per store call of a
    batch, read at scrape time. Plain ints, no lock: only the event loop writes it."""

    __slots__ = ("counts", "total")

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BOUNDS) + 1)
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(LATENCY_BOUNDS, seconds)] += 1  # bucket i holds values <= LATENCY_BOUNDS[i]
        self.total += seconds


class TopicTally:
    """Most published topics since start, estimated cheaply: a small batch is tallied whole, a large one (load) by
    every `TOP_TOPICS_STRIDE`-th message. Bounded: past 2 x `TOP_TOPICS_KEPT` topics only the most counted are kept
    (a topic that comes back starts again from 0, so a heavy one soon climbs back)."""

    __slots__ = ("_next", "counts")

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self._next = 0  # index of the next sampled message in the next large batch

    def add(self, batch: Sequence[Message]) -> None:
        counts = self.counts
        if len(batch) < TOP_TOPICS_STRIDE:
            for message in batch:
                counts[message.topic] = counts.get(message.topic, 0) + 1
        else:
            for message in batch[self._next::TOP_TOPICS_STRIDE]:
                counts[message.topic] = counts.get(message.topic, 0) + TOP_TOPICS_STRIDE
            self._next = (self._next - len(batch)) % TOP_TOPICS_STRIDE
        if len(counts) > 2 * TOP_TOPICS_KEPT:
            self.counts = dict(heapq.nlargest(TOP_TOPICS_KEPT, counts.items(), key=itemgetter(1)))

    def top(self, n: int) -> list[tuple[str, int]]:
        """The `n` most published topics (internal `$` topics left out) with their estimated counts."""
        return heapq.nlargest(n, ((t, c) for t, c in self.counts.items() if not t.startswith("$")),
                              key=itemgetter(1))


class Counters:
    """Counters of one node, read by `$SYS` stats and the metrics endpoint (`admin.metrics`). Plain ints updated
    once per batch (or per message where the path already touches it), never a lock: only the event loop writes.

    `messages_*`/`bytes_*` are totals over every protocol; `in_messages`/`in_bytes`/`out_messages`/`out_bytes`
    hold the non-MQTT protocols only (index `PROTOCOLS`), MQTT being the rest (`by_protocol`), so the common
    MQTT path adds nothing. Bytes in: payload bytes; bytes out: MQTT packet bytes written, payload bytes for
    other protocols. `enabled` False (setting `metrics`): what only the metrics endpoint reads is not kept."""

    __slots__ = ("append_seconds", "bytes_in", "bytes_out", "dropped", "drops", "enabled",
                 "fsync_seconds", "in_bytes", "in_messages", "messages_in", "messages_out", "out_bytes",
                 "out_messages", "retries", "sessions_evicted", "topics")

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.messages_in = 0
        self.bytes_in = 0
        self.messages_out = 0  # every message written to a receiver, retries included
        self.bytes_out = 0
        self.dropped = 0
        self.drops = dict.fromkeys(DROP_REASONS, 0)  # dropped, by reason
        self.sessions_evicted = 0  # offline sessions expired early over `max_stored_sessions`
        self.retries = 0  # of `messages_out`: sent again (MQTT DUP resends, AMQP/RocketMQ redeliveries)
        n = len(PROTOCOLS)
        self.in_messages = [0] * n
        self.in_bytes = [0] * n
        self.out_messages = [0] * n
        self.out_bytes = [0] * n
        self.append_seconds = Latency()  # one store.append of the publish pipeline
        self.fsync_seconds = Latency()  # one store.sync of the publish pipeline (a group-commit round)
        self.topics = TopicTally()

    def drop(self, reason: str, n: int = 1) -> None:
        """`n` messages will not reach a receiver (rare paths only): "store_unavailable", "expired", ..."""
        self.dropped += n
        self.drops[reason] = self.drops.get(reason, 0) + n

    def consumed(self, group: str, deliveries: Sequence[tuple[Message, Claim]]) -> None:
        """A consumer of `group` (an AMQP queue `amqp/...`, an MQTT `$share/...` group, else a RocketMQ group) was
        handed `deliveries` (one call per batch, `gateway.core.consumers`); a claim handed out before counts as a
        retry. An MQTT member counts the PUBLISH packets it writes itself (`count_out`): here only retries."""
        if group.startswith(SHARED_PREFIX):
            self.retries += sum(claim.deliveries > 1 for _, claim in deliveries)
            return
        protocol = PROTOCOL_AMQP if group.startswith("amqp/") else PROTOCOL_ROCKETMQ
        nbytes = retried = 0
        for message, claim in deliveries:
            nbytes += len(message.payload)
            retried += claim.deliveries > 1
        self.messages_out += len(deliveries)
        self.bytes_out += nbytes
        self.retries += retried
        self.out_messages[protocol] += len(deliveries)
        self.out_bytes[protocol] += nbytes

    def api_published(self, messages: int, nbytes: int) -> None:
        """Publishes of the admin API (already counted in `messages_in` by the node as MQTT messages)."""
        self.in_messages[PROTOCOL_API] += messages
        self.in_bytes[PROTOCOL_API] += nbytes

    def by_protocol(self) -> dict[str, tuple[int, int, int, int]]:
        """Protocol name -> (messages in, bytes in, messages out, bytes out)."""
        out = {name: (self.in_messages[i], self.in_bytes[i], self.out_messages[i], self.out_bytes[i])
               for i, name in enumerate(PROTOCOLS) if i}
        out["mqtt"] = (self.messages_in - sum(self.in_messages), self.bytes_in - sum(self.in_bytes),
                       self.messages_out - sum(self.out_messages), self.bytes_out - sum(self.out_bytes))
        return out


class SysTopics:
    def __init__(self, node_id: str, publish: Callable[[Message], None], enabled: bool = True,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self.prefix = f"$SYS/brokers/{node_id}"
        self._node = node_id
        self._publish = publish
        self.enabled = enabled
        self.clock = clock
        self.started_at = clock.time()
        self.events: EventBuffer | None = None
        # May anybody read a message of this topic, now or later? None: assume so (every event is published).
        self.audience: Callable[[str], bool] | None = None
        self.activity = Sampled(log, "clients.activity", rate=ACTIVITY_LINES_PER_S, burst=ACTIVITY_LINES_BURST,
                                interval=ACTIVITY_SUMMARY_S, clock=clock)  # what may be logged of (dis)connects
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
        now_ms = int(self.clock.time() * 1000)
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
        now_ms = int(self.clock.time() * 1000)
        values: dict[str, int | float] = {
            "messages/in": counters.messages_in, "messages/out": counters.messages_out,
            "bytes/in": counters.bytes_in, "bytes/out": counters.bytes_out,
            "messages/dropped": counters.dropped, **gauges,
        }
        for name, value in values.items():
            # retained, so a consumer that subscribes between two rounds sees the current value at once
            self._publish(Message(f"{self.prefix}/stats/{name}", str(value).encode(), 0, True, b"", now_ms))
        uptime = int(self.clock.time() - self.started_at)
        self._publish(Message(f"{self.prefix}/stats/uptime", str(uptime).encode(), 0, True, b"", now_ms))
