"""The pure routing core: headers matching as RabbitMQ's, and routes through exchange bindings and alternates
(each queue once, every cycle ended)."""

from __future__ import annotations

import decimal
from pathlib import Path

import pytest
from pamqp import commands

from tests.gateway.fakeclock import FakeClock
from tidewire.gateway.core.ingress import neutral_message
from tidewire.gateway.protocols.amqp.headers import binding_problem, headers_match
from tidewire.gateway.protocols.amqp.mapping import binding_filter, properties_in, properties_out
from tidewire.gateway.protocols.amqp.routing import (
    Binding,
    Graph,
    Routing,
    Vertex,
    build_graph,
    decode_arguments,
    encode_arguments,
    route,
)
from tidewire.store.base import GroupRecord
from tidewire.store.embedded.engine import EmbeddedStore


def test_headers_match_as_rabbitmq() -> None:
    headers = {"a": 5, "b": "x", "flag": False, "x-tenant": "t"}
    assert headers_match({"a": 5, "b": "x"}, headers)  # all, the default
    assert not headers_match({"a": "5"}, headers)  # an int is no string
    assert not headers_match({"a": decimal.Decimal(5)}, headers)
    assert headers_match({"a": 5.0}, headers)  # numbers by value
    assert not headers_match({"a": True}, {"a": 1}) and not headers_match({"a": 1}, {"a": True})
    assert headers_match({"b": bytearray(b"x")}, headers)  # a byte array and a string: their bytes
    assert headers_match({"x-match": "any", "a": 6, "b": "x"}, headers)
    assert not headers_match({"x-match": "any", "a": 6, "c": "x"}, headers)
    assert headers_match({"flag": None}, headers) and not headers_match({"missing": None}, headers)
    assert headers_match({"x-tenant": "other"}, headers)  # x- keys play no part...
    assert not headers_match({"x-match": "all-with-x", "x-tenant": "other"}, headers)  # ...unless -with-x
    assert headers_match({"x-match": "any-with-x", "x-tenant": "t"}, headers)
    assert headers_match({}, {}) and not headers_match({"x-match": "any"}, headers)
    assert binding_problem({"x-match": "some"}) is not None and binding_problem({"x-match": 1}) is not None
    assert binding_problem({"x-match": "any-with-x"}) is None and binding_problem({}) is None


def _graph() -> Graph:
    def b(dest: str, key: str, kind: str, source: str, args: dict[str, object] | None = None) -> Binding:
        return Binding(dest, key, binding_filter(source, kind, key) or "" if kind != "headers" else "", args or {})

    return {
        "front": Vertex("topic", "", [b("q-front", "#", "topic", "front")], [b("middle", "eu.*", "topic", "front")]),
        "middle": Vertex("direct", "", [], [b("back", "eu.fr", "direct", "middle")]),
        "back": Vertex("fanout", "", [b("q-back", "", "fanout", "back")], [b("front", "", "fanout", "back")]),
        "hdr": Vertex("headers", "lost", [b("q-hdr", "", "headers", "hdr", {"n": 5})], []),
        "lost": Vertex("fanout", "", [b("q-lost", "", "fanout", "lost")], []),
        "ring-a": Vertex("direct", "ring-b"), "ring-b": Vertex("direct", "ring-a"),
    }


def test_routes_through_chains_cycles_and_alternates() -> None:
    graph = _graph()
    assert route(graph, "front", "eu.fr", {}, False) == {"q-front", "q-back"}  # around the cycle, once each
    assert route(graph, "front", "us.ny", {}, False) == {"q-front"}
    assert route(graph, "hdr", "", {"n": 5}, False) == {"q-hdr"}
    assert route(graph, "hdr", "", {"n": "5"}, False) == {"q-lost"}  # unmatched: the alternate
    assert route(graph, "hdr", "", {"n": "5"}, True) == set()  # routed by its topic: no alternate
    assert route(graph, "ring-a", "k", {}, False) == set()  # alternates in a cycle end
    assert route(graph, "gone", "k", {}, False) == set()


def test_graph_from_records_and_typed_arguments() -> None:
    args = encode_arguments({"x-match": "any", "n": 5, "s": "5"})
    assert decode_arguments(args) == {"x-match": "any", "n": 5, "s": "5"} and encode_arguments({}) == ""
    records = [GroupRecord("amqp-exchange///hdr", [], attrs={"type": "headers", "alternate": "amq.fanout",
                                                               "bindings": [["amq.direct", "", "", args]]}),
               GroupRecord("amqp///q1", ["$queue/q1"], attrs={"queue": "q1", "bindings": [["hdr", "", "", args]]}),
               GroupRecord("amqp///q2", ["$queue/q2"], attrs={  # stored before arguments were kept: three
                   "queue": "q2", "bindings": [["amq.direct", "k", "$exchange/amq.direct/k"]]})]
    graph = build_graph(records, "/")
    assert route(graph, "hdr", "k", {"n": 5}, False) == {"q1", "q2"}
    assert route(graph, "hdr", "k", {"n": 6}, False) == set()  # amq.fanout: nothing bound


def test_headers_keep_their_types_through_the_store() -> None:
    headers = {"n": 5, "s": "5", "b": bytearray(b"raw"), "t": True, "v": None, "d": decimal.Decimal("1.5"),
               "nested": {"l": [1, "a"]}}
    mapped = properties_in(commands.Basic.Properties(headers=headers), None)
    assert not isinstance(mapped, str)
    neutral, _ = mapped
    assert ("n", "5") in neutral.user and ("s", "5") in neutral.user  # MQTT readers still see strings
    back = properties_out(neutral_message("t", b"", properties=neutral, now_ms=0), 0)
    assert back.headers == headers


class _Closable(EmbeddedStore):
    """The embedded store, whose list of groups can be made to fail (a store that cannot answer)."""

    failing = False

    async def list_groups(self) -> list[GroupRecord]:
        if self.failing:
            raise ConnectionError("store down")
        return await super().list_groups()


async def test_the_graph_is_read_again_after_a_change_or_a_second_and_kept_while_the_store_fails(
        tmp_path: Path) -> None:
    store = _Closable(tmp_path, fsync="never")
    await store.open()
    clock = FakeClock()
    routing = Routing(store, clock)
    try:
        store.failing = True
        with pytest.raises(ConnectionError):  # never read: nothing to route with
            await routing.graph("/")
        store.failing = False
        assert "x" not in await routing.graph("/")
        await store.put_group(GroupRecord("amqp-exchange///x", [], attrs={"type": "headers"}))
        assert "x" not in await routing.graph("/")  # another node's change: seen within the second
        clock.advance(1.0)
        assert (await routing.graph("/"))["x"].kind == "headers"
        await store.put_group(GroupRecord("amqp-exchange///y", [], attrs={"type": "fanout"}))
        routing.changed()  # a change made through this node: seen at once
        assert "y" in await routing.graph("/")
        store.failing = True
        routing.changed()
        assert "y" in await routing.graph("/")  # the graph last read routes
    finally:
        store.failing = False
        await store.close()
