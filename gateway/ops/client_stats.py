"""One client's counters, sans-IO: messages and bytes in and out, drops, resends, and how long it takes to
acknowledge what it is sent (count, mean, EWMA, max and a log-scale histogram for percentiles). Plain ints and
floats on the client's session (`Session.stats`), bumped where the packets are read and written; the admin API
reads them (admin/api_trace.py) and `gateway.ops.slow_subscribers` ranks them.
"""

from __future__ import annotations

from typing import Any

EWMA_WEIGHT = 0.2  # of the newest ack time in the moving average: about the last ten acks count
# Ack-time histogram: bucket 0 holds < 1 ms, bucket i holds [2^(i-1), 2^i) ms, the last one everything above.
BUCKETS = 24


class ClientStats:
    """`bytes_in`: PUBLISH payload bytes received; `bytes_out`: bytes of the PUBLISH packets written (as the node's
    own counters). `drops`: messages of this client refused or skipped (ACL, retained quota, expired, too large
    for it). `retries`: PUBLISH packets sent again (DUP). The ack time of a delivery runs from its PUBLISH
    written to its PUBACK (QoS 1) or PUBREC (QoS 2), in seconds."""

    __slots__ = ("ack_buckets", "ack_ewma", "ack_max", "ack_total", "acks", "bytes_in", "bytes_out", "drops",
                 "messages_in", "messages_out", "retries")

    def __init__(self) -> None:
        self.messages_in = 0
        self.bytes_in = 0
        self.messages_out = 0
        self.bytes_out = 0
        self.drops = 0
        self.retries = 0
        self.acks = 0
        self.ack_total = 0.0
        self.ack_ewma = 0.0
        self.ack_max = 0.0
        self.ack_buckets: list[int] | None = None  # made on the first ack (most clients publish only)

    def acked(self, seconds: float) -> None:
        """One delivery acknowledged `seconds` after it was written (on every PUBACK: kept to a few operations;
        never negative: the ack's read time against its PUBLISH's write time)."""
        self.acks += 1
        self.ack_total += seconds
        if self.ack_buckets is None:  # the first ack
            self.ack_buckets = [0] * BUCKETS
            self.ack_ewma = seconds
        else:
            self.ack_ewma += EWMA_WEIGHT * (seconds - self.ack_ewma)
        if seconds > self.ack_max:
            self.ack_max = seconds
        index = int(seconds * 1000).bit_length()
        self.ack_buckets[index if index < BUCKETS else -1] += 1

    def ack_percentile(self, fraction: float) -> float:
        """The ack time (s) under which `fraction` of the acks fell, as its bucket's upper bound (within a factor
        of two of the truth, never above the max seen); 0.0 without acks."""
        buckets = self.ack_buckets
        if buckets is None or not self.acks:
            return 0.0
        wanted = max(1, -(-int(fraction * self.acks * 1000) // 1000))
        seen = 0
        for index, count in enumerate(buckets):
            seen += count
            if seen >= wanted:
                return min((1 << index) / 1000, self.ack_max)
        return self.ack_max

    def as_dict(self) -> dict[str, Any]:
        mean = self.ack_total / self.acks if self.acks else 0.0
        return {"messages_in": self.messages_in, "bytes_in": self.bytes_in, "messages_out": self.messages_out,
                "bytes_out": self.bytes_out, "drops": self.drops, "retries": self.retries, "acks": self.acks,
                "ack_mean_ms": round(mean * 1000, 3), "ack_ewma_ms": round(self.ack_ewma * 1000, 3),
                "ack_max_ms": round(self.ack_max * 1000, 3),
                "ack_p50_ms": round(self.ack_percentile(0.5) * 1000, 3),
                "ack_p99_ms": round(self.ack_percentile(0.99) * 1000, 3)}
