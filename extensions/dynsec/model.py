"""The dynamic-security configuration, sans-IO: clients, groups, roles with their ACLs, and the default access, as
Mosquitto's plugin keeps them (plugins/dynamic-security in Mosquitto 2.0), and their JSON document.

A client is a user name with a salted PBKDF2-SHA512 password hash (the password file's `$7$` form:
`extensions.password_file.mosquitto_hash`), never the password; an optional client id it must connect with, roles
and groups with priorities, a disabled flag and an optional tenant. The document is what the store keeps
(`Store.put_document`); `Config.to_json` never writes a password hash into anything but that document
(`client_json` leaves it out).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

# ACL types, as Mosquitto spells them (matched without regard to case, stored as spelled here)
PUBLISH_SEND = "publishClientSend"
PUBLISH_RECEIVE = "publishClientReceive"
SUBSCRIBE_LITERAL = "subscribeLiteral"
SUBSCRIBE_PATTERN = "subscribePattern"
UNSUBSCRIBE_LITERAL = "unsubscribeLiteral"
UNSUBSCRIBE_PATTERN = "unsubscribePattern"
ACL_TYPES = (PUBLISH_SEND, PUBLISH_RECEIVE, SUBSCRIBE_LITERAL, SUBSCRIBE_PATTERN, UNSUBSCRIBE_LITERAL,
             UNSUBSCRIBE_PATTERN)
# Default access kinds (`setDefaultACLAccess`)
SUBSCRIBE = "subscribe"
UNSUBSCRIBE = "unsubscribe"
DEFAULT_KINDS = (PUBLISH_SEND, PUBLISH_RECEIVE, SUBSCRIBE, UNSUBSCRIBE)
# What `mosquitto_ctrl dynsec init` writes: clients may not publish or subscribe until a role says so.
INITIAL_DEFAULTS = {PUBLISH_SEND: False, PUBLISH_RECEIVE: True, SUBSCRIBE: False, UNSUBSCRIBE: True}
NO_PRIORITY = -1  # a client's role or group without a priority (Mosquitto's -1, left out of listings)
CONTROL_TOPIC = "$CONTROL/dynamic-security/v1"
RESPONSE_TOPIC = CONTROL_TOPIC + "/response"
# The admin role `dynsec init` makes: what a client needs to send commands and read their answers.
ADMIN_ACLS = ((PUBLISH_SEND, "$CONTROL/dynamic-security/#"), (PUBLISH_RECEIVE, "$CONTROL/dynamic-security/#"),
              (SUBSCRIBE_PATTERN, "$CONTROL/dynamic-security/#"), (PUBLISH_RECEIVE, "$SYS/#"),
              (SUBSCRIBE_PATTERN, "$SYS/#"), (PUBLISH_RECEIVE, "#"), (SUBSCRIBE_PATTERN, "#"),
              (UNSUBSCRIBE_PATTERN, "#"))


def canonical_acl_type(name: str) -> str | None:
    """The ACL type `name` stands for (case-insensitive, as Mosquitto's strcasecmp), None if it is none."""
    lowered = name.lower()
    return next((t for t in ACL_TYPES if t.lower() == lowered), None)


@dataclass(frozen=True, slots=True)
class Acl:
    acltype: str
    topic: str
    priority: int = 0
    allow: bool = False


@dataclass(frozen=True, slots=True)
class Link:
    """A client's or group's role, or a client's group, with its priority (higher first)."""

    name: str
    priority: int = NO_PRIORITY


@dataclass(slots=True)
class Role:
    rolename: str
    textname: str | None = None
    textdescription: str | None = None
    acls: list[Acl] = field(default_factory=list)


@dataclass(slots=True)
class Group:
    groupname: str
    textname: str | None = None
    textdescription: str | None = None
    roles: list[Link] = field(default_factory=list)


@dataclass(slots=True)
class Client:
    username: str
    password: str | None = None  # `$7$<iterations>$<salt>$<hash>`; None: cannot log in with a password
    clientid: str | None = None  # when set, the only client id this user may connect with
    textname: str | None = None
    textdescription: str | None = None
    disabled: bool = False
    roles: list[Link] = field(default_factory=list)
    groups: list[Link] = field(default_factory=list)
    tenant: str | None = None  # the tenant the client belongs to (`AuthDecision.tenant`); None: the default one


@dataclass(slots=True)
class Config:
    clients: dict[str, Client] = field(default_factory=dict)
    roles: dict[str, Role] = field(default_factory=dict)
    groups: dict[str, Group] = field(default_factory=dict)
    defaults: dict[str, bool] = field(default_factory=lambda: dict(INITIAL_DEFAULTS))

    def clone(self) -> Config:
        """A copy a command may change without touching this one (records copied, their lists too)."""
        return Config({k: replace(c, roles=list(c.roles), groups=list(c.groups)) for k, c in self.clients.items()},
                      {k: replace(r, acls=list(r.acls)) for k, r in self.roles.items()},
                      {k: replace(g, roles=list(g.roles)) for k, g in self.groups.items()},
                      dict(self.defaults))

    # --- the stored document ------------------------------------------------------------------------------
    def to_json(self) -> bytes:
        return json.dumps({
            "clients": [_client_doc(c) for c in self.clients.values()],
            "roles": [role_json(r) for r in self.roles.values()],
            "groups": [group_json(g) for g in self.groups.values()],
            "defaultACLAccess": dict(self.defaults)}, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Config:
        """The stored document; ValueError if it is not one (a damaged or foreign value: never half read)."""
        try:
            doc = json.loads(data)
            config = cls()
            for r in doc.get("roles", []):
                config.roles[str(r["rolename"])] = Role(
                    str(r["rolename"]), _opt(r.get("textname")), _opt(r.get("textdescription")),
                    [Acl(str(a["acltype"]), str(a["topic"]), int(a.get("priority", 0)), bool(a.get("allow", False)))
                     for a in r.get("acls", [])])
            for g in doc.get("groups", []):
                config.groups[str(g["groupname"])] = Group(
                    str(g["groupname"]), _opt(g.get("textname")), _opt(g.get("textdescription")), _links(g, "roles"))
            for c in doc.get("clients", []):
                config.clients[str(c["username"])] = Client(
                    str(c["username"]), _opt(c.get("password")), _opt(c.get("clientid")), _opt(c.get("textname")),
                    _opt(c.get("textdescription")), bool(c.get("disabled", False)), _links(c, "roles"),
                    _links(c, "groups"), _opt(c.get("tenant")))
            defaults = doc.get("defaultACLAccess", {})
            for kind in DEFAULT_KINDS:
                if kind in defaults:
                    config.defaults[kind] = bool(defaults[kind])
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise ValueError(f"not a dynamic-security document: {exc}") from None
        return config


def _opt(value: Any) -> str | None:
    return None if value is None else str(value)


def _links(doc: dict[str, Any], key: str) -> list[Link]:
    name_key = "rolename" if key == "roles" else "groupname"
    return [Link(str(item[name_key]), int(item.get("priority", NO_PRIORITY))) for item in doc.get(key, [])]


def _link_json(link: Link, name_key: str) -> dict[str, Any]:
    out: dict[str, Any] = {name_key: link.name}
    if link.priority != NO_PRIORITY:
        out["priority"] = link.priority
    return out


def client_json(client: Client) -> dict[str, Any]:
    """A client as Mosquitto's getClient/listClients (verbose) show it: never its password hash."""
    out: dict[str, Any] = {"username": client.username}
    for key in ("clientid", "textname", "textdescription"):
        if (value := getattr(client, key)) is not None:
            out[key] = value
    if client.disabled:
        out["disabled"] = True
    out["roles"] = [_link_json(link, "rolename") for link in client.roles]
    out["groups"] = [_link_json(link, "groupname") for link in client.groups]
    if client.tenant is not None:
        out["tenant"] = client.tenant
    return out


def _client_doc(client: Client) -> dict[str, Any]:
    out = client_json(client)
    if client.password is not None:
        out["password"] = client.password
    return out


def role_json(role: Role) -> dict[str, Any]:
    out: dict[str, Any] = {"rolename": role.rolename}
    if role.textname is not None:
        out["textname"] = role.textname
    if role.textdescription is not None:
        out["textdescription"] = role.textdescription
    # Grouped by type in Mosquitto's order, each type by priority (highest first), as Mosquitto lists them.
    out["acls"] = [{"acltype": a.acltype, "topic": a.topic, "priority": a.priority, "allow": a.allow}
                   for t in ACL_TYPES for a in by_priority([a for a in role.acls if a.acltype == t])]
    return out


def group_json(group: Group) -> dict[str, Any]:
    out: dict[str, Any] = {"groupname": group.groupname}
    if group.textname is not None:
        out["textname"] = group.textname
    if group.textdescription is not None:
        out["textdescription"] = group.textdescription
    out["roles"] = [_link_json(link, "rolename") for link in group.roles]
    return out


def by_priority(items: list[Any]) -> list[Any]:
    """Highest priority first; equal priorities keep the order they were added in (Mosquitto's in-order insert)."""
    return sorted(items, key=lambda item: -item.priority)
