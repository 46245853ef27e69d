"""What a dynamic-security client may do, sans-IO: Mosquitto's ACL evaluation (plugins/dynamic-security/acl.c) over
a `Config`, with `%c` and `%u` in role ACL topics (which Mosquitto 2.0 did not substitute).

Order, as Mosquitto: the client's roles by priority (highest first), then its groups by priority, each group's roles
by priority; within a role its ACLs of the type asked about by priority. The first ACL whose topic matches decides
(allow or deny). Subscribe: in each role an exact `subscribeLiteral` first, then `subscribePattern`s, a pattern
matching a filter when it covers it (`covers`, Mosquitto's sub_acl_check). Nothing matching: the default access of
that kind, except that `$CONTROL/...` topics are never reached by default: they must be granted.

`%c`/`%u` are replaced by the client id / user name in a single pass. A client id or user name holding `+` or `#`
gets nothing from an ACL that names it (it would widen the grant), and neither does one holding `/` in a
`subscribeLiteral` (a literal names one filter exactly).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from tidewire.extensions.dynsec.model import (
    PUBLISH_RECEIVE,
    PUBLISH_SEND,
    SUBSCRIBE,
    SUBSCRIBE_LITERAL,
    SUBSCRIBE_PATTERN,
    UNSUBSCRIBE,
    UNSUBSCRIBE_LITERAL,
    UNSUBSCRIBE_PATTERN,
    Acl,
    Config,
    Role,
    by_priority,
)
from tidewire.gateway.core.topics import matches

_SUBST = re.compile(r"%([cu])")
_COMPILED_CACHE = 4096  # clients whose ordered ACL lists are kept per configuration


def covers(acl: str, sub: str) -> bool:
    """Does ACL pattern `acl` cover subscription filter `sub` (Mosquitto's sub_acl_check): `+` in the ACL stands for
    any one level of the filter (a `+` too), a trailing `#` for the rest (a filter's `#` needs the ACL's)."""
    if acl == "#":
        return True
    acl_levels, sub_levels = acl.split("/"), sub.split("/")
    acl_hash = acl_levels[-1] == "#"
    if acl_hash:
        acl_levels.pop()
    if sub_levels[-1] == "#":
        if not acl_hash:
            return False
        sub_levels.pop()
    if len(acl_levels) > len(sub_levels) or (len(sub_levels) > len(acl_levels) and not acl_hash):
        return False
    return all(a == "+" or a == s for a, s in zip(acl_levels, sub_levels, strict=False))


def substitute(topic: str, client_id: str, username: str, literal: bool = False) -> str | None:
    """The ACL topic for this client, or None when the client's names would change its shape."""
    if "%" not in topic:
        return topic
    for name in (client_id, username):
        if "+" in name or "#" in name or (literal and "/" in name):
            return None
    return _SUBST.sub(lambda m: client_id if m.group(1) == "c" else username, topic)


class Grants:
    """Access checks over one configuration (immutable: a change makes a new `Grants`), with each client's ordered
    ACL lists kept in a bounded cache."""

    __slots__ = ("_cache", "_sorted", "config")

    def __init__(self, config: Config) -> None:
        self.config = config
        self._cache: dict[tuple[str, str], list[Role]] = {}
        self._sorted: dict[tuple[str, str], list[Acl]] = {}  # (role, ACL type) -> its ACLs, highest priority first

    def _acls(self, role: Role, acltype: str) -> list[Acl]:
        key = (role.rolename, acltype)
        acls = self._sorted.get(key)
        if acls is None:
            acls = self._sorted[key] = by_priority([a for a in role.acls if a.acltype == acltype])
        return acls

    def _roles(self, username: str, client_id: str) -> list[Role]:
        key = (username, client_id)
        roles = self._cache.get(key)
        if roles is None:
            roles = list(self._ordered_roles(username))
            if len(self._cache) >= _COMPILED_CACHE:
                self._cache.clear()
            self._cache[key] = roles
        return roles

    def _ordered_roles(self, username: str) -> Iterator[Role]:
        config = self.config
        client = config.clients.get(username)
        if client is None:
            return
        for link in by_priority(client.roles):
            if (role := config.roles.get(link.name)) is not None:
                yield role
        for group_link in by_priority(client.groups):
            group = config.groups.get(group_link.name)
            if group is None:
                continue
            for link in by_priority(group.roles):
                if (role := config.roles.get(link.name)) is not None:
                    yield role

    def known(self, username: str | None) -> bool:
        return username is not None and username in self.config.clients

    def _default(self, kind: str, topic: str) -> bool:
        return self.config.defaults.get(kind, False) and not topic.startswith("$CONTROL")

    def _topic_check(self, acltype: str, kind: str, username: str, client_id: str, topic: str) -> bool:
        for role in self._roles(username, client_id):
            for acl in self._acls(role, acltype):
                pattern = substitute(acl.topic, client_id, username)
                if pattern is not None and matches(pattern, topic):
                    return acl.allow
        return self._default(kind, topic)

    def _filter_check(self, literal_type: str, pattern_type: str, kind: str, username: str, client_id: str,
                      topic_filter: str) -> bool:
        for role in self._roles(username, client_id):
            decided = self._role_filter_check(role, literal_type, pattern_type, username, client_id, topic_filter)
            if decided is not None:
                return decided
        return self._default(kind, topic_filter)

    def _role_filter_check(self, role: Role, literal_type: str, pattern_type: str, username: str, client_id: str,
                           topic_filter: str) -> bool | None:
        for acl in self._acls(role, literal_type):  # Mosquitto: one exact lookup per role, before its patterns
            if substitute(acl.topic, client_id, username, literal=True) == topic_filter:
                return acl.allow
        for acl in self._acls(role, pattern_type):
            pattern = substitute(acl.topic, client_id, username)
            if pattern is not None and covers(pattern, topic_filter):
                return acl.allow
        return None

    def may_publish(self, username: str, client_id: str, topic: str) -> bool:
        return self._topic_check(PUBLISH_SEND, PUBLISH_SEND, username, client_id, topic)

    def may_receive(self, username: str, client_id: str, topic: str) -> bool:
        return self._topic_check(PUBLISH_RECEIVE, PUBLISH_RECEIVE, username, client_id, topic)

    def may_subscribe(self, username: str, client_id: str, topic_filter: str) -> bool:
        return self._filter_check(SUBSCRIBE_LITERAL, SUBSCRIBE_PATTERN, SUBSCRIBE, username, client_id, topic_filter)

    def may_unsubscribe(self, username: str, client_id: str, topic_filter: str) -> bool:
        return self._filter_check(UNSUBSCRIBE_LITERAL, UNSUBSCRIBE_PATTERN, UNSUBSCRIBE, username, client_id,
                                  topic_filter)

    def receive_may_deny(self, username: str, client_id: str) -> bool:
        """Could a delivery to this client be refused (a publishClientReceive deny, or no default grant)? If not, its
        subscriptions need no check per message."""
        if not self.config.defaults.get(PUBLISH_RECEIVE, False):
            return True
        return any(not a.allow for role in self._roles(username, client_id) for a in role.acls
                   if a.acltype == PUBLISH_RECEIVE)
