"""Topic-level trie of retained messages: `match` walks only the branches a filter can reach."""

from __future__ import annotations

from collections.abc import Iterator

from tidewire.store.base import Message


class _Node:
    __slots__ = ("children", "message")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.message: Message | None = None


class RetainedIndex:
    def __init__(self) -> None:
        self._root = _Node()
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def get(self, topic: str) -> Message | None:
        node = self._root
        for level in topic.split("/"):
            child = node.children.get(level)
            if child is None:
                return None
            node = child
        return node.message

    def set(self, topic: str, message: Message) -> None:
        node = self._root
        for level in topic.split("/"):
            child = node.children.get(level)
            if child is None:
                child = node.children[level] = _Node()
            node = child
        if node.message is None:
            self._count += 1
        node.message = message

    def delete(self, topic: str) -> bool:
        """Remove the topic's message and prune branches left empty; False when there was none."""
        path: list[tuple[_Node, str]] = []
        node = self._root
        for level in topic.split("/"):
            child = node.children.get(level)
            if child is None:
                return False
            path.append((node, level))
            node = child
        if node.message is None:
            return False
        node.message = None
        self._count -= 1
        for parent, level in reversed(path):
            child = parent.children[level]
            if child.message is not None or child.children:
                break
            del parent.children[level]
        return True

    def items(self) -> Iterator[tuple[str, Message]]:
        """Every (topic, message); for compaction and stats, not for lookups."""
        stack: list[tuple[_Node, str | None]] = [(self._root, None)]
        while stack:
            node, prefix = stack.pop()
            for level, child in node.children.items():
                topic = level if prefix is None else f"{prefix}/{level}"
                if child.message is not None:
                    yield topic, child.message
                stack.append((child, topic))

    def match(self, topic_filter: str) -> list[Message]:
        levels = topic_filter.split("/")
        out: list[Message] = []
        self._match(self._root, levels, 0, out)
        return out

    def _match(self, node: _Node, levels: list[str], i: int, out: list[Message]) -> None:
        if i == len(levels):
            if node.message is not None:
                out.append(node.message)
            return
        level = levels[i]
        # MQTT 4.7.2: a filter starting with a wildcard does not match topics whose first level starts with $
        skip_dollar = i == 0
        if level == "#":
            if i > 0 and node.message is not None:
                out.append(node.message)  # "a/#" also matches "a"
            self._collect(node, out, skip_dollar)
        elif level == "+":
            for name, child in node.children.items():
                if skip_dollar and name.startswith("$"):
                    continue
                self._match(child, levels, i + 1, out)
        else:
            exact = node.children.get(level)
            if exact is not None:
                self._match(exact, levels, i + 1, out)

    @staticmethod
    def _collect(node: _Node, out: list[Message], skip_dollar: bool) -> None:
        stack: list[_Node] = []
        for name, child in node.children.items():
            if skip_dollar and name.startswith("$"):
                continue
            stack.append(child)
        while stack:
            node = stack.pop()
            if node.message is not None:
                out.append(node.message)
            stack.extend(node.children.values())
