"""The rule language: a statement in EMQX's form compiled to a `RuleQuery` that tests a stored message and shapes it.

    SELECT <fields> FROM "<filter>"[, "<filter>" ...] [WHERE <condition>]

Keywords in any case. A statement is at most `MAX_STATEMENT` characters; one that cannot be used is refused with a
reason and the character offset it points at (`RuleError`), never an exception.

Fields (paths), the same in SELECT and WHERE:

    topic               the topic name
    topic.N             its N-th level, counted from 1 (absent past the last level)
    clientid            the publisher's client id ("" for a message the gateway made itself)
    qos, retain         0-2, true/false
    timestamp           when the message was stored, ms since the epoch
    payload             the payload: its JSON value when it is JSON, else its text when it is UTF-8, else its
                        base64; `payload_encoding` says which ("json", "text", "base64")
    payload.a.b         a JSON path: object members, `payload."a-b"` for a name that is not an identifier,
                        `payload.items[1]` for an array element counted from 1 as in EMQX (`[-1]`: the last)
    user.<name>         an MQTT 5 user property (`user."content-type"`; the last one of a repeated name)

A payload is parsed as JSON only when it is UTF-8 and at most `max_payload` bytes (default `MAX_PAYLOAD`, 1 MiB),
and holds no NaN or infinity; otherwise it is not JSON (its `payload.x` paths are absent, and `payload` is its text
or base64). A path that is absent is NULL in WHERE and null in the projection.

SELECT: `*` (topic, clientid, qos, retain, timestamp, payload), or a comma-separated list of `<path> [AS <name>]`,
which may include `*`. Without AS a field is named after the path's last name (`payload.a.b` -> `b`,
`payload.items[1]` -> `items`, `topic.2` -> `topic`, `user.kind` -> `kind`); two fields of one name are refused.

FROM: MQTT topic filters in double (or single) quotes.

WHERE: the SQL92 subset of `tidewire.gateway.core.sql92` over the paths (`payload.temp > 30 AND clientid <> 'x'`,
`user.kind IN ('a', 'b')`, `payload.ok = TRUE`, `payload.x IS NULL`), or over a name given with AS (as in EMQX;
a path wins over a name). A JSON number compares as a number, a JSON object or array as its compact JSON text
(`{"a":1}`). A message matches only when the condition is true: unknown (an absent path) is not a match.
"""

from __future__ import annotations

import base64
import functools
import json
import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from tidewire.gateway.core.sql92 import (
    Dialect,
    Predicate,
    SqlError,
    Token,
    TokenCursor,
    Value,
    Values,
    parse_condition,
    tokenize,
)
from tidewire.gateway.core.topics import valid_topic_filter
from tidewire.store.base import SHARED_PREFIX, Message
from tidewire.store.properties import Properties

MAX_STATEMENT = 8192  # characters
MAX_PAYLOAD = 1 << 20  # bytes: a larger payload is not parsed as JSON
MAX_INDEX_DIGITS = 9  # `[N]` and `topic.N`

STAR = ("topic", "clientid", "qos", "retain", "timestamp", "payload")
ROOTS = (*STAR, "payload_encoding", "user")
_FIELDS = ROOTS[:-1]  # the keys of a view besides its user properties

_IDENTIFIER = r"[A-Za-z_$][A-Za-z0-9_$]*"
_QUOTED = r'"(?:[^"]|"")*"'
_SEGMENT = rf"(?:{_IDENTIFIER}|{_QUOTED})"
RULES = Dialect(name=rf"{_SEGMENT}(?:\.(?:{_SEGMENT}|[0-9]+)|\[-?[0-9]+\])*",
                keywords=frozenset({"SELECT", "FROM", "WHERE", "AS"}), operators=("*",))
_FIRST = re.compile(rf"(?P<name>{_IDENTIFIER})|\"(?P<quoted>(?:[^\"]|\"\")*)\"")
_STEP = re.compile(rf"\.(?:(?P<name>{_IDENTIFIER})|\"(?P<quoted>(?:[^\"]|\"\")*)\"|(?P<digits>[0-9]+))"
                   r"|\[(?P<index>-?[0-9]+)\]")
_NOT_COMPUTED: Any = object()


