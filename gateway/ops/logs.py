"""Structured logs: one line per event, `logfmt` (key=value) or JSON, on stderr; events that can come in storms
(connects) get a line each only up to a rate, and are counted in one summary line per interval (`Sampled`)."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from typing import Any

from tidewire.gateway.core.clock import SYSTEM_CLOCK, Clock
from tidewire.gateway.transport.ratelimit import TokenBucket

_RESERVED = frozenset(vars(logging.makeLogRecord({})))


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _RESERVED and not k.startswith("_")}


def _quote(value: Any) -> str:
    text = str(value)
    if not text or any(c in text for c in ' "=\n'):
        return json.dumps(text)
    return text


class LogfmtFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        parts = [f"ts={ts}.{int(record.msecs):03d}Z", f"level={record.levelname.lower()}",
                 f"logger={record.name}", f"event={_quote(record.getMessage())}"]
        parts += [f"{k}={_quote(v)}" for k, v in _fields(record).items()]
        if record.exc_info:
            parts.append(f"exc={_quote(self.formatException(record.exc_info))}")
        return " ".join(parts)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {"ts": record.created, "level": record.levelname.lower(),
                               "logger": record.name, "event": record.getMessage()}
        out.update(_fields(record))
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def setup_logging(level: str = "info", fmt: str = "logfmt") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else LogfmtFormatter())
    root = logging.getLogger("tidewire")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False


class Sampled:
    """Lines of frequent events (connects, disconnects) at info up to `rate` per second (`burst` at once); past
    that, an event is only counted, and one line per `interval` in which any went unlogged gives the counts:
    `event=clients.activity connected=20391 disconnected=20388 unlogged=40655 interval_s=10`. A connect storm
    would otherwise be a log storm, and cost more in formatting than the connects themselves."""

    __slots__ = ("_bucket", "_clock", "_counts", "_event", "_handle", "_interval", "_logger", "_unlogged")

    def __init__(self, logger: logging.Logger, event: str, *, rate: float, burst: float, interval: float,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self._logger = logger
        self._event = event
        self._interval = interval
        self._clock = clock
        self._bucket = TokenBucket(rate, burst, clock.monotonic())
        self._counts: dict[str, int] = {}
        self._unlogged = 0
        self._handle: asyncio.TimerHandle | None = None

    def line(self, name: str) -> bool:
        """Count one `name` event: True if its own line may be logged at info now. The summary interval starts
        with the first event that may not, and counts every event until it ends."""
        if not self._logger.isEnabledFor(logging.INFO):
            return False
        allowed = self._bucket.take(self._clock.monotonic())
        if self._handle is None:
            if allowed:
                return True
            self._handle = asyncio.get_running_loop().call_later(self._interval, self.flush)
        counts = self._counts
        counts[name] = counts.get(name, 0) + 1
        if not allowed:
            self._unlogged += 1
        return allowed

    def flush(self) -> None:
        """Log the summary of the current interval now (if anything went unlogged in it)."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        counts, self._counts = self._counts, {}
        unlogged, self._unlogged = self._unlogged, 0
        if unlogged:
            self._logger.info(self._event, extra={**counts, "unlogged": unlogged, "interval_s": self._interval})
