"""A SQL92 subset as predicates over named values (moved from the RocketMQ filters, which use it over user
properties): `=`, `<>`, `<`, `>`, `<=`, `>=`, `AND`, `OR`, `NOT`, `IS [NOT] NULL`, `[NOT] BETWEEN x AND y`,
`[NOT] IN ('a', 'b')`, parentheses, string literals ('it''s'), numbers, TRUE/FALSE. Anything else is refused with
a reason (`FilterError`), never an exception.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import NamedTuple

MAX_DEPTH = 32  # nesting of parentheses / NOT
MAX_IN_LIST = 256


class FilterError(NamedTuple):
    reason: str


Value = str | float | bool | None
Operand = Callable[[dict[str, str]], Value]
Predicate = Callable[[dict[str, str]], bool | None]

_TOKEN = re.compile(r"""
    \s*(?:
      (?P<string>'(?:[^']|'')*')
    | (?P<number>-?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)
    | (?P<op><>|<=|>=|!=|=|<|>|\(|\)|,)
    | (?P<word>[A-Za-z_$][A-Za-z0-9_.$]*)
    )""", re.VERBOSE)
_KEYWORDS = frozenset({"AND", "OR", "NOT", "IS", "NULL", "BETWEEN", "IN", "TRUE", "FALSE"})
_COMPARISONS = frozenset({"=", "<>", "!=", "<", ">", "<=", ">="})


class _Token(NamedTuple):
    kind: str  # string, number, op, word, keyword, end
    text: str


def _tokenize(text: str) -> list[_Token] | FilterError:
    tokens: list[_Token] = []
    pos = 0
    end = len(text.rstrip())
    while pos < end:
        match = _TOKEN.match(text, pos)
        if match is None or match.end() == pos:
            return FilterError(f"unexpected character at {pos}: {text[pos:pos + 10]!r}")
        kind = match.lastgroup or ""
        value = match.group(kind)
        if kind == "word" and value.upper() in _KEYWORDS:
            tokens.append(_Token("keyword", value.upper()))
        else:
            tokens.append(_Token(kind, value))
        pos = match.end()
    tokens.append(_Token("end", ""))
    return tokens


class _SqlError(Exception):
    """Internal to the parser: turned into a FilterError at its boundary."""


class _Parser:
    def __init__(self, tokens: list[_Token]) -> None:
        self.tokens = tokens
        self.pos = 0
        self.depth = 0

    def peek(self) -> _Token:
        return self.tokens[self.pos]

    def take(self) -> _Token:
        token = self.tokens[self.pos]
        if token.kind != "end":
            self.pos += 1
        return token

    def accept(self, kind: str, text: str) -> bool:
        token = self.peek()
        if token.kind == kind and token.text == text:
            self.pos += 1
            return True
        return False

    def expect(self, kind: str, text: str) -> None:
        if not self.accept(kind, text):
            raise _SqlError(f"expected {text!r} but found {self.peek().text or 'the end'!r}")

    def nested(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise _SqlError(f"expression nested deeper than {MAX_DEPTH}")

    def expression(self) -> Predicate:
        terms = [self.conjunction()]
        while self.accept("keyword", "OR"):
            terms.append(self.conjunction())
        return terms[0] if len(terms) == 1 else _any(terms)

    def conjunction(self) -> Predicate:
        terms = [self.negation()]
        while self.accept("keyword", "AND"):
            terms.append(self.negation())
        return terms[0] if len(terms) == 1 else _all(terms)

    def negation(self) -> Predicate:
        if self.accept("keyword", "NOT"):
            self.nested()
            inner = self.negation()
            self.depth -= 1
            return lambda props: None if (v := inner(props)) is None else not v
        return self.predicate()

    def predicate(self) -> Predicate:
        if self.accept("op", "("):
            self.nested()
            inner = self.expression()
            self.expect("op", ")")
            self.depth -= 1
            return inner
        token = self.peek()
        after = self.tokens[min(self.pos + 1, len(self.tokens) - 1)]
        if token.kind == "keyword" and token.text in ("TRUE", "FALSE") and not (
                after.kind == "op" and after.text in _COMPARISONS):
            self.take()
            flag = token.text == "TRUE"
            return lambda props: flag
        left = self.operand()
        token = self.peek()
        if token.kind == "op" and token.text in _COMPARISONS:
            self.take()
            return _comparison(token.text, left, self.operand())
        if self.accept("keyword", "IS"):
            negate = self.accept("keyword", "NOT")
            self.expect("keyword", "NULL")
            return (lambda props: left(props) is not None) if negate else (lambda props: left(props) is None)
        negate = self.accept("keyword", "NOT")
        if self.accept("keyword", "BETWEEN"):
            low = self.operand()
            self.expect("keyword", "AND")
            high = self.operand()
            test = _all([_comparison(">=", left, low), _comparison("<=", left, high)])
        elif self.accept("keyword", "IN"):
            test = self.membership(left)
        elif negate:
            raise _SqlError("NOT must be followed by BETWEEN or IN here")
        else:
            raise _SqlError(f"expected a comparison after an operand, found {token.text or 'the end'!r}")
        return (lambda props: None if (v := test(props)) is None else not v) if negate else test

    def membership(self, left: Operand) -> Predicate:
        self.expect("op", "(")
        values: list[Value] = []
        while True:
            token = self.take()
            if token.kind == "string":
                values.append(_unquote(token.text))
            elif token.kind == "number":
                values.append(float(token.text))
            else:
                raise _SqlError("IN takes a list of literals")
            if len(values) > MAX_IN_LIST:
                raise _SqlError(f"IN list longer than {MAX_IN_LIST}")
            if self.accept("op", ")"):
                break
            self.expect("op", ",")
        return _any([_comparison("=", left, _constant(value)) for value in values])

    def operand(self) -> Operand:
        token = self.take()
        if token.kind == "word":
            name = token.text
            return lambda props: props.get(name)
        if token.kind == "string":
            text = _unquote(token.text)
            return lambda props: text
        if token.kind == "number":
            number = float(token.text)
            return lambda props: number
        if token.kind == "keyword" and token.text in ("TRUE", "FALSE"):
            flag = token.text == "TRUE"
            return lambda props: flag
        raise _SqlError(f"expected a property, a literal or '(' but found {token.text or 'the end'!r}")


def parse_sql(expression: str) -> Predicate | FilterError:
    """The predicate of a SQL92-subset expression over user properties (True, False or None: unknown)."""
    if not expression.strip():
        return FilterError("empty SQL expression")
    tokens = _tokenize(expression)
    if isinstance(tokens, FilterError):
        return tokens
    parser = _Parser(tokens)
    try:
        predicate = parser.expression()
        if parser.peek().kind != "end":
            raise _SqlError(f"unexpected {parser.peek().text!r}")
    except _SqlError as exc:
        return FilterError(f"SQL filter: {exc}")
    return predicate


def _constant(value: Value) -> Operand:
    return lambda props: value


def _unquote(literal: str) -> str:
    return literal[1:-1].replace("''", "'")


def _any(terms: list[Predicate]) -> Predicate:
    def test(props: dict[str, str]) -> bool | None:
        unknown = False
        for term in terms:
            value = term(props)
            if value:
                return True
            unknown = unknown or value is None
        return None if unknown else False

    return test


def _all(terms: list[Predicate]) -> Predicate:
    def test(props: dict[str, str]) -> bool | None:
        unknown = False
        for term in terms:
            value = term(props)
            if value is False:
                return False
            unknown = unknown or value is None
        return None if unknown else True

    return test


def _number(value: Value) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, float):
        return value
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def _comparison(op: str, left: Operand, right: Operand) -> Predicate:
    def test(props: dict[str, str]) -> bool | None:
        a, b = left(props), right(props)
        if a is None or b is None:
            return None
        if isinstance(a, bool) or isinstance(b, bool):  # TRUE/FALSE against a property's "true"/"false"
            if op not in ("=", "<>", "!="):
                return None
            same = str(a).lower() == str(b).lower()
            return same if op == "=" else not same
        if isinstance(a, str) and isinstance(b, str):  # strings compare for equality only, as in RocketMQ
            if op == "=":
                return a == b
            return a != b if op in ("<>", "!=") else None
        x, y = _number(a), _number(b)
        if x is None or y is None:
            return None
        if op == "=":
            return x == y
        if op in ("<>", "!="):
            return x != y
        if op == "<":
            return x < y
        if op == ">":
            return x > y
        return x <= y if op == "<=" else x >= y

    return test
