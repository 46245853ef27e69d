"""MQTT topic rules: name/filter validation, filter matching and a subscription trie (O(levels) match)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, TypeVar

V = TypeVar("V")

MAX_TOPIC_BYTES = 65535
# A str of this many code points can never exceed MAX_TOPIC_BYTES in UTF-8 (4 bytes per code point max).
_SAFE_LEN = MAX_TOPIC_BYTES // 4


def _utf8_ok(s: str) -> bool:
    """Length limit and encodability (lone surrogates are not valid MQTT UTF-8)."""
    if len(s) <= _SAFE_LEN and s.isascii():
        return True
    try:
        return len(s.encode("utf-8")) <= MAX_TOPIC_BYTES
    except UnicodeEncodeError:
        return False


def valid_topic_name(topic: str) -> bool:
    """A PUBLISH topic name: non-empty, no wildcards, no U+0000, at most 65535 UTF-8 bytes."""
    if not topic or "+" in topic or "#" in topic or "\x00" in topic:
        return False
    return _utf8_ok(topic)


def valid_topic_filter(topic_filter: str) -> bool:
    """A SUBSCRIBE filter: '+' fills a whole level, '#' fills a whole level and only the last one."""
    if not topic_filter or "\x00" in topic_filter or not _utf8_ok(topic_filter):
        return False
    if "+" not in topic_filter and "#" not in topic_filter:
        return True
    levels = topic_filter.split("/")
    last = len(levels) - 1
    for i, level in enumerate(levels):
        if "#" in level and (level != "#" or i != last):
            return False
        if "+" in level and level != "+":
            return False
    return True


def is_wildcard(topic_filter: str) -> bool:
    return "+" in topic_filter or "#" in topic_filter


def first_level_queue(topic: str) -> str:
    """Name of the first-level queue a topic is indexed into: "a/b/c" -> "a/#", "/x" -> "/#"."""
    return topic.split("/", 1)[0] + "/#"


def matches(topic_filter: str, topic: str) -> bool:
    """MQTT matching: "a/#" also matches "a"; filters starting with a wildcard skip "$" topics."""
    if topic_filter == topic:
        return True
    if topic.startswith("$") and topic_filter[:1] in ("+", "#"):
        return False
    flevels = topic_filter.split("/")
    tlevels = topic.split("/")
    ntop = len(tlevels)
    for i, f in enumerate(flevels):
        if f == "#":
            return True
        if i >= ntop:
            return False
        if f != "+" and f != tlevels[i]:
            return False
    return len(flevels) == ntop


class _Node(Generic[V]):
    # Small nodes: millions may exist. children/values are created lazily.
    __slots__ = ("children", "filter", "values")

    def __init__(self) -> None:
        self.children: dict[str, _Node[V]] | None = None
        self.values: set[V] | None = None
        self.filter: str = ""


class FilterTrie(Generic[V]):
    """Topic filters (wildcard or exact) -> sets of values; match a topic name in O(levels).

    `match` returns the trie's own value sets: callers must treat them as read-only. Topics passed to
    `match` must be valid topic names (no wildcard characters).
    """

    __slots__ = ("_count", "_root")

    def __init__(self) -> None:
        self._root: _Node[V] = _Node()
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def __contains__(self, topic_filter: object) -> bool:
        if not isinstance(topic_filter, str):
            return False
        node = self._find(topic_filter)
        return node is not None and bool(node.values)

    def _find(self, topic_filter: str) -> _Node[V] | None:
        node = self._root
        for level in topic_filter.split("/"):
            children = node.children
            child = children.get(level) if children is not None else None
            if child is None:
                return None
            node = child
        return node

    def add(self, topic_filter: str, value: V) -> bool:
        """Add value under filter; True if the filter was not in the trie before."""
        node = self._root
        for level in topic_filter.split("/"):
            children = node.children
            if children is None:
                children = node.children = {}
            child = children.get(level)
            if child is None:
                child = children[level] = _Node()
            node = child
        if node.values is None:
            node.values = {value}
            node.filter = topic_filter
            self._count += 1
            return True
        node.values.add(value)
        return False

    def remove(self, topic_filter: str, value: V) -> bool:
        """Remove value from filter; True if the filter now has no values (and was pruned)."""
        path: list[tuple[_Node[V], str]] = []
        node = self._root
        for level in topic_filter.split("/"):
            children = node.children
            if children is None or level not in children:
                return False
            path.append((node, level))
            node = children[level]
        values = node.values
        if values is None or value not in values:
            return False
        values.discard(value)
        if values:
            return False
        node.values = None
        node.filter = ""
        self._count -= 1
        # Prune now-empty branches bottom-up so dead filters do not slow later walks.
        for parent, level in reversed(path):
            siblings = parent.children
            assert siblings is not None
            child = siblings[level]
            if child.values is not None or child.children:
                break
            del siblings[level]
            if not siblings:
                parent.children = None
        return True

    def match(self, topic: str) -> list[tuple[str, set[V]]]:
        """(filter, values) for every filter in the trie that matches the topic name."""
        out: list[tuple[str, set[V]]] = []
        levels = topic.split("/")
        nodes: list[_Node[V]] = [self._root]
        # Spec 4.7.2: a '+' or '#' first level never matches a topic beginning with '$'.
        skip_wild = topic.startswith("$")
        for level in levels:
            nxt: list[_Node[V]] = []
            for node in nodes:
                children = node.children
                if children is None:
                    continue
                if not skip_wild:
                    hash_node = children.get("#")
                    if hash_node is not None and hash_node.values:
                        out.append((hash_node.filter, hash_node.values))
                    plus = children.get("+")
                    if plus is not None:
                        nxt.append(plus)
                exact = children.get(level)
                if exact is not None:
                    nxt.append(exact)
            if not nxt:
                return out
            nodes = nxt
            skip_wild = False
        for node in nodes:
            if node.values:
                out.append((node.filter, node.values))
            children = node.children
            if children is not None:
                # "a/#" matches "a" itself (the parent level).
                hash_node = children.get("#")
                if hash_node is not None and hash_node.values:
                    out.append((hash_node.filter, hash_node.values))
        return out

    def filters(self) -> Iterator[str]:
        stack = [self._root]
        while stack:
            node = stack.pop()
            if node.values:
                yield node.filter
            if node.children:
                stack.extend(node.children.values())


def _dollar_excluded(a0: str, b0: str) -> bool:
    """True when first levels a0 (wildcard) and b0 (literal '$...') can never meet (spec 4.7.2)."""
    return (a0 == "+" or a0 == "#") and b0[:1] == "$"


def filter_covers_levels(general: tuple[str, ...] | list[str], specific: tuple[str, ...] | list[str]) -> bool:
    """Split-level form of `filter_covers` (callers pre-split filters once)."""
    ng, nf = len(general), len(specific)
    if _dollar_excluded(general[0], specific[0]):
        return False
    for i in range(ng):
        g = general[i]
        if g == "#":
            return True
        if i >= nf:
            return False
        f = specific[i]
        if f == "#":
            return False
        if g == "+":
            continue
        if f == "+" or f != g:
            return False
    return ng == nf


def filter_covers(general: str, specific: str) -> bool:
    """True if every topic matched by filter `specific` is matched by filter `general`.

    Like `filters_overlap`, this counts the (invalid) empty topic as a topic, which only matters for
    filters whose first level is empty ("/#" vs "/+/#"); the answer then errs towards "not covered".
    """
    return filter_covers_levels(general.split("/"), specific.split("/"))


def filters_overlap_levels(a: tuple[str, ...] | list[str], b: tuple[str, ...] | list[str]) -> bool:
    """Split-level form of `filters_overlap`."""
    if _dollar_excluded(a[0], b[0]) or _dollar_excluded(b[0], a[0]):
        return False
    na, nb = len(a), len(b)
    for i in range(max(na, nb)):
        if i >= na:
            return b[i] == "#"  # only "x/#" can also match the shorter filter's topics (parent rule)
        if i >= nb:
            return a[i] == "#"
        x, y = a[i], b[i]
        if x == "#" or y == "#":
            return True
        if x != y and x != "+" and y != "+":
            return False
    return True


def filters_overlap(a: str, b: str) -> bool:
    """True if some topic name is matched by both filters (conservatively counting the empty topic)."""
    return filters_overlap_levels(a.split("/"), b.split("/"))
