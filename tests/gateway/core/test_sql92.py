"""The SQL92-subset evaluator (pure): three-valued predicates over named values of any `Value` type, refused
with a reason and a position, never an exception. RocketMQ's use of it (strings only) is
`tests/gateway/protocols/rocketmq/test_filters.py`."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidewire.gateway.core.sql92 import (
    MAX_DEPTH,
    MAX_EXPRESSION,
    MAX_IN_LIST,
    Dialect,
    SqlError,
    Value,
    parse_condition,
    parse_sql,
    tokenize,
)


def holds(expression: str, values: Mapping[str, Value]) -> bool | None:
    predicate = parse_sql(expression)
    assert not isinstance(predicate, SqlError), predicate
    return predicate(values)


@pytest.mark.parametrize(("expression", "values", "expected"), [
    ("a = 10", {"a": 10}, True),
    ("a > 9", {"a": 10}, True),  # numbers compare as numbers, not as text ("10" < "9")
    ("a < 9.5", {"a": 9}, True),
    ("a = 10", {"a": 10.0}, True),
    ("a = '10'", {"a": 10}, True),  # a string against a number is read as a number
    ("a = 10", {"a": "10"}, True),
    ("a > 5", {"a": "ten"}, None),  # not a number: unknown
    ("a = 'x'", {"a": 1}, None),
    ("a = 9007199254740993", {"a": 9007199254740993}, True),  # past 2**53: integers compare exactly
    ("a = 9007199254740992", {"a": 9007199254740993}, False),
    ("a BETWEEN 1 AND 3", {"a": 2}, True),
    ("a IN (1, 2)", {"a": 2}, True),
    ("a IN ('x', 2)", {"a": "x"}, True),
    ("a = TRUE", {"a": True}, True),
    ("a = FALSE", {"a": True}, False),
    ("a <> TRUE", {"a": False}, True),
    ("a = TRUE", {"a": "true"}, True),  # RocketMQ's "true" property
    ("a = TRUE", {"a": 1}, False),  # a number is not a boolean
    ("a > TRUE", {"a": True}, None),  # booleans have no order
    ("a < 'b'", {"a": "a"}, None),  # nor have strings
    ("a = b", {"a": 3, "b": "3"}, True),
    ("a IS NULL", {"a": None}, True),  # JSON's null is NULL
    ("a IS NULL", {}, True),
    ("a IS NOT NULL", {"a": 0}, True),
    ("a = 1", {}, None),
    ("NOT a = 1", {}, None),  # NOT unknown is unknown
    ("a = 1 OR TRUE", {}, True),  # unknown OR true is true
    ("a = 1 AND FALSE", {}, False),  # unknown AND false is false
    ("a = 1 AND TRUE", {}, None),
    ("a = 1 OR FALSE", {}, None),
    ("a NOT IN (1, 2)", {}, None),
    ("a NOT BETWEEN 1 AND 2", {"a": 3}, True),
])
def test_typed_values(expression: str, values: dict[str, Value], expected: bool | None) -> None:
    assert holds(expression, values) is expected


@pytest.mark.parametrize(("expression", "position"), [
    ("", 0),
    ("a = 'x' AND", 11),  # the end
    ("a = 'x' ~ b", 8),
    ("(a = 1", 6),
    ("a LIKE 'x%'", 2),
    ("a IN (b)", 6),
    ("a NOT = 1", 2),
    ("a = 1)", 5),
    ("   @", 3),
])
def test_refused_with_a_reason_and_a_position(expression: str, position: int) -> None:
    refused = parse_sql(expression)
    assert isinstance(refused, SqlError) and refused.reason
    assert refused.position == position, refused


def test_limits() -> None:
    assert parse_sql("a = 1 OR " * 1000 + "a = 1") == SqlError(f"expression over {MAX_EXPRESSION} characters",
                                                               MAX_EXPRESSION)
    nested = "(" * (MAX_DEPTH + 1) + "a = 1" + ")" * (MAX_DEPTH + 1)
    assert isinstance(parse_sql(nested), SqlError)
    assert not isinstance(parse_sql("(" * MAX_DEPTH + "a = 1" + ")" * MAX_DEPTH), SqlError)
    assert isinstance(parse_sql("NOT " * (MAX_DEPTH + 1) + "a = 1"), SqlError)
    too_long = parse_sql("a IN (" + ", ".join(["1"] * (MAX_IN_LIST + 1)) + ")")
    assert isinstance(too_long, SqlError) and "IN list" in too_long.reason
    assert not isinstance(parse_sql("a IN (" + ", ".join(["1"] * MAX_IN_LIST) + ")"), SqlError)


def test_a_dialect_and_its_names() -> None:
    """A language on the subset: its own name syntax, keywords and punctuation, and a hook over the names."""
    dialect = Dialect(name=r"[A-Za-z]+(?:#[a-z]+)*", keywords=frozenset({"check"}), operators=("*",))
    tokens = tokenize("CHECK * a#b = 1", dialect)
    assert not isinstance(tokens, SqlError)
    assert [(t.kind, t.text, t.position) for t in tokens] == [
        ("keyword", "CHECK", 0), ("op", "*", 6), ("word", "a#b", 8), ("op", "=", 12), ("number", "1", 14),
        ("end", "", 15)]

    def names(name: str) -> str | SqlError:
        return SqlError("no such name", 2) if name.startswith("zz") else name.replace("#", ".")

    predicate = parse_condition(tokens, 2, names)
    assert not isinstance(predicate, SqlError)
    assert predicate({"a.b": 1}) is True and predicate({"a#b": 1}) is None
    other = tokenize("CHECK zzz = 1", dialect)
    assert not isinstance(other, SqlError)
    refused = parse_condition(other, 1, names)
    assert refused == SqlError("no such name", 8)  # the hook's offset inside the name, from the name's start
    assert isinstance(parse_condition(tokens, 1, names), SqlError)  # '*' is no operand


@given(st.text(max_size=200))
def test_never_raises(expression: str) -> None:
    parsed = parse_sql(expression)
    if not isinstance(parsed, SqlError):
        parsed({"a": "1"})
        parsed({"a": 1.5, "b": None, "c": True})


@given(st.lists(st.sampled_from(["a", "b", "=", "<>", "<", ">=", "1", "-2.5", "'x'", "TRUE", "NULL", "IS", "NOT",
                                 "AND", "OR", "(", ")", "IN", "BETWEEN", ","]), max_size=30),
       st.dictionaries(st.sampled_from(["a", "b"]),
                       st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=5)))
def test_never_raises_on_near_misses(words: list[str], values: dict[str, Value]) -> None:
    parsed = parse_sql(" ".join(words))
    if not isinstance(parsed, SqlError):
        assert parsed(values) in (True, False, None)
