"""Where messages, offsets, sessions, retained and will messages live: the `Store` interface and its engines."""

from tidewire.store.base import Message, SessionRecord, Store, SubscriptionRecord, WillRecord

__all__ = ["Message", "SessionRecord", "Store", "SubscriptionRecord", "WillRecord"]
