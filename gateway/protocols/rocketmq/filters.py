"""RocketMQ subscription filters as message matchers: tag expressions (`*`, `a || b`) and a SQL92 subset over
user properties (the one RocketMQ documents for its SQL filter).

SQL: `=`, `<>`, `<`, `>`, `<=`, `>=`, `AND`, `OR`, `NOT`, `IS [NOT] NULL`, `[NOT] BETWEEN x AND y`,
`[NOT] IN ('a', 'b')`, parentheses, string literals ('it''s'), numbers, TRUE/FALSE. Property values are
strings: an ordering (`<`, `BETWEEN`) compares numbers, and a value that is not a number makes it unknown.
SQL's three-valued logic: a missing property makes a comparison unknown, and a message matches only when the
whole expression is true. Anything else is refused with a reason (`FilterError`), never an exception.
"""

from __future__ import annotations

from collections.abc import Callable

from tidewire.gateway.core.sql92 import FilterError, parse_sql
from tidewire.store.base import Message
from tidewire.store.properties import Properties

from .mapping import TAG_PROPERTY

TAG = 1  # definition_pb2.FilterType
SQL = 2
MAX_EXPRESSION = 4096  # characters

Matcher = Callable[[Message], bool]


def compile_filter(filter_type: int, expression: str) -> Matcher | FilterError | None:
    """A matcher for the expression; None when it matches every message."""
    if len(expression) > MAX_EXPRESSION:
        return FilterError(f"filter expression over {MAX_EXPRESSION} characters")
    if filter_type == SQL:
        parsed = parse_sql(expression)
        if isinstance(parsed, FilterError):
            return parsed
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