class RuleError(NamedTuple):
    """Why a statement is refused, and the character offset (0-based) it points at."""

    reason: str
    position: int


class Path(NamedTuple):
    """A checked field: its root (one of `ROOTS`) and steps, object members (str) or array elements and topic
    levels (int, counted from 1; negative from the end)."""

    root: str
    steps: tuple[str | int, ...] = ()

    def default_name(self) -> str:
        return next((s for s in reversed(self.steps) if isinstance(s, str)), self.root)


@functools.lru_cache(maxsize=4096)  # a pure function of the text: WHERE asks for the same few paths per message
def parse_path(text: str) -> Path | SqlError:
    """The checked path of a field as written (`payload."a-b"[1]`); refusals point inside `text`."""
    first = _FIRST.match(text)
    if first is None:
        return SqlError(f"expected a field but found {text[:20]!r}", 0)
    root = _segment(first)
    raw: list[tuple[str, str, int]] = []  # (kind, text, offset)
    pos = first.end()
    while pos < len(text):
        step = _STEP.match(text, pos)
        if step is None:
            return SqlError(f"unexpected {text[pos:pos + 10]!r} in a field", pos)
        kind = step.lastgroup or ""
        raw.append((kind, _segment(step) if kind in ("name", "quoted") else step.group(kind), pos))
        pos = step.end()
    return _check(root, raw)


def _segment(match: re.Match[str]) -> str:
    quoted = match.group("quoted")
    return quoted.replace('""', '"') if quoted is not None else match.group("name")


def _check(root: str, raw: list[tuple[str, str, int]]) -> Path | SqlError:
    if root not in ROOTS:
        return SqlError(f"unknown field {root!r} (fields: {', '.join(ROOTS)})", 0)
    if root == "topic":
        if not raw:
            return Path(root)
        kind, digits, at = raw[0]
        if len(raw) > 1 or kind != "digits":
            return SqlError("topic takes one level number: topic.N", at)
        if len(digits) > MAX_INDEX_DIGITS or int(digits) < 1:
            return SqlError("topic levels count from 1", at)
        return Path(root, (int(digits),))
    if root == "user":
        if len(raw) != 1 or raw[0][0] == "index":
            return SqlError("a user property is named: user.<name>", raw[0][2] if raw else len(root))
        return Path(root, (raw[0][1],))
    if root != "payload":
        if raw:
            return SqlError(f"{root} has no fields", raw[0][2])
        return Path(root)
    steps: list[str | int] = []
    for kind, step, at in raw:
        if kind != "index":
            steps.append(step)
            continue
        if len(step.lstrip("-")) > MAX_INDEX_DIGITS:
            return SqlError("array index out of range", at)
        if int(step) == 0:
            return SqlError("array elements count from 1 ([-1]: the last)", at)
        steps.append(int(step))
    return Path(root, tuple(steps))


