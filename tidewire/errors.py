"""Every error Tidewire raises on purpose descends from `TidewireError`; the same condition raises the same class
whichever engine, protocol or command meets it (as redis-py's `exceptions.py`).

    TidewireError
    ├── ConfigError          a setting or a configured file cannot be used          (also a ValueError)
    ├── StartupError         the node cannot start: a busy port, an unreachable store, a missing extra
    │   └── MissingExtra     an optional part asked for without its extra installed
    ├── StoreError           the store
    │   ├── StoreUnavailable     cannot serve now (Redis down or read-only); retry    (also a ConnectionError)
    │   ├── StoreClosed          a call on a store that is not open                   (also a RuntimeError)
    │   ├── StaleWildcards       an append indexed with an older wildcard set: re-index, append again
    │   └── CorruptData          a record, file or index that does not check out       (also a ValueError)
    ├── ProtocolError        a peer broke its protocol (MQTT: the reason code to answer with)
    ├── PublishFailed        a publish that was not stored
    └── ClusterError         another node answered with an error, or holds this node's id

The builtin second bases keep `except ValueError` / `except OSError` callers working. Defined here, in a module
with no imports, so every package (the store and a Spark driver included) can raise and catch them.
"""

from __future__ import annotations


class TidewireError(Exception):
    """The root: catch this to catch anything Tidewire raises on purpose."""


class ConfigError(TidewireError, ValueError):
    """A setting or a configured file (password file, keys, certificate, ACL) cannot be used."""


class StartupError(TidewireError):
    """The node cannot start; the message says why (a refusal to serve with less than was asked for)."""


class MissingExtra(StartupError):
    """A part the settings or the command ask for needs an extra that is not installed."""

    def __init__(self, extra: str, what: str, missing: list[str]) -> None:
        super().__init__(f"{what} needs tidewire[{extra}] (missing: {', '.join(missing)}): "
                         f"pip install 'tidewire[{extra}]'")
        self.extra = extra


class StoreError(TidewireError):
    """The store failed a call."""


class StoreUnavailable(StoreError, ConnectionError):
    """The store cannot serve now (not reachable, or not taking writes); the call may be retried later."""


class StoreClosed(StoreError, RuntimeError):
    """A call on a store that is not open (before `open()` or after `close()`), in every engine."""


class StaleWildcards(StoreError):
    """`append` was indexed with an older wildcard set than the store's: refresh with `wildcards()`, re-index
    the batch, append again. Nothing of the refused batch was stored."""


class CorruptData(StoreError, ValueError):
    """A record, file or index that does not check out (torn write, damage, an unknown format)."""


class ProtocolError(TidewireError):
    """A peer broke its protocol; `reason_code` is what to answer with (MQTT reason codes)."""

    def __init__(self, reason_code: int, message: str) -> None:
        super().__init__(f"{message} (reason code 0x{reason_code:02X})")
        self.reason_code = reason_code
        self.message = message


class PublishFailed(TidewireError):
    """The message was not stored."""


class ClusterError(TidewireError):
    """Another node answered a call with an error, or the cluster refused this node."""
