"""The rule language (pure): statements compiled or refused with a reason and a position, each kind of path, the
projection and its names, SQL's three-valued logic over JSON values, payloads that are not JSON, and the bound on
what is parsed."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidewire.bridges.rules.sql import (
    MAX_PAYLOAD,
    MAX_STATEMENT,
    Path,
    RuleError,
    RuleQuery,
    Variables,
    compile_rule,
    parse_path,
)
from tidewire.gateway.core.sql92 import SqlError
from tidewire.store.base import Message
from tidewire.store.properties import Properties


def message(payload: bytes | Any = b"", topic: str = "s/dev1/temp", user: list[tuple[str, str]] | None = None,
            qos: int = 1, retain: bool = False, client: str = "dev1", timestamp: int = 1_700_000_000_123) -> Message:
    if not isinstance(payload, bytes):
        payload = json.dumps(payload).encode()
    return Message(topic, payload, qos, retain, Properties(user=user or []).to_block(), timestamp, 0, client)


def rule(text: str, **options: Any) -> RuleQuery:
    query = compile_rule(text, **options)
    assert isinstance(query, RuleQuery), query
    return query


def where(condition: str, msg: Message) -> bool:
    return rule(f'SELECT * FROM "#" WHERE {condition}').matches(msg)


def select(fields: str, msg: Message) -> dict[str, Any]:
    return rule(f'SELECT {fields} FROM "#"').project(msg)


# --- statements ------------------------------------------------------------------------------------------------
def test_a_statement() -> None:
    query = rule('SELECT payload.temp AS t, clientid FROM "s/+/temp", "x/#" WHERE payload.temp > 30')
    assert query.filters == ["s/+/temp", "x/#"]
    assert query.select == [("payload.temp", "t"), ("clientid", "clientid")]
    assert query.where is not None and query.max_payload == MAX_PAYLOAD
    assert query.matches(message({"temp": 31})) and not query.matches(message({"temp": 30}))
    assert query.project(message({"temp": 31})) == {"t": 31, "clientid": "dev1"}
    everything = rule('SELECT * FROM "a"')
    assert everything.select is None and everything.where is None
    assert everything.matches(message(b"\xff"))  # no WHERE: every message of the filters


def test_keywords_in_any_case() -> None:
    query = rule('select payload.a as x from "t" where payload.a is not null and not payload.a between 1 and 2')
    assert query.select == [("payload.a", "x")]
    assert query.matches(message({"a": 3})) and not query.matches(message({"a": 1}))
    assert rule('SeLeCt * FrOm "t" WhErE TRUE').matches(message())


@pytest.mark.parametrize(("statement", "position", "words"), [
    ("", 0, "empty"),
    ("   ", 0, "empty"),
    ("DELETE FROM \"a\"", 0, "expected SELECT"),
    ("SELECT", 6, "expected a field"),
    ("SELECT FROM \"a\"", 7, "expected a field"),
    ("SELECT * \"a\"", 9, "expected FROM"),
    ("SELECT *, FROM \"a\"", 10, "expected a field"),
    ("SELECT * FROM", 13, "quoted topic filter"),
    ("SELECT * FROM a/b", 15, "unexpected character"),
    ("SELECT * FROM a", 14, "quoted topic filter"),
    ("SELECT * FROM \"a\".x", 14, "quoted topic filter"),
    ("SELECT * FROM \"a/#/b\"", 14, "not a valid MQTT topic filter"),
    ("SELECT * FROM \"a+\"", 14, "not a valid MQTT topic filter"),
    ("SELECT * FROM \"\"", 14, "not a valid MQTT topic filter"),
    ("SELECT * FROM \"$share/g/a\"", 14, "shared"),
    ("SELECT * FROM \"a\", \"b\", \"a\"", 24, "twice"),
    ("SELECT * FROM \"a\",", 18, "quoted topic filter"),
    ("SELECT * FROM \"a\" junk", 18, "expected WHERE"),
    ("SELECT * FROM \"a\" WHERE", 23, "expected a name"),
    ("SELECT * FROM \"a\" WHERE payload.x = ", 36, "expected a name"),
    ("SELECT * FROM \"a\" WHERE payload.x LIKE 'a%'", 34, "comparison"),
    ("SELECT * FROM \"a\" WHERE (payload.x = 1", 38, "expected ')'"),
    ("SELECT * FROM \"a\" WHERE payload.x = 1 payload.y = 2", 38, "unexpected"),
    ("SELECT * FROM \"a\" WHERE Topic = 'a'", 24, "unknown field 'Topic'"),
    ("SELECT * FROM \"a\" WHERE temp > 1", 24, "unknown field 'temp'"),
    ("SELECT * FROM \"a\" WHERE user = 'x'", 28, "user.<name>"),
    ("SELECT * FROM \"a\" WHERE payload.x = 'unterminated", 36, "unexpected character"),
    ("SELECT x FROM \"a\"", 7, "unknown field 'x'"),
    ("SELECT payload.a-b FROM \"a\"", 16, "unexpected character"),
    ("SELECT payload.a[0] FROM \"a\"", 16, "count from 1"),
    ("SELECT payload.a[1234567890] FROM \"a\"", 16, "out of range"),
    ("SELECT topic.0 FROM \"a\"", 12, "count from 1"),
    ("SELECT topic.x FROM \"a\"", 12, "topic.N"),
    ("SELECT topic.1.2 FROM \"a\"", 12, "topic.N"),
    ("SELECT qos.x FROM \"a\"", 10, "no fields"),
    ("SELECT user[1] FROM \"a\"", 11, "user.<name>"),
    ("SELECT user.a.b FROM \"a\"", 11, "user.<name>"),
    ("SELECT payload AS FROM \"a\"", 18, "expected a name after AS"),
    ("SELECT payload AS p.q FROM \"a\"", 18, "expected a name after AS"),
    ("SELECT payload AS \"\" FROM \"a\"", 18, "empty name"),
    ("SELECT payload AS 'p' FROM \"a\"", 18, "expected a name after AS"),
    ("SELECT topic, topic.2 FROM \"a\"", 14, "two fields named 'topic'"),
    ("SELECT payload.a.x, payload.x FROM \"a\"", 20, "two fields named 'x'"),
    ("SELECT *, payload FROM \"a\"", 10, "two fields named 'payload'"),
    ("SELECT *, * FROM \"a\"", 10, "two fields named 'topic'"),
    ("SELECT topic AS t, qos AS t FROM \"a\"", 19, "two fields named 't'"),
])
def test_refused_with_a_reason_and_a_position(statement: str, position: int, words: str) -> None:
    refused = compile_rule(statement)
    assert isinstance(refused, RuleError), refused
    assert words in refused.reason and refused.position == position, refused


def test_statement_length_is_bounded() -> None:
    head = 'SELECT * FROM "a" WHERE '
    fits = head + "payload.x = 1 OR " * ((MAX_STATEMENT - len(head) - 20) // 17) + "payload.x = 1"
    assert len(fits) <= MAX_STATEMENT and isinstance(compile_rule(fits), RuleQuery)
    over = compile_rule(head + " " * MAX_STATEMENT + "TRUE")
    assert over == RuleError(f"statement over {MAX_STATEMENT} characters", MAX_STATEMENT)
    nested = compile_rule(head + "(" * 40 + "TRUE" + ")" * 40)  # the evaluator's own limits hold
    assert isinstance(nested, RuleError) and "nested" in nested.reason


def test_many_filters() -> None:
    filters = [f"site/{i}/+/temp" for i in range(300)] + ["#", "+", "$SYS/#", "a//b", "it's"]
    query = rule("SELECT * FROM " + ", ".join(f'"{f}"' for f in filters))
    assert query.filters == filters
    assert rule("SELECT * FROM 'a/b', \"c\"\"d\", 'it''s'").filters == ["a/b", 'c"d', "it's"]


# --- paths -----------------------------------------------------------------------------------------------------
def test_message_fields() -> None:
    msg = message({"temp": 21.5}, topic="s/dev1/temp", qos=2, retain=True, client="dev1", timestamp=1234)
    assert select("topic, clientid, qos, retain, timestamp", msg) == {
        "topic": "s/dev1/temp", "clientid": "dev1", "qos": 2, "retain": True, "timestamp": 1234}
    assert where("topic = 's/dev1/temp' AND clientid = 'dev1' AND qos = 2 AND retain = TRUE AND timestamp = 1234",
                 msg)
    assert where("qos > 1 AND timestamp BETWEEN 1000 AND 2000", msg)
    assert select("clientid", message(client="")) == {"clientid": ""}  # a message the gateway made


def test_topic_levels() -> None:
    msg = message(topic="s/dev1//temp")
    assert select("topic.1 AS a, topic.2 AS b, topic.3 AS c, topic.4 AS d, topic.5 AS e", msg) == {
        "a": "s", "b": "dev1", "c": "", "d": "temp", "e": None}
    assert where("topic.2 = 'dev1'", msg) and not where("topic.2 = 'dev2'", msg)
    assert not where("topic.5 = 'x'", msg) and where("topic.5 IS NULL", msg)


def test_payload_json_paths() -> None:
    msg = message({"a": {"b": 1, "c-d": "x", "": 0}, "items": [10, 20, {"k": "v"}], "2": "two", "n": None,
                   "flag": False, 'q"q': 1})
    assert select('payload.a.b, payload.a."c-d", payload.items[1] AS first, payload.items[-1].k, '
                  'payload.items[-3] AS third_last, payload.items[4] AS past, payload.items[-4] AS before, '
                  'payload.2, payload.n, payload.flag, payload."q""q", payload.a."" AS empty, payload.nope',
                  msg) == {
        "b": 1, "c-d": "x", "first": 10, "k": "v", "third_last": 10, "past": None, "before": None, "2": "two",
        "n": None, "flag": False, 'q"q': 1, "empty": 0, "nope": None}
    assert select("payload.a, payload.items AS items", msg) == {"a": {"b": 1, "c-d": "x", "": 0},
                                                               "items": [10, 20, {"k": "v"}]}
    assert select("payload.a.b.c AS deeper, payload.items.k AS member, payload.a[1] AS element", msg) == {
        "deeper": None, "member": None, "element": None}  # a step into the wrong kind of value is absent
    assert where("payload.a.\"c-d\" = 'x' AND payload.items[2] = 20 AND payload.flag = FALSE", msg)


def test_payload_and_its_encoding() -> None:
    doc = {"temp": 30}
    assert select("payload, payload_encoding", message(doc)) == {"payload": doc, "payload_encoding": "json"}
    assert select("payload, payload_encoding", message(b"21.5")) == {"payload": 21.5, "payload_encoding": "json"}
    assert select("payload, payload_encoding", message(b'"quoted"')) == {"payload": "quoted",
                                                                         "payload_encoding": "json"}
    assert select("payload, payload_encoding", message("hé".encode())) == {"payload": "hé",
                                                                           "payload_encoding": "text"}
    assert select("payload, payload_encoding", message(b"")) == {"payload": "", "payload_encoding": "text"}
    raw = b"\xff\x00\xfe"
    assert select("payload, payload_encoding", message(raw)) == {
        "payload": base64.b64encode(raw).decode(), "payload_encoding": "base64"}
    # No NaN, no infinity: what JSON cannot carry back out is not JSON here.
    for not_json in (b'{"a": NaN}', b"Infinity", b'{"a": 1e999}', b"{'a': 1}", b"[1, 2"):
        assert select("payload_encoding", message(not_json)) == {"payload_encoding": "text"}, not_json
    deep = b"[" * 100_000 + b"]" * 100_000  # past the interpreter's recursion limit: not parsed, no exception
    assert select("payload_encoding", message(deep)) == {"payload_encoding": "text"}


def test_user_properties() -> None:
    msg = message({}, user=[("kind", "a"), ("content-type", "x/y"), ("kind", "b"), ("n", "10")])
    assert select('user.kind, user."content-type", user.missing', msg) == {
        "kind": "b", "content-type": "x/y", "missing": None}  # a repeated name: the last one
    assert where("user.kind IN ('a', 'b')", msg) and not where("user.kind IN ('c')", msg)
    assert where("user.n > 9", msg)  # a property is text, read as a number against one
    assert not where("user.kind = 'b'", message({}))
    broken = Message("t", b"", 0, False, b"\x26\x00\x09ab", 0, 0, "c")  # a block that does not decode
    assert select("user.a", broken) == {"a": None}


# --- projection ------------------------------------------------------------------------------------------------
def test_star_and_renaming() -> None:
    msg = message({"temp": 1}, topic="a/b", qos=0, client="c", timestamp=5)
    star = {"topic": "a/b", "clientid": "c", "qos": 0, "retain": False, "timestamp": 5, "payload": {"temp": 1}}
    assert rule('SELECT * FROM "a/#"').project(msg) == star
    with_more = rule('SELECT *, payload_encoding, payload.temp AS "the temp" FROM "a/#"')
    assert with_more.select is not None and with_more.select[:6] == [(name, name) for name in star]
    assert with_more.project(msg) == {**star, "payload_encoding": "json", "the temp": 1}
    assert list(select("qos AS b, topic AS a", msg)) == ["b", "a"]  # the order of the SELECT
    assert select("payload.temp AS temp, topic AS payload", msg) == {"temp": 1, "payload": "a/b"}
    assert json.dumps(with_more.project(message(b"\xff")), allow_nan=False)  # always JSON


def test_a_name_given_with_as_in_where() -> None:
    query = rule('SELECT payload.temp AS t, payload.site AS topic FROM "#" WHERE t > 30 AND topic = \'a/b\'')
    assert query.matches(message({"temp": 31, "site": "x"}, topic="a/b"))  # `topic` is the path, not the name
    assert not query.matches(message({"temp": 31, "site": "a/b"}, topic="x"))
    refused = compile_rule('SELECT payload.temp FROM "#" WHERE temp > 30')  # a default name is not one
    assert isinstance(refused, RuleError) and "unknown field 'temp'" in refused.reason


# --- conditions ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("condition", "payload", "expected"), [
    ("payload.temp > 9", {"temp": 10}, True),  # as numbers: as text "10" < "9"
    ("payload.temp > 9", {"temp": "10"}, True),  # a string against a number is read as one
    ("payload.temp = '10'", {"temp": 10}, True),
    ("payload.temp > 9", {"temp": "hot"}, False),  # not a number: unknown
    ("payload.temp < 'z'", {"temp": "a"}, False),  # strings have no order
    ("payload.code = '007'", {"code": "007"}, True),
    ("payload.code = '7'", {"code": "007"}, False),  # two strings: as text
    ("payload.code = 7", {"code": "007"}, True),
    ("payload.id = 9007199254740993", {"id": 9007199254740993}, True),  # integers exactly, past 2**53
    ("payload.id = 9007199254740992", {"id": 9007199254740993}, False),
    ("payload.x = 1.5", {"x": 1.5}, True),
    ("payload.x = 1", {"x": True}, False),  # a boolean is not a number
    ("payload.ok = TRUE", {"ok": True}, True),
    ("payload.ok = TRUE", {"ok": "true"}, True),
    ("payload.ok = TRUE", {"ok": 1}, False),
    ("payload.ok", {"ok": True}, False),  # refused below: a bare path is not a condition
    ("payload.x IS NULL", {"x": None}, True),
    ("payload.x IS NULL", {}, True),
    ("payload.x IS NOT NULL", {"x": 0}, True),
    ("payload.x = 1", {}, False),  # absent: unknown, not a match
    ("NOT payload.x = 1", {}, False),  # NOT unknown is unknown
    ("payload.x <> 1", {}, False),
    ("payload.x = 1 OR TRUE", {}, True),
    ("payload.x = 1 OR payload.y = 2", {"y": 2}, True),
    ("payload.x = 1 AND payload.y = 2", {"y": 2}, False),
    ("payload.x NOT IN (1, 2)", {}, False),
    ("payload.a = '{\"b\":[1,\"é\"]}'", {"a": {"b": [1, "é"]}}, True),  # an object compares as compact JSON
    ("payload.a IS NOT NULL", {"a": []}, True),
    ("payload = '[1,2]'", [1, 2], True),
    ("payload = 5", 5, True),
])
def test_three_valued_logic_over_json(condition: str, payload: Any, expected: bool) -> None:
    query = compile_rule(f'SELECT * FROM "#" WHERE {condition}')
    if condition == "payload.ok":
        assert isinstance(query, RuleError)
        return
    assert isinstance(query, RuleQuery), query
    assert query.matches(message(payload)) is expected


def test_payloads_that_are_not_json() -> None:
    text = message(b"hello world")
    assert where("payload = 'hello world'", text)
    assert not where("payload.x IS NOT NULL", text) and where("payload.x IS NULL", text)
    assert not where("payload.x = 1", text) and not where("NOT payload.x = 1", text)
    assert where("payload_encoding = 'text'", text)
    binary = message(b"\x80abc")
    encoded = base64.b64encode(b"\x80abc").decode()
    assert where(f"payload = '{encoded}'", binary)
    assert not where("payload.x = 1", binary) and where("payload_encoding = 'base64'", binary)
    scalar = message(b"42")
    assert where("payload > 41", scalar) and not where("payload.x IS NOT NULL", scalar)


def test_payload_size_bound() -> None:
    doc = {"temp": 31, "pad": "x" * 200}
    body = json.dumps(doc).encode()
    at_bound = rule('SELECT payload, payload_encoding FROM "#" WHERE payload.temp > 30', max_payload=len(body))
    assert at_bound.matches(message(body)) and at_bound.project(message(body))["payload"] == doc
    below = rule('SELECT payload, payload_encoding FROM "#" WHERE payload.temp > 30', max_payload=len(body) - 1)
    assert not below.matches(message(body))  # not parsed: its JSON paths are absent
    assert below.project(message(body)) == {"payload": body.decode(), "payload_encoding": "text"}
    big = json.dumps({"temp": 31, "pad": "x" * MAX_PAYLOAD}).encode()
    assert not rule('SELECT * FROM "#" WHERE payload.temp > 30').matches(message(big))
    assert rule('SELECT * FROM "#" WHERE payload.temp > 30', max_payload=2 * MAX_PAYLOAD).matches(message(big))


# --- one view per message --------------------------------------------------------------------------------------
def test_one_view_per_message() -> None:
    query = rule('SELECT payload.temp FROM "#" WHERE payload.temp > 30')
    first, second = message({"temp": 31}), message({"temp": 31})
    assert query.matches(first)
    view = query.variables(first)
    assert query.project(first) == {"temp": 31} and query.variables(first) is view  # parsed once for both
    assert query.variables(second) is not view
    assert query.matches(view) and query.project(view) == {"temp": 31}  # a view of one's own
    own = Variables(first)
    assert query.variables(own) is own


def test_variables_as_a_mapping() -> None:
    view = Variables(message({"a": [1, {"b": 2}]}, user=[("k", "v")]))
    assert view["payload.a[2].b"] == 2 and view["payload.a"] == '[1,{"b":2}]'
    assert view.get('user."k"') == "v" and view.get("payload.zz") is None
    assert "nope" not in view and view.get("nope") is None
    assert list(view) == ["topic", "clientid", "qos", "retain", "timestamp", "payload", "payload_encoding",
                          'user."k"'] and len(view) == 8
    assert all(view[key] is not None for key in view)


def test_paths() -> None:
    assert parse_path('payload.a."b c"[2].3[-1]') == Path("payload", ("a", "b c", 2, "3", -1))
    assert parse_path("topic.3") == Path("topic", (3,)) and parse_path("user.x") == Path("user", ("x",))
    assert parse_path('"payload".x') == Path("payload", ("x",))
    assert parse_path("payload.") == SqlError("unexpected '.' in a field", 7)
    assert Path("payload", ("a", 2)).default_name() == "a" and Path("topic", (2,)).default_name() == "topic"
    with pytest.raises(ValueError, match="unknown field"):
        RuleQuery(["#"], [("nope", "x")], None)  # by hand, a bad path is a bug: compile_rule never makes one


# --- never an exception ----------------------------------------------------------------------------------------
@given(st.text(max_size=300))
def test_compile_never_raises(text: str) -> None:
    compiled = compile_rule(text)
    assert isinstance(compiled, RuleQuery | RuleError)


WORDS = ["SELECT", "FROM", "WHERE", "AS", "*", ",", '"a/#"', "'b'", "topic", "topic.2", "clientid", "qos",
         "payload", "payload.x", "payload.x[1]", 'payload."a-b"', "user.k", "payload_encoding", "=", "<>", ">",
         "1", "-2.5", "TRUE", "NULL", "IS", "NOT", "AND", "OR", "(", ")", "IN", "BETWEEN", "t"]


@given(st.lists(st.sampled_from(WORDS), max_size=25))
def test_compile_never_raises_on_near_misses(words: list[str]) -> None:
    compiled = compile_rule(" ".join(["SELECT", *words]))
    assert isinstance(compiled, RuleQuery | RuleError)


PAYLOADS = st.binary(max_size=64) | st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.sampled_from(["x", "a-b", "k"]), children,
                                                                       max_size=4),
    max_leaves=12).map(lambda value: json.dumps(value).encode())


@settings(max_examples=200)
@given(PAYLOADS, st.binary(max_size=24), st.text(min_size=1, max_size=12))
def test_evaluation_never_raises(payload: bytes, block: bytes, topic: str) -> None:
    query = rule('SELECT *, payload_encoding, payload.x[1] AS first, payload."a-b".k AS inner, user.k, '
                 'topic.2 AS level FROM "#" WHERE payload.x > 1 OR payload."a-b" IS NOT NULL OR user.k IN (\'v\', 2) '
                 "OR topic.2 = 'x' OR payload = 3 OR NOT payload.x[-1] BETWEEN 'a' AND 2")
    msg = Message(topic, payload, 0, False, block, 0, 0, "c")
    assert query.matches(msg) in (True, False)
    json.dumps(query.project(msg), allow_nan=False)