class Variables(Values):
    """One message as the rule language sees it, each part decoded at most once: the payload's text and JSON
    value, the user properties, and each WHERE value. Every valid path is a key (None when absent)."""

    __slots__ = ("_document", "_text", "_user", "_values", "max_payload", "message")

    def __init__(self, message: Message, max_payload: int = MAX_PAYLOAD) -> None:
        self.message = message
        self.max_payload = max_payload
        self._text: str | None = _NOT_COMPUTED
        self._document: tuple[bool, Any] = _NOT_COMPUTED  # (is JSON, value)
        self._user: dict[str, str] | None = None
        self._values: dict[str, Value] = {}

    def text(self) -> str | None:
        """The payload as UTF-8 text; None when it is not UTF-8."""
        if self._text is _NOT_COMPUTED:
            try:
                self._text = self.message.payload.decode("utf-8")
            except UnicodeDecodeError:
                self._text = None
        return self._text

    def document(self) -> tuple[bool, Any]:
        """(True, the payload's JSON value), or (False, None) when it is not JSON or over `max_payload`."""
        if self._document is _NOT_COMPUTED:
            self._document = (False, None)
            if len(self.message.payload) <= self.max_payload and (text := self.text()) is not None:
                try:
                    self._document = (True, json.loads(text, parse_constant=_no_constant, parse_float=_finite))
                except (ValueError, RecursionError):  # not JSON, or nested past the interpreter's limit
                    pass
        return self._document

    def payload(self) -> tuple[str, Any]:
        """(payload_encoding, payload)."""
        is_json, value = self.document()
        if is_json:
            return "json", value
        text = self.text()
        if text is not None:
            return "text", text
        return "base64", base64.b64encode(self.message.payload).decode("ascii")

    def user(self) -> dict[str, str]:
        if self._user is None:
            self._user = dict(Properties.from_block(self.message.properties).user)
        return self._user

    def field(self, path: Path) -> Any:
        """The path's JSON value (an object or array as it is); None when absent."""
        message = self.message
        root, steps = path
        if root == "topic":
            if not steps:
                return message.topic
            levels = message.topic.split("/")
            return levels[steps[0] - 1] if isinstance(steps[0], int) and steps[0] <= len(levels) else None
        if root == "payload":
            if not steps:
                return self.payload()[1]
            is_json, value = self.document()
            return _walk(value, steps) if is_json else None
        if root == "user":
            return self.user().get(str(steps[0]))
        if root == "clientid":
            return message.publisher
        if root == "qos":
            return message.qos
        if root == "retain":
            return bool(message.retain)
        if root == "timestamp":
            return message.timestamp_ms
        if root == "payload_encoding":
            return self.payload()[0]
        return None

    def __getitem__(self, key: str) -> Value:
        """The WHERE value of the path written `key`: a scalar, or an object or array as its compact JSON text."""
        if key in self._values:
            return self._values[key]
        path = parse_path(key)
        if isinstance(path, SqlError):
            raise KeyError(key)
        value = self._values[key] = _scalar(self.field(path))
        return value

    def __iter__(self) -> Iterator[str]:
        yield from _FIELDS
        yield from (f'user."{name.replace(chr(34), chr(34) * 2)}"' for name in self.user())

    def __len__(self) -> int:
        return len(_FIELDS) + len(self.user())


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):  # 1e999: a float JSON cannot carry back out
        raise ValueError("number out of range")
    return number


def _walk(value: Any, steps: Sequence[str | int]) -> Any:
    for step in steps:
        if isinstance(step, str):
            if not isinstance(value, dict):
                return None
            value = value.get(step)
        else:
            if not isinstance(value, list):
                return None
            index = step - 1 if step > 0 else len(value) + step
            if not 0 <= index < len(value):
                return None
            value = value[index]
    return value


def _scalar(value: Any) -> Value:
    if value is None or isinstance(value, str | int | float | bool):
        return value
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    except (ValueError, RecursionError):
        return None


@dataclass(eq=False)
class RuleQuery:
    """A compiled statement. `select` holds (path as written, output name) pairs, None for `*`; `where` is None
    when every message of the filters matches. `matches` and `project` take a message or its `Variables`; given
    the same message object twice in a row they share one view (one JSON parse), which the query keeps."""

    filters: list[str]
    select: list[tuple[str, str]] | None
    where: Predicate | None
    max_payload: int = MAX_PAYLOAD
    _fields: list[tuple[str, Path]] = field(init=False, repr=False)
    _recent: Variables | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        fields = [(name, name) for name in STAR] if self.select is None else self.select
        self._fields = []
        for written, name in fields:
            path = parse_path(written)
            if isinstance(path, SqlError):
                raise ValueError(f"field {written!r}: {path.reason}")
            self._fields.append((name, path))

    def variables(self, message: Message | Variables) -> Variables:
        if isinstance(message, Variables):
            return message
        recent = self._recent
        if recent is None or recent.message is not message:
            recent = self._recent = Variables(message, self.max_payload)
        return recent

    def matches(self, message: Message | Variables) -> bool:
        """The WHERE: True only when the condition is true of the message."""
        return self.where is None or self.where(self.variables(message)) is True

    def project(self, message: Message | Variables) -> dict[str, Any]:
        """The selected fields as JSON values, in the order of the SELECT."""
        view = self.variables(message)
        return {name: view.field(path) for name, path in self._fields}


def compile_rule(text: str, *, max_payload: int = MAX_PAYLOAD) -> RuleQuery | RuleError:
    """The query of a statement, or why it is refused."""
    if len(text) > MAX_STATEMENT:
        return RuleError(f"statement over {MAX_STATEMENT} characters", MAX_STATEMENT)
    tokens = tokenize(text, RULES)
    if isinstance(tokens, SqlError):
        return RuleError(*tokens)
    statement = _Statement(tokens)
    try:
        return statement.parse(max_payload)
    except _Refused as refused:
        return RuleError(*refused.args)


