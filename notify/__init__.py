"""Notify: after an append, tell the nodes with subscribers which queues have news (names only, merged)."""

from tidewire.notify.base import LocalNotifier, Notifier, NotifyHandler

__all__ = ["LocalNotifier", "Notifier", "NotifyHandler"]
