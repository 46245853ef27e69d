"""Tests for gateway.core.topics: validation, spec matching and FilterTrie against brute force."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidewire.gateway.core.topics import (
    FilterTrie,
    first_level_queue,
    is_wildcard,
    matches,
    valid_topic_filter,
    valid_topic_name,
)


@pytest.mark.parametrize(
    ("topic", "ok"),
    [
        ("a", True),
        ("a/b/c", True),
        ("/", True),
        ("$SYS/x", True),
        ("", False),
        ("a/+", False),
        ("a/#", False),
        ("a+b", False),
        ("a\x00b", False),
        ("x" * 65535, True),
        ("x" * 65536, False),
        ("é" * 32767, True),  # 65534 bytes
        ("é" * 32768, False),  # 65536 bytes, though only 32768 code points
        ("a\ud800", False),  # lone surrogate cannot be valid UTF-8
    ],
)
def test_valid_topic_name(topic: str, ok: bool) -> None:
    assert valid_topic_name(topic) is ok


@pytest.mark.parametrize(
    ("flt", "ok"),
    [
        ("a", True),
        ("#", True),
        ("+", True),
        ("a/#", True),
        ("+/+/#", True),
        ("/+/", True),
        ("", False),
        ("a#", False),
        ("a/#/b", False),
        ("#/a", False),
        ("a+/b", False),
        ("a/b+", False),
        ("a\x00", False),
        ("x" * 65536, False),
    ],
)
def test_valid_topic_filter(flt: str, ok: bool) -> None:
    assert valid_topic_filter(flt) is ok


def test_is_wildcard_and_first_level_queue() -> None:
    assert is_wildcard("a/+") and is_wildcard("#") and not is_wildcard("a/b")
    assert first_level_queue("a/b/c") == "a/#"
    assert first_level_queue("a") == "a/#"
    assert first_level_queue("/x") == "/#"
    assert first_level_queue("$SYS/broker") == "$SYS/#"


@pytest.mark.parametrize(
    ("flt", "topic", "ok"),
    [
        ("a/b", "a/b", True),
        ("a/b", "a/c", False),
        ("a/+", "a/b", True),
        ("a/+", "a", False),
        ("a/+", "a/b/c", False),
        ("a/+", "a/", True),
        ("+/+", "/x", True),
        ("+", "/x", False),
        ("a/#", "a", True),
        ("a/#", "a/b/c", True),
        ("a/#", "ab", False),
        ("#", "a/b", True),
        ("#", "/", True),
        ("#", "$SYS/x", False),
        ("+/x", "$SYS/x", False),
        ("$SYS/#", "$SYS/x", True),
        ("$SYS/+", "$SYS/x", True),
        ("a/+/c", "a/b/c", True),
        ("a/+/c", "a/b/d", False),
        ("a/b/c", "a/b", False),
    ],
)
def test_matches(flt: str, topic: str, ok: bool) -> None:
    assert matches(flt, topic) is ok


def test_trie_add_remove_len_contains() -> None:
    trie: FilterTrie[str] = FilterTrie()
    assert trie.add("a/+", "c1") is True
    assert trie.add("a/+", "c2") is False
    assert trie.add("a/#", "c1") is True
    assert trie.add("a", "c3") is True
    assert len(trie) == 3
    assert "a/+" in trie and "a/#" in trie and "a" in trie
    assert "a/b" not in trie and "x" not in trie and 5 not in trie
    assert sorted(trie.filters()) == ["a", "a/#", "a/+"]
    assert dict(trie.match("a/b")) == {"a/+": {"c1", "c2"}, "a/#": {"c1"}}
    assert dict(trie.match("a")) == {"a": {"c3"}, "a/#": {"c1"}}

    assert trie.remove("a/+", "c1") is False  # c2 still there
    assert trie.remove("a/+", "nobody") is False
    assert trie.remove("zzz/q", "c1") is False
    assert trie.remove("a/+", "c2") is True
    assert "a/+" not in trie and len(trie) == 2
    assert trie.remove("a/+", "c2") is False  # already gone
    assert dict(trie.match("a/b")) == {"a/#": {"c1"}}
    # Removing a filter that is a prefix of another must not prune the longer one.
    assert trie.remove("a", "c3") is True
    assert dict(trie.match("a/b")) == {"a/#": {"c1"}}
    assert trie.remove("a/#", "c1") is True
    assert len(trie) == 0 and list(trie.filters()) == []
    assert trie._root.children is None  # fully pruned


def test_trie_prunes_deep_branch_but_keeps_siblings() -> None:
    trie: FilterTrie[int] = FilterTrie()
    trie.add("a/b/c/d", 1)
    trie.add("a/x", 2)
    trie.remove("a/b/c/d", 1)
    root_children = trie._root.children
    assert root_children is not None
    a_children = root_children["a"].children
    assert a_children is not None and set(a_children) == {"x"}
    assert dict(trie.match("a/x")) == {"a/x": {2}}


def test_trie_dollar_rule() -> None:
    trie: FilterTrie[int] = FilterTrie()
    for i, f in enumerate(["#", "+/x", "$SYS/#", "$SYS/+", "+", "$SYS"]):
        trie.add(f, i)
    assert sorted(f for f, _ in trie.match("$SYS/x")) == ["$SYS/#", "$SYS/+"]
    assert sorted(f for f, _ in trie.match("$SYS")) == ["$SYS", "$SYS/#"]
    assert sorted(f for f, _ in trie.match("a/x")) == ["#", "+/x"]
    # Only the first level is special: "a/$x" is an ordinary topic.
    trie.add("a/+", 9)
    assert sorted(f for f, _ in trie.match("a/$x")) == ["#", "a/+"]


_LEVELS = st.sampled_from(["a", "b", "", "$x"])
_TOPICS = st.lists(_LEVELS, min_size=1, max_size=4).map("/".join).filter(bool)


@st.composite
def _filters(draw: st.DrawFn, levels_from: st.SearchStrategy[str] = _LEVELS) -> str:
    levels = draw(st.lists(st.one_of(levels_from, st.just("+")), min_size=1, max_size=4))
    if draw(st.booleans()):
        levels.append("#")
    f = "/".join(levels)
    return f if f else "+"


@settings(max_examples=150, deadline=None)
@given(
    filters=st.lists(st.tuples(_filters(), st.integers(0, 3)), max_size=25),
    removals=st.lists(st.tuples(_filters(), st.integers(0, 3)), max_size=10),
    topics=st.lists(_TOPICS, min_size=1, max_size=10),
)
def test_trie_matches_brute_force(
    filters: list[tuple[str, int]], removals: list[tuple[str, int]], topics: list[str]
) -> None:
    trie: FilterTrie[int] = FilterTrie()
    model: dict[str, set[int]] = {}
    for f, v in filters:
        assert valid_topic_filter(f)
        assert trie.add(f, v) is (f not in model)
        model.setdefault(f, set()).add(v)
    for f, v in removals:
        emptied = f in model and model[f] == {v}
        assert trie.remove(f, v) is emptied
        if f in model:
            model[f].discard(v)
            if not model[f]:
                del model[f]
    assert len(trie) == len(model)
    assert sorted(trie.filters()) == sorted(model)
    for topic in topics:
        assert valid_topic_name(topic)
        got = trie.match(topic)
        got_filters = [f for f, _ in got]
        assert len(got_filters) == len(set(got_filters)), "duplicate filter in match result"
        expected = {f: vals for f, vals in model.items() if matches(f, topic)}
        assert dict(got) == expected


def _all_topics(depth: int) -> list[str]:
    # 'z' never occurs in generated filters, so it stands for "any other level".
    alphabet = ["a", "", "$x", "z"]
    out: list[list[str]] = [[x] for x in alphabet]
    frontier = out
    for _ in range(depth - 1):
        frontier = [[*t, x] for t in frontier for x in alphabet]
        out = out + frontier
    # The empty topic is kept on purpose: filter_covers/filters_overlap treat it as matchable (conservative).
    return ["/".join(t) for t in out]


@pytest.mark.parametrize(
    ("general", "specific", "covers", "overlap"),
    [
        ("sensors/#", "sensors/+/temp", True, True),
        ("sensors/+", "sensors/#", False, True),
        ("sensors/#", "sensors", True, True),
        ("#", "$SYS/#", False, False),
        ("+/#", "$SYS/x", False, False),
        ("$SYS/#", "$SYS/+", True, True),
        ("a/+", "a/b", True, True),
        ("a/b", "a/+", False, True),
        ("a", "a/#", False, True),
        ("a/+", "b/+", False, False),
        ("#", "#", True, True),
        ("+", "+/+", False, False),
    ],
)
def test_covers_and_overlap_examples(general: str, specific: str, covers: bool, overlap: bool) -> None:
    from tidewire.gateway.core.topics import filter_covers, filters_overlap

    assert filter_covers(general, specific) is covers
    assert filters_overlap(general, specific) is overlap
    assert filters_overlap(specific, general) is overlap


_SMALL_LEVELS = st.sampled_from(["a", "", "$x"])


@settings(max_examples=200, deadline=None)
@given(a=_filters(_SMALL_LEVELS), b=_filters(_SMALL_LEVELS))
def test_covers_and_overlap_brute_force(a: str, b: str) -> None:
    from tidewire.gateway.core.topics import filter_covers, filters_overlap

    depth = max(a.count("/"), b.count("/")) + 2
    topics = _TOPICS_BY_DEPTH[depth]
    ma = [matches(a, t) for t in topics]
    mb = [matches(b, t) for t in topics]
    assert filters_overlap(a, b) is any(x and y for x, y in zip(ma, mb, strict=True))
    assert filter_covers(a, b) is all(x or not y for x, y in zip(ma, mb, strict=True))


_TOPICS_BY_DEPTH = {d: _all_topics(d) for d in range(1, 7)}
