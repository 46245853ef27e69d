"""Headers-exchange matching, as RabbitMQ's `rabbit_exchange_type_headers` does it.

A binding's arguments are the pattern: `x-match` is `all` (the default), `any`, `all-with-x` or `any-with-x`.
Under `all`/`any` pattern keys starting with `x-` play no part; the `-with-x` kinds match them too. A pattern
value of void (None) asks only that the header be there; any other value must equal the header's, compared as
Erlang's `==` compares AMQP values as RabbitMQ reads them: integers and floats by value whatever their width
(an int 5 matches a float 5.0), strings and byte arrays by their bytes, booleans only booleans, decimals only
decimals, and never across those kinds (an int 5 header does not match a string "5" binding). A pattern with
nothing to match is matched by `all` and never by `any`.
"""

from __future__ import annotations

import datetime
import decimal
from collections.abc import Mapping
from typing import Any

MATCH_KINDS = ("all", "any", "all-with-x", "any-with-x")


def binding_problem(arguments: Mapping[str, Any]) -> str | None:
    """Why a headers binding's arguments are refused (RabbitMQ's text), or None."""
    kind = arguments.get("x-match")
    if kind is None:
        return None
    if not isinstance(kind, str):
        return f"Invalid x-match field type {_type_name(kind)} (value {str(kind)[:40]}); expected longstr"
    if kind not in MATCH_KINDS:
        return f"Invalid x-match field value {kind[:40]!r}; expected all, any, all-with-x, or any-with-x"
    return None


def headers_match(pattern: Mapping[str, Any], headers: Mapping[str, Any]) -> bool:
    kind = pattern.get("x-match")
    if kind not in MATCH_KINDS:
        kind = "all"  # (RabbitMQ: a legacy binding's unknown value reads as all)
    every = kind.startswith("all")
    with_x = kind.endswith("-with-x")
    for key, wanted in pattern.items():
        if key == "x-match" or (key.startswith("x-") and not with_x):
            continue
        matched = key in headers and (wanted is None or same_value(wanted, headers[key]))
        if matched and not every:
            return True
        if not matched and every:
            return False
    return every


def same_value(a: Any, b: Any) -> bool:
    """Equal as AMQP field values (see the module docstring)."""
    ka, kb = _kind(a), _kind(b)
    if ka != kb:
        return False
    if ka == "bytes":
        return _bytes(a) == _bytes(b)
    return bool(a == b)


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, decimal.Decimal):
        return "decimal"  # (RabbitMQ's {decimal, Scale, Value}: equal to no integer)
    if isinstance(value, str | bytes | bytearray):
        return "bytes"
    if isinstance(value, datetime.datetime):
        return "timestamp"
    if isinstance(value, dict):
        return "table"
    if isinstance(value, list):
        return "array"
    return "void" if value is None else type(value).__name__


def _bytes(value: str | bytes | bytearray) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


def _type_name(value: Any) -> str:
    return {"bool": "bool", "number": "long", "decimal": "decimal", "bytes": "binary", "timestamp": "timestamp",
            "table": "table", "array": "array", "void": "void"}.get(_kind(value), "unknown")
