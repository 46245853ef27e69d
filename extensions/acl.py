"""Mosquitto-compatible `acl_file` authorizer, so operators can reuse their existing ACL files.

Semantics follow mosquitto 2.0 (src/security_default.c), the reference implementation:

* Lines: ``#`` comments and blank lines are skipped (we also accept indented comments).
  ``topic [read|write|readwrite|deny] <topic>`` (access defaults to readwrite; the topic is the rest of the
  line, so it may contain spaces only when the access word is given), ``user <username>`` starts a user
  section, ``pattern [read|write|readwrite|deny] <topic>`` applies to every client with ``%c`` -> client id
  and ``%u`` -> username substituted. Anything else is a syntax error (``ValueError`` naming the line).
* ``topic`` lines before the first ``user`` line apply to anonymous clients (username None) only. A client
  with a username gets only its own section's ``topic`` lines (none if it has no section) plus patterns.
* Evaluation, as in mosquitto: first the client's topic list, then the pattern list. Within each list any
  matching ``deny`` refuses access; otherwise a matching grant with the needed access allows it; otherwise
  evaluation falls through to the next list, and access is denied at the end. So a grant in a user
  section wins over a ``deny`` pattern (mosquitto behaves the same way).
* A pattern containing ``%u`` never applies to an anonymous client. If the file has any pattern, a client
  whose username or client id contains ``+`` or ``#`` gets nothing from the pattern list (wildcard
  injection guard, as mosquitto).
* ``$`` topics are only matched by ACL topics starting with ``$`` (standard MQTT matching).
* Publish needs ``write``; ``allow_read`` (the per-message delivery check mosquitto does) needs ``read``.
* Subscribe: mosquitto 2.0 does not check SUBSCRIBE in its ACL file and filters at delivery instead. We
  check at subscribe time so delivery needs no per-message ACL work: a filter is allowed when a ``read``
  grant *covers* it (every topic the filter can match is matched by the grant: ``sensors/#`` covers
  ``sensors/+/temp``; ``sensors/+`` does not cover ``sensors/#``) and no ``deny`` in the same list
  *overlaps* it (some topic matched by both). A filter that grants only overlap (``#`` with ``topic read #``
  and ``topic deny secret/#``) is granted FILTERED: each delivery is then checked, as Mosquitto does. One
  that no grant overlaps is refused.

Cost: topic lists and fixed patterns are compiled once into tries (publish checks are O(topic levels));
patterns with ``%c``/``%u`` are compiled per client and kept in a bounded LRU keyed by (client id, username).
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tidewire.extensions.hooks import ClientInfo, SubscribeAccess
from tidewire.gateway.core.topics import FilterTrie, filter_covers_levels, filters_overlap_levels, valid_topic_filter

READ = 1
WRITE = 2
DENY = 4
_ACCESS_WORDS = {"read": READ, "write": WRITE, "readwrite": READ | WRITE, "deny": DENY}
_SUBST = re.compile(r"%([cu])")
_WILD = ("+", "#")


@dataclass(slots=True, frozen=True)
class AclRule:
    """One parsed ``topic``/``pattern`` line; access is a mask of READ/WRITE, or DENY."""

    access: int
    topic: str
    line: int


class _RuleSet:
    """One evaluation list (deny-first): a trie for topic checks, first-level indexes for filter checks."""

    __slots__ = ("_denies", "_denies_by_first", "_denies_wild", "_reads_by_first", "_reads_wild", "_trie")

    def __init__(self, rules: Iterable[tuple[int, str]]) -> None:
        self._trie: FilterTrie[int] = FilterTrie()
        self._denies: list[list[str]] = []
        self._denies_by_first: dict[str, list[list[str]]] = {}
        self._denies_wild: list[list[str]] = []
        self._reads_by_first: dict[str, list[list[str]]] = {}
        self._reads_wild: list[list[str]] = []
        for access, topic in rules:
            levels = topic.split("/")
            wild_first = levels[0] in _WILD
            if access == DENY:
                self._trie.add(topic, DENY)
                self._denies.append(levels)
                if wild_first:
                    self._denies_wild.append(levels)
                else:
                    self._denies_by_first.setdefault(levels[0], []).append(levels)
                continue
            # One trie value per access bit, so "is WRITE granted" is a set lookup.
            for bit in (READ, WRITE):
                if access & bit:
                    self._trie.add(topic, bit)
            if access & READ:
                if wild_first:
                    self._reads_wild.append(levels)
                else:
                    self._reads_by_first.setdefault(levels[0], []).append(levels)

    def check_topic(self, topic: str, need: int) -> bool | None:
        """False if denied, True if granted, None if this list has no matching rule."""
        granted = False
        for _, values in self._trie.match(topic):
            if DENY in values:
                return False
            if need in values:
                granted = True
        return True if granted else None

    def check_filter(self, levels: list[str]) -> bool | None:
        """Subscribe check: False if a deny overlaps, True if a read grant covers, else None."""
        first = levels[0]
        first_wild = first in _WILD
        denies = self._denies if first_wild else self._denies_by_first.get(first, []) + self._denies_wild
        for deny in denies:
            if filters_overlap_levels(deny, levels):
                return False
        # A grant with a literal first level can never cover a filter whose first level is a wildcard.
        candidates = (
            self._reads_wild if first_wild else self._reads_by_first.get(first, []) + self._reads_wild
        )
        for grant in candidates:
            if filter_covers_levels(grant, levels):
                return True
        return None

    def read_overlaps(self, levels: list[str]) -> bool:
        """Some topic the filter matches is granted read here (deny rules aside)."""
        first = levels[0]
        if first in _WILD:
            grants: Iterable[list[str]] = [g for gs in self._reads_by_first.values() for g in gs]
        else:
            grants = self._reads_by_first.get(first, [])
        return any(filters_overlap_levels(g, levels) for g in (*grants, *self._reads_wild))


class _ClientAcl:
    """What one client is checked against: its topic list, then its pattern lists."""

    __slots__ = ("patterns", "topics")

    def __init__(self, topics: _RuleSet | None, patterns: tuple[_RuleSet, ...]) -> None:
        self.topics = topics
        self.patterns = patterns


def _decide_topic(sets: tuple[_RuleSet, ...], topic: str, need: int) -> bool | None:
    # Several pattern sets form one mosquitto list: a deny anywhere in it beats a grant anywhere in it.
    granted = False
    for rule_set in sets:
        verdict = rule_set.check_topic(topic, need)
        if verdict is False:
            return False
        granted = granted or verdict is True
    return True if granted else None


def _decide_filter(sets: tuple[_RuleSet, ...], levels: list[str]) -> bool | None:
    granted = False
    for rule_set in sets:
        verdict = rule_set.check_filter(levels)
        if verdict is False:
            return False
        granted = granted or verdict is True
    return True if granted else None


class AclFile:
    """Authorizer backed by a mosquitto ``acl_file``; see the module docstring for the exact semantics."""

    __slots__ = ("_anon", "_cache", "_cache_size", "_dynamic_patterns", "_has_patterns", "_static", "_users")

    def __init__(
        self,
        anonymous: list[AclRule],
        users: dict[str, list[AclRule]],
        patterns: list[AclRule],
        cache_size: int = 4096,
    ) -> None:
        if cache_size < 1:
            raise ValueError("cache_size must be >= 1")
        self._anon = _RuleSet((r.access, r.topic) for r in anonymous) if anonymous else None
        self._users = {name: _RuleSet((r.access, r.topic) for r in rules) for name, rules in users.items()}
        self._has_patterns = bool(patterns)
        fixed = [(r.access, r.topic) for r in patterns if "%c" not in r.topic and "%u" not in r.topic]
        self._static = _RuleSet(fixed) if fixed else None
        self._dynamic_patterns = [r for r in patterns if "%c" in r.topic or "%u" in r.topic]
        self._cache: OrderedDict[tuple[str, str | None], _ClientAcl] = OrderedDict()
        self._cache_size = cache_size

    @classmethod
    def load(cls, path: str | Path, cache_size: int = 4096) -> AclFile:
        text = Path(path).read_text(encoding="utf-8")
        try:
            return cls.parse(text, cache_size=cache_size)
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None

    @classmethod
    def parse(cls, text: str, cache_size: int = 4096) -> AclFile:
        anonymous: list[AclRule] = []
        users: dict[str, list[AclRule]] = {}
        patterns: list[AclRule] = []
        user: str | None = None
        for lineno, raw in enumerate(text.splitlines(), start=1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            keyword, _, rest = line.partition(" ")
            rest = rest.strip()
            if keyword == "user":
                if not rest:
                    raise ValueError(f"line {lineno}: missing username")
                user = rest
                users.setdefault(user, [])
                continue
            if keyword not in ("topic", "pattern"):
                raise ValueError(f"line {lineno}: unknown keyword {keyword!r}")
            if not rest:
                raise ValueError(f"line {lineno}: empty topic")
            first, _, remainder = rest.partition(" ")
            remainder = remainder.strip()
            if remainder:
                access = _ACCESS_WORDS.get(first)
                if access is None:
                    raise ValueError(
                        f"line {lineno}: invalid access type {first!r} (read|write|readwrite|deny)"
                    )
                topic = remainder
            else:
                # A single word is always the topic, as in mosquitto ("topic read" grants topic "read").
                access, topic = READ | WRITE, first
            if not valid_topic_filter(topic):
                raise ValueError(f"line {lineno}: invalid ACL topic {topic!r}")
            rule = AclRule(access, topic, lineno)
            if keyword == "pattern":
                patterns.append(rule)
            elif user is None:
                anonymous.append(rule)
            else:
                users[user].append(rule)
        return cls(anonymous, users, patterns, cache_size=cache_size)

    @classmethod
    def from_grants(cls, grants: Iterable[tuple[str, str]], cache_size: int = 16) -> AclFile:
        """Per-client grants (JWT claims, HTTP hook rules): (access word, topic filter) pairs applied as
        patterns, so ``%c``/``%u`` are substituted; everything not granted is denied. ValueError on a bad
        access word or filter."""
        rules: list[AclRule] = []
        for number, (word, topic) in enumerate(grants, start=1):
            access = _ACCESS_WORDS.get(word)
            if access is None:
                raise ValueError(f"grant {number}: invalid access {word!r} (read|write|readwrite|deny)")
            if not isinstance(topic, str) or not valid_topic_filter(topic):
                raise ValueError(f"grant {number}: invalid topic filter {topic!r}")
            rules.append(AclRule(access, topic, number))
        return cls([], {}, rules, cache_size=cache_size)

    def _client(self, client: ClientInfo) -> _ClientAcl:
        key = (client.client_id, client.username)
        cache = self._cache
        acl = cache.get(key)
        if acl is not None:
            cache.move_to_end(key)
            return acl
        acl = self._compile(client)
        cache[key] = acl
        if len(cache) > self._cache_size:
            cache.popitem(last=False)
        return acl

    def _compile(self, client: ClientInfo) -> _ClientAcl:
        username = client.username
        topics = self._anon if username is None else self._users.get(username)
        if self._has_patterns and (_dangerous(client.client_id) or _dangerous(username or "")):
            return _ClientAcl(topics, ())
        patterns: list[_RuleSet] = [self._static] if self._static is not None else []
        dynamic: list[tuple[int, str]] = []
        for rule in self._dynamic_patterns:
            if username is None and "%u" in rule.topic:
                continue
            topic = _substitute(rule.topic, client.client_id, username)
            # A substituted id may break filter syntax (e.g. an empty level structure is fine, NUL is not).
            if valid_topic_filter(topic):
                dynamic.append((rule.access, topic))
        if dynamic:
            patterns.append(_RuleSet(dynamic))
        return _ClientAcl(topics, tuple(patterns))

    def _check_topic(self, client: ClientInfo, topic: str, need: int) -> bool:
        acl = self._client(client)
        if acl.topics is not None:
            verdict = acl.topics.check_topic(topic, need)
            if verdict is not None:
                return verdict
        return _decide_topic(acl.patterns, topic, need) is True

    def allow_publish(self, client: ClientInfo, topic: str) -> bool:
        return self._check_topic(client, topic, WRITE)

    def allow_read(self, client: ClientInfo, topic: str) -> bool:
        """Delivery-time read check for one topic (mosquitto's per-message semantics)."""
        return self._check_topic(client, topic, READ)

    def allow_subscribe(self, client: ClientInfo, topic_filter: str) -> bool:
        acl = self._client(client)
        levels = topic_filter.split("/")
        if acl.topics is not None:
            verdict = acl.topics.check_filter(levels)
            if verdict is not None:
                return verdict
        return _decide_filter(acl.patterns, levels) is True

    def subscribe_access(self, client: ClientInfo, topic_filter: str) -> SubscribeAccess:
        """GRANTED when a read grant covers the filter and no deny overlaps it; FILTERED when some grant
        overlaps it (deliveries are then checked one by one, as Mosquitto does); else DENIED."""
        if self.allow_subscribe(client, topic_filter):
            return SubscribeAccess.GRANTED
        if "+" not in topic_filter and "#" not in topic_filter:  # one topic: readable or not
            return SubscribeAccess.GRANTED if self.allow_read(client, topic_filter) else SubscribeAccess.DENIED
        acl = self._client(client)
        levels = topic_filter.split("/")
        sets = (acl.topics, *acl.patterns) if acl.topics is not None else acl.patterns
        if any(rule_set.read_overlaps(levels) for rule_set in sets):
            return SubscribeAccess.FILTERED
        return SubscribeAccess.DENIED


def _dangerous(name: str) -> bool:
    return "+" in name or "#" in name


def _substitute(pattern: str, client_id: str, username: str | None) -> str:
    # Single left-to-right pass (like mosquitto) so a client id containing "%u" is not substituted again.
    def repl(m: re.Match[str]) -> str:
        if m.group(1) == "c":
            return client_id
        return username if username is not None else m.group(0)

    return _SUBST.sub(repl, pattern)
