"""Lookup: where clients are and which nodes subscribe to which queues, so notify can be targeted.

The cluster issue adds a sharded in-memory KV across nodes behind the same interface; its answers are hints
rebuilt from live connections, and `None` ("don't know") makes notify fall back to broadcast.
"""

from tidewire.lookup.base import InProcessLookup, Lookup

__all__ = ["InProcessLookup", "Lookup"]
