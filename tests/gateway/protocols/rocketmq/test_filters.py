"""Tag and SQL92-subset filters as matchers of stored messages (pure, no gateway)."""

from __future__ import annotations

import pytest

from tidewire.gateway.core.ingress import neutral_message
from tidewire.gateway.protocols.rocketmq.filters import SQL, TAG, FilterError, compile_filter, parse_tags
from tidewire.store.base import Message
from tidewire.store.properties import Properties


def msg(**user: str) -> Message:
    return neutral_message("t/x", b"p", properties=Properties(user=list(user.items())), now_ms=1)


def matches(filter_type: int, expression: str, message: Message) -> bool:
    matcher = compile_filter(filter_type, expression)
    assert not isinstance(matcher, FilterError), matcher
    return matcher is None or matcher(message)


def test_tags() -> None:
    assert parse_tags("*") is None and parse_tags("") is None and parse_tags(" a || * ") is None
    assert parse_tags("a || b ||c") == {"a", "b", "c"}
    assert matches(TAG, "a || b", msg(TAGS="b"))
    assert not matches(TAG, "a || b", msg(TAGS="c"))
    assert not matches(TAG, "a", msg())  # no tag: only `*` takes it
    assert matches(TAG, "*", msg())
    assert matches(0, "a", msg(TAGS="a"))  # type unspecified: a tag expression


@pytest.mark.parametrize(("expression", "props", "expected"), [
    ("a = 'x'", {"a": "x"}, True),
    ("a = 'x'", {"a": "y"}, False),
    ("a <> 'x'", {"a": "y"}, True),
    ("a <> 'x'", {}, False),  # unknown is not true
    ("NOT (a = 'x')", {}, False),  # NOT unknown is unknown
    ("a > 5", {"a": "10"}, True),
    ("a > 5", {"a": "5"}, False),
    ("a >= 5 AND a <= 5.0", {"a": "5"}, True),
    ("a < -1.5e1", {"a": "-20"}, True),
    ("a > 5", {"a": "ten"}, False),  # not a number: unknown
    ("a < 'b'", {"a": "a"}, False),  # strings only compare for equality
    ("a BETWEEN 1 AND 3", {"a": "2"}, True),
    ("a NOT BETWEEN 1 AND 3", {"a": "2"}, False),
    ("a NOT BETWEEN 1 AND 3", {"a": "7"}, True),
    ("a IN ('x', 'y')", {"a": "y"}, True),
    ("a NOT IN ('x', 'y')", {"a": "z"}, True),
    ("a NOT IN ('x', 'y')", {}, False),
    ("a IS NULL", {}, True),
    ("a IS NOT NULL", {"a": ""}, True),
    ("a = 'x' OR b = 'y'", {"b": "y"}, True),
    ("a = 'x' OR b = 'y'", {}, False),
    ("a = 'x' AND (b = 'y' OR c > 1)", {"a": "x", "c": "2"}, True),
    ("a = 'x' and not b is null", {"a": "x", "b": "1"}, True),  # keywords in any case
    ("s = 'it''s'", {"s": "it's"}, True),
    ("TRUE", {}, True),
    ("FALSE OR a = 'x'", {"a": "x"}, True),
    ("flag = TRUE", {"flag": "true"}, True),
    ("TAGS = 'tg'", {"TAGS": "tg"}, True),  # the tag is a property too, as in RocketMQ
])
def test_sql(expression: str, props: dict[str, str], expected: bool) -> None:
    assert matches(SQL, expression, msg(**props)) is expected


@pytest.mark.parametrize("expression", [
    "", "a", "a =", "a = 'x' AND", "(a = 'x'", "a = 'x')", "a LIKE 'x%'", "a IN ()", "a IN (b)",
    "a NOT = 1", "a = 'unterminated", "a ~ 1", "a IS 1", "a BETWEEN 1 OR 2", "(" * 40 + "a = 1" + ")" * 40,
])
def test_sql_refused_with_a_reason(expression: str) -> None:
    refused = compile_filter(SQL, expression)
    assert isinstance(refused, FilterError) and refused.reason


def test_limits() -> None:
    assert isinstance(compile_filter(SQL, "a = 1 OR " * 1000 + "a = 1"), FilterError)  # over 4096 characters
    assert isinstance(compile_filter(SQL, "a IN (" + ", ".join(["'x'"] * 300) + ")"), FilterError)
    assert isinstance(compile_filter(7, "a"), FilterError)
