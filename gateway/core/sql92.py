"""A SQL92 subset as three-valued predicates over named values: the condition language of RocketMQ's SQL filters
(over a message's user properties) and of the rules' WHERE (over a message's topic, client and JSON payload).

`=`, `<>` (`!=`), `<`, `>`, `<=`, `>=`, `AND`, `OR`, `NOT`, `IS [NOT] NULL`, `[NOT] BETWEEN x AND y`,
`[NOT] IN ('a', 1)`, parentheses, string literals ('it''s'), numbers, TRUE/FALSE; keywords in any case.

A value (`Value`) is a string, a number, a boolean or None (absent, or JSON's null). Comparisons:

- number against number: numerically (integers exactly);
- string against number: the string read as a number (RocketMQ's properties are all strings, so `level > 5`
  reads "9" as 9); a string that is not a number makes the comparison unknown;
- string against string: equality only; an ordering between two strings is unknown (as in RocketMQ);
- TRUE/FALSE: equality only, against a boolean or the strings "true"/"false" in any case.

SQL's three-valued logic: an absent value makes a comparison unknown, NOT unknown is unknown, and a predicate
holds only when the whole expression is true (callers test `is True`). Anything else is refused with a reason and
the character offset it points at (`SqlError`), never an exception; an expression is bounded in length
(`MAX_EXPRESSION`), nesting (`MAX_DEPTH`) and IN lists (`MAX_IN_LIST`).

A language built on the subset (`Dialect`) chooses how a name is written (plain: `a.b$c`; the rules: paths such
as `payload."a-b"[1]`), adds keywords and punctuation of its own, tokenizes its whole statement (`tokenize`) and
hands the condition's tokens to `parse_condition`, with a hook that checks or rewrites each name.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

MAX_EXPRESSION = 4096  # characters
MAX_DEPTH = 32  # nesting of parentheses / NOT
MAX_IN_LIST = 256

Value = str | float | int | bool | None
Values = Mapping[str, Value]
Operand = Callable[[Values], Value]
Predicate = Callable[[Values], bool | None]


class SqlError(NamedTuple):
    """Why an expression is refused, and the character offset (0-based) it points at."""

    reason: str
    position: int


# A name as written -> the key to look it up by, or why it is refused (`position`: an offset inside the name).
NameHook = Callable[[str], str | SqlError]

_KEYWORDS = frozenset({"AND", "OR", "NOT", "IS", "NULL", "BETWEEN", "IN", "TRUE", "FALSE"})
_OPERATORS = ("<>", "<=", ">=", "!=", "=", "<", ">", "(", ")", ",")
_COMPARISONS = frozenset({"=", "<>", "!=", "<", ">", "<=", ">="})


@dataclass(frozen=True)
class Dialect:
    """The lexical choices of a language built on the subset: how a name is written (a regular expression, no
    groups of its own), and keywords and punctuation it adds. Its tokens come out of `tokenize`."""

    name: str = r"[A-Za-z_$][A-Za-z0-9_.$]*"
    keywords: frozenset[str] = frozenset()
    operators: tuple[str, ...] = ()
    token: re.Pattern[str] = field(init=False, repr=False, compare=False)
    all_keywords: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Longest operators first, so `<=` is never read as `<` then `=`.
        operators = sorted({*_OPERATORS, *self.operators}, key=len, reverse=True)
        pattern = (r"\s*(?:(?P<string>'(?:[^']|'')*')"
                   r"|(?P<number>-?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)"
                   f"|(?P<op>{'|'.join(re.escape(op) for op in operators)})"
                   f"|(?P<word>{self.name}))")
        object.__setattr__(self, "token", re.compile(pattern))
        object.__setattr__(self, "all_keywords", _KEYWORDS | {k.upper() for k in self.keywords})


PLAIN = Dialect()  # names as RocketMQ's properties are written


class Token(NamedTuple):
    kind: str  # string, number, op, word, keyword, end
    text: str  # keywords upper-cased; strings with their quotes
    position: int


def tokenize(text: str, dialect: Dialect = PLAIN) -> list[Token] | SqlError:
    """The tokens of `text`, ending with an `end` token."""
    tokens: list[Token] = []
    pos = 0
    end = len(text.rstrip())
    while pos < end:
        match = dialect.token.match(text, pos)
        if match is None or match.end() == pos:
            at = pos + len(text[pos:]) - len(text[pos:].lstrip())
            return SqlError(f"unexpected character {text[at:at + 10]!r}", at)
        kind = match.lastgroup or ""
        value = match.group(kind)
        start = match.start(kind)
        if kind == "word" and value.upper() in dialect.all_keywords:
            tokens.append(Token("keyword", value.upper(), start))
        else:
            tokens.append(Token(kind, value, start))
        pos = match.end()
    tokens.append(Token("end", "", len(text)))
    return tokens


def parse_sql(expression: str, dialect: Dialect = PLAIN, names: NameHook | None = None) -> Predicate | SqlError:
    """The predicate of a whole expression (True, False or None: unknown)."""
    if len(expression) > MAX_EXPRESSION:
        return SqlError(f"expression over {MAX_EXPRESSION} characters", MAX_EXPRESSION)
    if not expression.strip():
        return SqlError("empty SQL expression", 0)
    tokens = tokenize(expression, dialect)
    if isinstance(tokens, SqlError):
        return tokens
    return parse_condition(tokens, 0, names)


def parse_condition(tokens: Sequence[Token], start: int, names: NameHook | None = None) -> Predicate | SqlError:
    """The predicate of `tokens[start:]`, which must run to the `end` token (as `tokenize` leaves it); `names`
    maps each name to the key it is looked up by (unchanged when None)."""
    parser = _Parser(tokens, start, names)
    try:
        predicate = parser.expression()
        if parser.peek().kind != "end":
            raise _Refused(f"unexpected {parser.peek().text!r}", parser.peek().position)
    except _Refused as refused:
        return SqlError(*refused.args)
    return predicate


class _Refused(Exception):
    """Internal to the parser (reason, position): turned into an SqlError at its boundary."""


def _found(token: Token) -> str:
    return repr(token.text) if token.kind != "end" else "the end"


class TokenCursor:
    """A position in a token list ending with an `end` token: what a recursive-descent parser reads with (this
    module's condition parser, the rule engine's statement parser)."""

    def __init__(self, tokens: Sequence[Token], start: int = 0) -> None:
        self.tokens = tokens
        self.pos = start

    def peek(self) -> Token:
        return self.tokens[self.pos]

    def take(self) -> Token:
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


class _Parser(TokenCursor):
    def __init__(self, tokens: Sequence[Token], start: int, names: NameHook | None) -> None:
        super().__init__(tokens, start)
        self.depth = 0
        self.names = names

    def expect(self, kind: str, text: str) -> None:
        if not self.accept(kind, text):
            raise _Refused(f"expected {text!r} but found {_found(self.peek())}", self.peek().position)

    def nested(self, token: Token) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise _Refused(f"expression nested deeper than {MAX_DEPTH}", token.position)

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
        token = self.peek()
        if self.accept("keyword", "NOT"):
            self.nested(token)
            inner = self.negation()
            self.depth -= 1
            return lambda values: None if (v := inner(values)) is None else not v
        return self.predicate()

    def predicate(self) -> Predicate:
        token = self.peek()
        if self.accept("op", "("):
            self.nested(token)
            inner = self.expression()
            self.expect("op", ")")
            self.depth -= 1
            return inner
        after = self.tokens[min(self.pos + 1, len(self.tokens) - 1)]
        if token.kind == "keyword" and token.text in ("TRUE", "FALSE") and not (
                after.kind == "op" and after.text in _COMPARISONS):
            self.take()
            flag = token.text == "TRUE"
            return lambda values: flag
        left = self.operand()
        token = self.peek()
        if token.kind == "op" and token.text in _COMPARISONS:
            self.take()
            return _comparison(token.text, left, self.operand())
        if self.accept("keyword", "IS"):
            negate = self.accept("keyword", "NOT")
            self.expect("keyword", "NULL")
            if negate:
                return lambda values: left(values) is not None
            return lambda values: left(values) is None
        negate = self.accept("keyword", "NOT")
        if self.accept("keyword", "BETWEEN"):
            low = self.operand()
            self.expect("keyword", "AND")
            high = self.operand()
            test = _all([_comparison(">=", left, low), _comparison("<=", left, high)])
        elif self.accept("keyword", "IN"):
            test = self.membership(left)
        elif negate:
            raise _Refused("NOT must be followed by BETWEEN or IN here", token.position)
        else:
            raise _Refused(f"expected a comparison after an operand, found {_found(token)}", token.position)
        return (lambda values: None if (v := test(values)) is None else not v) if negate else test

    def membership(self, left: Operand) -> Predicate:
        self.expect("op", "(")
        listed: list[Value] = []
        while True:
            token = self.take()
            if token.kind == "string":
                listed.append(_unquote(token.text))
            elif token.kind == "number":
                listed.append(_number_literal(token.text))
            else:
                raise _Refused("IN takes a list of literals", token.position)
            if len(listed) > MAX_IN_LIST:
                raise _Refused(f"IN list longer than {MAX_IN_LIST}", token.position)
            if self.accept("op", ")"):
                break
            self.expect("op", ",")
        return _any([_comparison("=", left, _constant(value)) for value in listed])

    def operand(self) -> Operand:
        token = self.take()
        if token.kind == "word":
            key = token.text
            if self.names is not None:
                named = self.names(key)
                if isinstance(named, SqlError):
                    raise _Refused(named.reason, token.position + named.position)
                key = named
            return lambda values: values.get(key)
        if token.kind == "string":
            return _constant(_unquote(token.text))
        if token.kind == "number":
            return _constant(_number_literal(token.text))
        if token.kind == "keyword" and token.text in ("TRUE", "FALSE"):
            return _constant(token.text == "TRUE")
        raise _Refused(f"expected a name, a literal or '(' but found {_found(token)}", token.position)


def _constant(value: Value) -> Operand:
    return lambda values: value


def _unquote(literal: str) -> str:
    return literal[1:-1].replace("''", "'")


def _number_literal(text: str) -> int | float:
    # An integer literal stays an int: a JSON integer past 2**53 compares exactly.
    if text.lstrip("-").isdigit():
        try:
            return int(text)
        except ValueError:  # past Python's digit limit for int(str)
            pass
    return float(text)


def _any(terms: list[Predicate]) -> Predicate:
    def test(values: Values) -> bool | None:
        unknown = False
        for term in terms:
            value = term(values)
            if value:
                return True
            unknown = unknown or value is None
        return None if unknown else False

    return test


def _all(terms: list[Predicate]) -> Predicate:
    def test(values: Values) -> bool | None:
        unknown = False
        for term in terms:
            value = term(values)
            if value is False:
                return False
            unknown = unknown or value is None
        return None if unknown else True

    return test


def _number(value: Value) -> int | float | None:
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return value
    try:
        return int(value)
    except ValueError:
        pass
    try:
        return float(value)
    except ValueError:
        return None


def _comparison(op: str, left: Operand, right: Operand) -> Predicate:
    def test(values: Values) -> bool | None:
        a, b = left(values), right(values)
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
