"""Topic rewrite rules (EMQX's `rewrite`), sans-IO: the topic of a PUBLISH or a will, or the filter of a
SUBSCRIBE or UNSUBSCRIBE, as the rules make it, before anything else looks at it (the ACL included).

Rules apply in their configured order; the first rule of the packet's kind (`publish`, `subscribe`, or `all`)
whose `source_topic` filter matches the topic decides: if its regex is found in the topic, the topic becomes
`dest_topic` with `$1`, `$2`... replaced by the regex's groups and `${clientid}`, `${username}` by the client's;
if not, the topic stays as it is (later rules are not tried, as EMQX). A `$share/<group>/` or `$exclusive/`
prefix is kept and the rules see the filter after it. A result that is no valid topic name (or filter) leaves
the topic as it was; the caller logs it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from tidewire.gateway.core.topics import filter_covers, matches, valid_topic_filter, valid_topic_name

EXCLUSIVE_PREFIX = "$exclusive/"
_GROUP = re.compile(r"\$(\d+)")


class RuleSpec(Protocol):
    """What a configured rule gives (`gateway.config.TopicRewriteRule`)."""

    @property
    def action(self) -> str: ...

    @property
    def source_topic(self) -> str: ...

    @property
    def re(self) -> str: ...

    @property
    def dest_topic(self) -> str: ...


@dataclass(frozen=True, slots=True)
class _Rule:
    source: str
    pattern: re.Pattern[str]
    dest: str


@dataclass(frozen=True, slots=True)
class Rewritten:
    """A rule applied: the new topic, or `invalid` (the rule's result was no valid topic: the topic stays)."""

    topic: str
    invalid: bool = False


class TopicRewriter:
    """The node's rules, compiled once."""

    __slots__ = ("_publish", "_subscribe", "active")

    def __init__(self, rules: Sequence[RuleSpec]) -> None:
        self._publish = [_Rule(r.source_topic, re.compile(r.re), r.dest_topic) for r in rules
                         if r.action in ("publish", "all")]
        self._subscribe = [_Rule(r.source_topic, re.compile(r.re), r.dest_topic) for r in rules
                           if r.action in ("subscribe", "all")]
        self.active = bool(self._publish or self._subscribe)  # an attribute: every PUBLISH reads it

    def publish(self, topic: str, client_id: str, username: str | None) -> Rewritten | None:
        """A PUBLISH (or will) topic rewritten; None: no rule changed it."""
        if not self._publish:
            return None
        found = _apply(self._publish, topic, client_id, username, filter_mode=False)
        if found is None or found == topic:
            return None
        return Rewritten(found) if valid_topic_name(found) else Rewritten(topic, invalid=True)

    def subscribe(self, topic_filter: str, client_id: str, username: str | None) -> Rewritten | None:
        """A SUBSCRIBE or UNSUBSCRIBE filter rewritten (its `$share/<group>/` or `$exclusive/` prefix kept);
        None: no rule changed it."""
        if not self._subscribe:
            return None
        prefix, inner = split_prefix(topic_filter)
        found = _apply(self._subscribe, inner, client_id, username, filter_mode=True)
        if found is None or found == inner:
            return None
        return Rewritten(prefix + found) if valid_topic_filter(found) else Rewritten(topic_filter, invalid=True)


def split_prefix(topic_filter: str) -> tuple[str, str]:
    """(`$share/<group>/` or `$exclusive/` or "", the filter after it)."""
    if topic_filter.startswith("$share/"):
        group_end = topic_filter.find("/", 7)
        if group_end > 7:
            return topic_filter[: group_end + 1], topic_filter[group_end + 1 :]
    elif topic_filter.startswith(EXCLUSIVE_PREFIX):
        return EXCLUSIVE_PREFIX, topic_filter[len(EXCLUSIVE_PREFIX) :]
    return "", topic_filter


def _apply(rules: list[_Rule], topic: str, client_id: str, username: str | None, *, filter_mode: bool) -> str | None:
    for rule in rules:
        # A filter is taken as matching when the source covers it (EMQX's emqx_topic:match on filters).
        if not (filter_covers(rule.source, topic) if filter_mode else matches(rule.source, topic)):
            continue
        found = rule.pattern.search(topic)
        if found is None:
            return None
        dest = _substitute(rule.dest, found.groups()).replace("${clientid}", client_id)
        if username:
            dest = dest.replace("${username}", username)
        return dest
    return None


def _substitute(dest: str, groups: tuple[str | None, ...]) -> str:
    return _GROUP.sub(lambda m: _group(groups, int(m.group(1))), dest)


def _group(groups: tuple[str | None, ...], index: int) -> str:
    if 0 < index <= len(groups):
        return groups[index - 1] or ""
    return "$" + str(index)  # no such group: left as written, as EMQX leaves it