class _Refused(Exception):
    """Internal to the statement's parser (reason, position): turned into a RuleError at its boundary."""


def _found(token: Token) -> str:
    return repr(token.text) if token.kind != "end" else "the end"


class _Statement(TokenCursor):
    def __init__(self, tokens: list[Token]) -> None:
        super().__init__(tokens)
        self.aliases: dict[str, str] = {}  # AS name -> path as written, for WHERE

    def expect_keyword(self, keyword: str) -> None:
        if not self.accept("keyword", keyword):
            token = self.peek()
            raise _Refused(f"expected {keyword} but found {_found(token)}", token.position)

    def parse(self, max_payload: int) -> RuleQuery:
        if self.peek().kind == "end":
            raise _Refused("empty statement", 0)
        self.expect_keyword("SELECT")
        select, star_only = self.fields()
        self.expect_keyword("FROM")
        filters = self.filters()
        where = None
        if self.accept("keyword", "WHERE"):
            parsed = parse_condition(self.tokens, self.pos, self.name)
            if isinstance(parsed, SqlError):
                raise _Refused(*parsed)
            where = parsed
        elif self.peek().kind != "end":
            raise _Refused(f"expected WHERE or the end but found {_found(self.peek())}", self.peek().position)
        return RuleQuery(filters, None if star_only else select, where, max_payload)

    def fields(self) -> tuple[list[tuple[str, str]], bool]:
        fields: list[tuple[str, str]] = []
        items = 0
        star_only = False
        while True:
            token = self.take()
            items += 1
            if token.kind == "op" and token.text == "*":
                added = [(name, name) for name in STAR]
                star_only = items == 1
            elif token.kind == "word":
                path = parse_path(token.text)
                if isinstance(path, SqlError):
                    raise _Refused(path.reason, token.position + path.position)
                if self.accept("keyword", "AS"):
                    name = self.alias()
                    self.aliases.setdefault(name, token.text)
                else:
                    name = path.default_name()
                added = [(token.text, name)]
            else:
                raise _Refused(f"expected a field or '*' but found {_found(token)}", token.position)
            for written, name in added:
                if any(name == taken for _, taken in fields):
                    raise _Refused(f"two fields named {name!r} (rename one with AS)", token.position)
                fields.append((written, name))
            if not self.accept("op", ","):
                return fields, star_only and items == 1

    def alias(self) -> str:
        token = self.take()
        match = re.fullmatch(_SEGMENT, token.text) if token.kind == "word" else None
        if match is None:
            raise _Refused(f"expected a name after AS but found {_found(token)}", token.position)
        name = token.text[1:-1].replace('""', '"') if token.text.startswith('"') else token.text
        if not name:
            raise _Refused("an empty name", token.position)
        return name

    def filters(self) -> list[str]:
        filters: list[str] = []
        while True:
            token = self.take()
            if token.kind == "string":
                topic_filter = token.text[1:-1].replace("''", "'")
            elif token.kind == "word" and re.fullmatch(_QUOTED, token.text):
                topic_filter = token.text[1:-1].replace('""', '"')
            else:
                raise _Refused(f"expected a quoted topic filter but found {_found(token)}", token.position)
            if not valid_topic_filter(topic_filter):
                raise _Refused(f"not a valid MQTT topic filter: {topic_filter[:50]!r}", token.position)
            if topic_filter.startswith(SHARED_PREFIX):
                raise _Refused("a rule reads every message of its filters: no shared subscription", token.position)
            if topic_filter in filters:
                raise _Refused(f"topic filter {topic_filter[:50]!r} given twice", token.position)
            filters.append(topic_filter)
            if not self.accept("op", ","):
                return filters

    def name(self, written: str) -> str | SqlError:
        """A WHERE name: a path, or failing that a SELECT name (as EMQX); the key `Variables` reads it by."""
        path = parse_path(written)
        if not isinstance(path, SqlError):
            return written
        first = _FIRST.fullmatch(written)
        if first is not None and (alias := self.aliases.get(_segment(first))) is not None:
            return alias
        return path
