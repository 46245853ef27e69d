"""Whether a retained publish fits the retained caps: `max_retained_messages`, `max_retained_bytes` (of the whole
store) and `max_retained_payload` (of one message).

The node answers a PUBLISH before the store has set its retained entry, so it checks against its view of the
store's usage: what `Store.retained_usage` said after the node's last retained writes, plus what it admitted
and has not written yet (each counted as a new topic of its payload's size: a replacement is counted as if it
grew the store until the store's next answer says otherwise). So the caps hold for one node exactly, and for a
cluster within what the other nodes admit between two of this node's reads.

The policy, as Mosquitto's `max_queued_*` for a full queue: the newest is refused, nothing stored is dropped.
At a cap every retained publish with a payload is refused, a replacement of a topic already retained too (the
node cannot tell it from a new topic without a store read); an empty one (a delete) always passes and frees
room. Pure: the node feeds it the store's answers.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class RetainedQuota:
    """Caps (0: no cap) and the node's view of the store's retained usage."""

    max_messages: int = 0
    max_bytes: int = 0
    max_payload: int = 0
    count: int = 0  # as the store said last
    nbytes: int = 0
    admitted: int = 0  # retained publishes admitted since the store said so
    admitted_bytes: int = 0

    @property
    def capped(self) -> bool:
        return bool(self.max_messages or self.max_bytes or self.max_payload)

    def admit(self, payload_size: int) -> bool:
        """May a retained publish of `payload_size` bytes (> 0) be taken? If so it counts until `settled`."""
        if self.max_payload and payload_size > self.max_payload:
            return False
        if self.max_messages and self.count + self.admitted >= self.max_messages:
            return False
        if self.max_bytes and self.nbytes + self.admitted_bytes + payload_size > self.max_bytes:
            return False
        self.admitted += 1
        self.admitted_bytes += payload_size
        return True

    def landed(self, payload_size: int) -> None:
        """The store set a retained entry (one admitted, or one nothing asked about: a will, a `$SYS` topic)."""
        if payload_size:
            self.admitted = max(0, self.admitted - 1)
            self.admitted_bytes = max(0, self.admitted_bytes - payload_size)

    def settled(self, count: int, nbytes: int) -> None:
        """What `Store.retained_usage` answers after the node's retained writes so far (`landed`)."""
        self.count, self.nbytes = count, nbytes
