"""Queue cache: the newest messages of hot queues, so one pull from the store serves every local subscriber."""

from tidewire.cache.queue_cache import QueueCache

__all__ = ["QueueCache"]
