"""The SQL92-subset evaluator (pure): predicates over named values, refused with a reason, never an exception."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tidewire.gateway.core.sql92 import FilterError, parse_sql


@given(st.text(max_size=200))
def test_never_raises(expression: str) -> None:
    parsed = parse_sql(expression)
    if not isinstance(parsed, FilterError):
        parsed({"a": "1"})
