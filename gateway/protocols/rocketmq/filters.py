"""RocketMQ subscription filters as message matchers: tag expressions (`*`, `a || b`) and a SQL92 subset over
user properties (the one RocketMQ documents for its SQL filter).

SQL: the subset of `tidewire.gateway.core.sql92` with plain names (`a.b`), over the message's user properties.
Property values are strings: an ordering (`<`, `BETWEEN`) compares numbers, and a value that is not a number
makes it unknown. SQL's three-valued logic: a missing property makes a comparison unknown, and a message matches
only when the whole expression is true. Anything else is refused with a reason (`FilterError`), never an
exception.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from tidewire.gateway.core.sql92 import MAX_EXPRESSION, SqlError, parse_sql
from tidewire.store.base import Message
from tidewire.store.properties import Properties

from .mapping import TAG_PROPERTY

TAG = 1  # definition_pb2.FilterType
SQL = 2

Matcher = Callable[[Message], bool]


class FilterError(NamedTuple):
    reason: str


def compile_filter(filter_type: int, expression: str) -> Matcher | FilterError | None:
    """A matcher for the expression; None when it matches every message."""
    if len(expression) > MAX_EXPRESSION:
        return FilterError(f"filter expression over {MAX_EXPRESSION} characters")
    if filter_type == SQL:
        parsed = parse_sql(expression)
        if isinstance(parsed, SqlError):
            return FilterError(f"SQL filter: {parsed.reason} (at character {parsed.position})")
        return lambda message: parsed(_user_properties(message)) is True
    if filter_type not in (0, TAG):
        return FilterError("unknown filter type")
    tags = parse_tags(expression)
    if tags is None:
        return None
    return lambda message: _user_properties(message).get(TAG_PROPERTY) in tags


def parse_tags(expression: str) -> frozenset[str] | None:
    """The tags of `a || b`; None for every tag (`*` or empty)."""
    tags = frozenset(t.strip() for t in expression.split("||")) - {""}
    return None if not tags or "*" in tags else tags


def _user_properties(message: Message) -> dict[str, str]:
    return dict(Properties.from_block(message.properties).user)
