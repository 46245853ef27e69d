"""Queue.Declare's `x-` arguments, as RabbitMQ reads them: what a queue does with old, surplus and refused messages.

`x-expires`, `x-message-ttl`, `x-dead-letter-exchange` / `x-dead-letter-routing-key`, `x-max-length`,
`x-max-length-bytes`, `x-overflow` (`drop-head`, `reject-publish`, `reject-publish-dlx`) and
`x-consumer-timeout`. They are kept in the queue's `GroupRecord.attrs` under the names of `ATTRS`, and a
redeclaration with other values is refused (406 inequivalent arg), as RabbitMQ refuses it. Other arguments
(x-queue-type, x-max-priority, ...) are accepted and ignored.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

OVERFLOWS = ("drop-head", "reject-publish", "reject-publish-dlx")


@dataclass(frozen=True, slots=True)
class QueueArgs:
    expires_ms: int | None = None
    ttl_ms: int | None = None
    dlx: str | None = None  # the dead-letter exchange ("" is the default exchange)
    dlrk: str | None = None  # the dead-letter routing key (None: the message's own)
    max_length: int | None = None  # ready messages
    max_length_bytes: int | None = None  # bodies of the ready messages
    overflow: str = "drop-head"
    consumer_timeout_ms: int | None = None  # None: the node's `consumer_timeout`

    @property
    def limited(self) -> bool:
        return self.max_length is not None or self.max_length_bytes is not None

    def attrs(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def of(cls, attrs: dict[str, Any]) -> QueueArgs:
        """The arguments kept in a queue's attrs (a queue declared before a field existed reads its default)."""
        values = {f.name: attrs.get(f.name, f.default) for f in dataclasses.fields(cls)}
        return cls(**values)


ATTRS = tuple(f.name for f in dataclasses.fields(QueueArgs))
# The argument each field comes from, for the 406 texts.
ARGUMENT_NAMES = {"expires_ms": "x-expires", "ttl_ms": "x-message-ttl", "dlx": "x-dead-letter-exchange",
                  "dlrk": "x-dead-letter-routing-key", "max_length": "x-max-length",
                  "max_length_bytes": "x-max-length-bytes", "overflow": "x-overflow",
                  "consumer_timeout_ms": "x-consumer-timeout"}


class _Invalid(Exception):
    pass


def _int(arguments: dict[str, Any], name: str, minimum: int) -> int | None:
    value = arguments.get(name)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise _Invalid(f"invalid arg '{name}': {str(value)[:20]}")
    return value


def _str(arguments: dict[str, Any], name: str) -> str | None:
    value = arguments.get(name)
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if value is not None and not isinstance(value, str):
        raise _Invalid(f"invalid arg '{name}': {str(value)[:20]}")
    return value


def parse_arguments(arguments: Any) -> QueueArgs | str:
    """The queue's arguments, or why they are invalid (a 406 text)."""
    if not isinstance(arguments, dict):
        return QueueArgs()
    try:
        overflow = _str(arguments, "x-overflow")
        if overflow is not None and overflow not in OVERFLOWS:
            raise _Invalid(f"invalid arg 'x-overflow': {overflow[:30]}")
        args = QueueArgs(expires_ms=_int(arguments, "x-expires", 1), ttl_ms=_int(arguments, "x-message-ttl", 0),
                         dlx=_str(arguments, "x-dead-letter-exchange"),
                         dlrk=_str(arguments, "x-dead-letter-routing-key"),
                         max_length=_int(arguments, "x-max-length", 0),
                         max_length_bytes=_int(arguments, "x-max-length-bytes", 0),
                         overflow=overflow or "drop-head",
                         consumer_timeout_ms=_int(arguments, "x-consumer-timeout", 1))
    except _Invalid as exc:
        return str(exc)
    if args.dlrk is not None and args.dlx is None:
        return "invalid arg 'x-dead-letter-routing-key': x-dead-letter-exchange is not set"
    return args


def show(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "none" if value is None else str(value)
