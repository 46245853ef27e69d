"""Structured logs: one line per event, `logfmt` (key=value) or JSON, on stderr."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

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
