"""Mosquitto's dynamic-security JSON commands, sans-IO: a request payload and the current `Config` in, the responses
(the same JSON shapes and error strings as Mosquitto 2.0's plugin, plugins/dynamic-security/*.c) and the changed
configuration out, with the user names whose connections must close.

Each command of a request applies on its own, in order (a failed one changes nothing and does not undo the ones
before it, as in Mosquitto). Passwords are hashed by the `hash_password` given (salted PBKDF2-SHA512) and never
appear in a response. Limits (`Limits`) bound what one configuration may hold.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tidewire.extensions.dynsec.model import (
    DEFAULT_KINDS,
    NO_PRIORITY,
    Acl,
    Client,
    Config,
    Group,
    Link,
    Role,
    canonical_acl_type,
    client_json,
    group_json,
    role_json,
)
from tidewire.gateway.core.topics import valid_topic_filter

MAX_NAME = 65535  # bytes of a user name, client id, role or group name (MQTT's string limit)
MAX_TEXT = 4096  # characters of a textname / textdescription / tenant


@dataclass(frozen=True, slots=True)
class Limits:
    max_clients: int = 100_000
    max_roles: int = 10_000
    max_groups: int = 10_000
    max_acls: int = 1_000  # per role
    max_commands: int = 100  # per request


@dataclass(slots=True)
class Result:
    responses: list[dict[str, Any]] = field(default_factory=list)
    config: Config | None = None  # the changed configuration to store; None: nothing changed
    kick: set[str] = field(default_factory=set)  # user names whose connections close (deleted, disabled, new id)

    def payload(self) -> bytes:
        return json.dumps({"responses": self.responses}, separators=(",", ":")).encode()


class _Fail(Exception):
    """A command's error response (Mosquitto's text)."""


_DEFAULT_LIMITS = Limits()


def run(config: Config, payload: bytes, hash_password: Callable[[str], str],
        limits: Limits = _DEFAULT_LIMITS) -> Result:
    """Apply a `$CONTROL/dynamic-security/v1` request to a copy of `config`."""
    result = Result()
    try:
        tree = json.loads(payload)
    except (ValueError, UnicodeDecodeError):
        result.responses.append({"command": "Unknown command", "error": "Payload not valid JSON"})
        return result
    commands = tree.get("commands") if isinstance(tree, dict) else None
    if not isinstance(commands, list):
        result.responses.append({"command": "Unknown command", "error": "Invalid/missing commands"})
        return result
    if len(commands) > limits.max_commands:
        result.responses.append({"command": "Unknown command",
                                 "error": f"Too many commands (at most {limits.max_commands})"})
        return result
    work = _Work(config.clone(), hash_password, limits)
    for command in commands:
        if not isinstance(command, dict):
            result.responses.append({"command": "Unknown command", "error": "Command not an object"})
            continue
        name = command.get("command")
        correlation = command.get("correlationData")
        if not isinstance(name, str):
            result.responses.append(_reply("Unknown command", "Missing command", correlation))
            continue
        if correlation is not None and not isinstance(correlation, str):
            result.responses.append({"command": name, "error": "Invalid correlationData data type."})
            break  # Mosquitto stops the request here
        handler = _HANDLERS.get(name.lower())
        if handler is None:
            result.responses.append(_reply(name, "Unknown command", correlation))
            continue
        spelled = _SPELLING[name.lower()]
        try:
            data = handler(work, command)
        except _Fail as fail:
            result.responses.append(_reply(spelled, str(fail), correlation))
            continue
        response: dict[str, Any] = {"command": spelled}
        if data is not None:
            response["data"] = data
        if correlation is not None:
            response["correlationData"] = correlation
        result.responses.append(response)
    if work.changed:
        result.config = work.config
    result.kick = work.kick
    return result


def _reply(command: str, error: str, correlation: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"command": command, "error": error}
    if isinstance(correlation, str):
        out["correlationData"] = correlation
    return out


class _Work:
    def __init__(self, config: Config, hash_password: Callable[[str], str], limits: Limits) -> None:
        self.config = config
        self.hash_password = hash_password
        self.limits = limits
        self.changed = False
        self.kick: set[str] = set()


# --- argument readers (Mosquitto's json_get_* with its messages) ------------------------------------------------
def _string(command: dict[str, Any], key: str, missing: str, optional: bool = False) -> str | None:
    value = command.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, str) or (not optional and not value):
        raise _Fail(missing)
    if len(value.encode("utf-8", "surrogatepass")) > MAX_NAME or "\x00" in value or _surrogates(value):
        raise _Fail(missing)
    return value


def _surrogates(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _text(command: dict[str, Any], key: str, missing: str) -> str | None:
    value = _string(command, key, missing, optional=True)
    if value is not None and len(value) > MAX_TEXT:
        raise _Fail(missing)
    return value


def _int(command: dict[str, Any], key: str, default: int) -> int:
    value = command.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return default
    return int(value)


def _bool(command: dict[str, Any], key: str, default: bool) -> bool:
    value = command.get(key, default)
    return value if isinstance(value, bool) else default


def _client(work: _Work, command: dict[str, Any]) -> Client:
    username = _string(command, "username", "Invalid/missing username")
    assert username is not None
    client = work.config.clients.get(username)
    if client is None:
        raise _Fail("Client not found")
    return client


def _role_name(command: dict[str, Any]) -> str:
    name = _string(command, "rolename", "Invalid/missing rolename")
    assert name is not None
    return name


def _links(work: _Work, command: dict[str, Any], key: str, missing_error: str, bad_error: str) -> list[Link] | None:
    """A `roles` / `groups` array (None: not given)."""
    items = command.get(key)
    if items is None:
        return None
    name_key, known = ("rolename", work.config.roles) if key == "roles" else ("groupname", work.config.groups)
    if not isinstance(items, list):
        raise _Fail(bad_error)
    links: list[Link] = []
    for item in items:
        name = item.get(name_key) if isinstance(item, dict) else None
        if not isinstance(name, str) or not name:
            raise _Fail(bad_error)
        if name not in known:
            raise _Fail(missing_error)
        links.append(Link(name, _int(item, "priority", NO_PRIORITY)))
    return links


def _changed(work: _Work) -> None:
    work.changed = True


# --- clients --------------------------------------------------------------------------------------------------------
def create_client(work: _Work, command: dict[str, Any]) -> None:
    username = _string(command, "username", "Invalid/missing username")
    assert username is not None
    password = _string(command, "password", "Invalid/missing password", optional=True)
    clientid = _string(command, "clientid", "Invalid/missing client id", optional=True)
    textname = _text(command, "textname", "Invalid/missing textname")
    textdescription = _text(command, "textdescription", "Invalid/missing textdescription")
    tenant = _text(command, "tenant", "Invalid/missing tenant")
    config = work.config
    if username in config.clients:
        raise _Fail("Client already exists")
    if len(config.clients) >= work.limits.max_clients:
        raise _Fail(f"Too many clients (at most {work.limits.max_clients})")
    roles = _links(work, command, "roles", "Role not found", "'roles' not an array or missing/invalid rolename")
    groups = _links(work, command, "groups", "Group not found", "'groups' not an array or missing/invalid groupname")
    hashed = work.hash_password(password) if password else None
    config.clients[username] = Client(username, hashed, clientid or None, textname, textdescription, False,
                                      roles or [], groups or [], tenant or None)
    _changed(work)


def delete_client(work: _Work, command: dict[str, Any]) -> None:
    client = _client(work, command)
    del work.config.clients[client.username]
    work.kick.add(client.username)
    _changed(work)


def _set_disabled(work: _Work, command: dict[str, Any], disabled: bool) -> None:
    client = _client(work, command)
    if client.disabled != disabled:
        client.disabled = disabled
        _changed(work)
    if disabled:
        work.kick.add(client.username)


def enable_client(work: _Work, command: dict[str, Any]) -> None:
    _set_disabled(work, command, False)


def disable_client(work: _Work, command: dict[str, Any]) -> None:
    _set_disabled(work, command, True)


def set_client_id(work: _Work, command: dict[str, Any]) -> None:
    _string(command, "username", "Invalid/missing username")
    clientid = _string(command, "clientid", "Invalid/missing client ID", optional=True)
    client = _client(work, command)
    if client.clientid != (clientid or None):
        client.clientid = clientid or None
        work.kick.add(client.username)  # Mosquitto too: a connection under another id must go
        _changed(work)


def set_client_password(work: _Work, command: dict[str, Any]) -> None:
    _string(command, "username", "Invalid/missing username")
    value = command.get("password")
    if not isinstance(value, str):
        raise _Fail("Invalid/missing password")
    if not value:
        raise _Fail("Empty password is not allowed")
    password = _string(command, "password", "Invalid/missing password")
    client = _client(work, command)
    assert password is not None
    client.password = work.hash_password(password)  # only the next login sees it: connected clients stay
    _changed(work)


def modify_client(work: _Work, command: dict[str, Any]) -> None:
    client = _client(work, command)
    clientid = _string(command, "clientid", "Invalid/missing client id", optional=True)
    password = _string(command, "password", "Invalid/missing password", optional=True)
    textname = _text(command, "textname", "Invalid/missing textname")
    textdescription = _text(command, "textdescription", "Invalid/missing textdescription")
    tenant = _text(command, "tenant", "Invalid/missing tenant")
    roles = _links(work, command, "roles", "Role not found", "'roles' not an array or missing/invalid rolename")
    groups = _links(work, command, "groups", "'groups' contains an object with a 'groupname' that does not exist",
                    "'groups' contains an object with an invalid 'groupname'")
    if clientid is not None and (clientid or None) != client.clientid:
        client.clientid = clientid or None
        work.kick.add(client.username)
    if password is not None:
        client.password = work.hash_password(password) if password else None
    if textname is not None:
        client.textname = textname
    if textdescription is not None:
        client.textdescription = textdescription
    if tenant is not None:
        client.tenant = tenant or None
    if roles is not None:
        client.roles = roles
    if groups is not None:
        client.groups = groups
    _changed(work)


def get_client(work: _Work, command: dict[str, Any]) -> dict[str, Any]:
    return {"client": client_json(_client(work, command))}


def _page(command: dict[str, Any], items: list[Any]) -> list[Any]:
    count = _int(command, "count", -1)
    offset = max(0, _int(command, "offset", 0))
    chosen = items[offset:]
    return chosen if count < 0 else chosen[:max(count, 1)]  # Mosquitto lists one when asked for 0


def list_clients(work: _Work, command: dict[str, Any]) -> dict[str, Any]:
    clients = sorted(work.config.clients.values(), key=lambda c: c.username)
    verbose = _bool(command, "verbose", False)
    return {"totalCount": len(clients),
            "clients": [client_json(c) if verbose else c.username for c in _page(command, clients)]}


def add_client_role(work: _Work, command: dict[str, Any]) -> None:
    _string(command, "username", "Invalid/missing username")
    rolename = _role_name(command)
    client = _client(work, command)
    if rolename not in work.config.roles:
        raise _Fail("Role not found")
    priority = _int(command, "priority", NO_PRIORITY)
    client.roles = [link for link in client.roles if link.name != rolename] + [Link(rolename, priority)]
    _changed(work)


def remove_client_role(work: _Work, command: dict[str, Any]) -> None:
    _string(command, "username", "Invalid/missing username")
    rolename = _role_name(command)
    client = _client(work, command)
    if rolename not in work.config.roles:
        raise _Fail("Role not found")
    client.roles = [link for link in client.roles if link.name != rolename]
    _changed(work)


# --- roles ----------------------------------------------------------------------------------------------------------
def _role(work: _Work, command: dict[str, Any], missing: str = "Role not found") -> Role:
    role = work.config.roles.get(_role_name(command))
    if role is None:
        raise _Fail(missing)
    return role


def _acls(work: _Work, command: dict[str, Any]) -> list[Acl] | None:
    items = command.get("acls")
    if not isinstance(items, list):
        return None
    acls: list[Acl] = []
    seen: set[tuple[str, str]] = set()
    for item in items:
        if not isinstance(item, dict):
            continue
        acltype = canonical_acl_type(str(item.get("acltype", "")))
        topic = item.get("topic")
        if acltype is None or not isinstance(topic, str) or not valid_topic_filter(topic):
            continue  # Mosquitto skips an entry it cannot use
        if (acltype, topic) in seen:
            continue
        seen.add((acltype, topic))
        acls.append(Acl(acltype, topic, _int(item, "priority", 0), _bool(item, "allow", False)))
    if len(acls) > work.limits.max_acls:
        raise _Fail(f"Too many ACLs (at most {work.limits.max_acls})")
    return acls


def create_role(work: _Work, command: dict[str, Any]) -> None:
    rolename = _role_name(command)
    textname = _text(command, "textname", "Invalid/missing textname")
    textdescription = _text(command, "textdescription", "Invalid/missing textdescription")
    config = work.config
    if rolename in config.roles:
        raise _Fail("Role already exists")
    if len(config.roles) >= work.limits.max_roles:
        raise _Fail(f"Too many roles (at most {work.limits.max_roles})")
    config.roles[rolename] = Role(rolename, textname, textdescription, _acls(work, command) or [])
    _changed(work)


def delete_role(work: _Work, command: dict[str, Any]) -> None:
    role = _role(work, command)
    config = work.config
    del config.roles[role.rolename]
    for client in config.clients.values():
        client.roles = [link for link in client.roles if link.name != role.rolename]
    for group in config.groups.values():
        group.roles = [link for link in group.roles if link.name != role.rolename]
    _changed(work)


def get_role(work: _Work, command: dict[str, Any]) -> dict[str, Any]:
    return {"role": role_json(_role(work, command))}


def list_roles(work: _Work, command: dict[str, Any]) -> dict[str, Any]:
    roles = sorted(work.config.roles.values(), key=lambda r: r.rolename)
    verbose = _bool(command, "verbose", False)
    return {"totalCount": len(roles),
            "roles": [role_json(r) if verbose else r.rolename for r in _page(command, roles)]}


def modify_role(work: _Work, command: dict[str, Any]) -> None:
    role = _role(work, command, "Role does not exist")
    textname = _text(command, "textname", "Invalid/missing textname")
    textdescription = _text(command, "textdescription", "Invalid/missing textdescription")
    acls = _acls(work, command)
    if textname is not None:
        role.textname = textname
    if textdescription is not None:
        role.textdescription = textdescription
    if acls is not None:
        role.acls = acls
    _changed(work)


def _acl_args(command: dict[str, Any]) -> tuple[str, str]:
    name = command.get("acltype")
    if not isinstance(name, str) or not name:
        raise _Fail("Invalid/missing acltype")
    acltype = canonical_acl_type(name)
    if acltype is None:
        raise _Fail("Unknown acltype")
    topic = command.get("topic")
    if not isinstance(topic, str) or not topic:
        raise _Fail("Invalid/missing topic")
    if _surrogates(topic):
        raise _Fail("Topic not valid UTF-8")
    if not valid_topic_filter(topic):
        raise _Fail("Invalid ACL topic")
    return acltype, topic


def add_role_acl(work: _Work, command: dict[str, Any]) -> None:
    role = _role(work, command)
    acltype, topic = _acl_args(command)
    if any(a.acltype == acltype and a.topic == topic for a in role.acls):
        raise _Fail("ACL with this topic already exists")
    if len(role.acls) >= work.limits.max_acls:
        raise _Fail(f"Too many ACLs (at most {work.limits.max_acls})")
    role.acls.append(Acl(acltype, topic, _int(command, "priority", 0), _bool(command, "allow", False)))
    _changed(work)


def remove_role_acl(work: _Work, command: dict[str, Any]) -> None:
    role = _role(work, command)
    acltype, topic = _acl_args(command)
    kept = [a for a in role.acls if not (a.acltype == acltype and a.topic == topic)]
    if len(kept) == len(role.acls):
        raise _Fail("ACL not found")
    role.acls = kept
    _changed(work)


# --- groups ---------------------------------------------------------------------------------------------------------
def _group_name(command: dict[str, Any]) -> str:
    name = _string(command, "groupname", "Invalid/missing groupname")
    assert name is not None
    return name


def _group(work: _Work, command: dict[str, Any]) -> Group:
    group = work.config.groups.get(_group_name(command))
    if group is None:
        raise _Fail("Group not found")
    return group


def create_group(work: _Work, command: dict[str, Any]) -> None:
    groupname = _group_name(command)
    textname = _text(command, "textname", "Invalid/missing textname")
    textdescription = _text(command, "textdescription", "Invalid/missing textdescription")
    config = work.config
    if groupname in config.groups:
        raise _Fail("Group already exists")
    if len(config.groups) >= work.limits.max_groups:
        raise _Fail(f"Too many groups (at most {work.limits.max_groups})")
    roles = _links(work, command, "roles", "Role not found", "'roles' not an array or missing/invalid rolename")
    config.groups[groupname] = Group(groupname, textname, textdescription, roles or [])
    _changed(work)


def delete_group(work: _Work, command: dict[str, Any]) -> None:
    group = _group(work, command)
    del work.config.groups[group.groupname]
    for client in work.config.clients.values():
        client.groups = [link for link in client.groups if link.name != group.groupname]
    _changed(work)


def get_group(work: _Work, command: dict[str, Any]) -> dict[str, Any]:
    group = _group(work, command)
    out = group_json(group)
    out["clients"] = [{"username": c.username} for c in sorted(work.config.clients.values(), key=lambda c: c.username)
                      if any(link.name == group.groupname for link in c.groups)]
    return {"group": out}


def list_groups(work: _Work, command: dict[str, Any]) -> dict[str, Any]:
    groups = sorted(work.config.groups.values(), key=lambda g: g.groupname)
    verbose = _bool(command, "verbose", False)
    return {"totalCount": len(groups),
            "groups": [group_json(g) if verbose else g.groupname for g in _page(command, groups)]}


def modify_group(work: _Work, command: dict[str, Any]) -> None:
    group = _group(work, command)
    textname = _text(command, "textname", "Invalid/missing textname")
    textdescription = _text(command, "textdescription", "Invalid/missing textdescription")
    roles = _links(work, command, "roles", "Role not found", "'roles' not an array or missing/invalid rolename")
    if textname is not None:
        group.textname = textname
    if textdescription is not None:
        group.textdescription = textdescription
    if roles is not None:
        group.roles = roles
    _changed(work)


def add_group_client(work: _Work, command: dict[str, Any]) -> None:
    _string(command, "username", "Invalid/missing username")
    group_name = _group_name(command)
    client = _client(work, command)
    if group_name not in work.config.groups:
        raise _Fail("Group not found")
    if any(link.name == group_name for link in client.groups):
        raise _Fail("Client is already in this group")
    client.groups.append(Link(group_name, _int(command, "priority", NO_PRIORITY)))
    _changed(work)


def remove_group_client(work: _Work, command: dict[str, Any]) -> None:
    _string(command, "username", "Invalid/missing username")
    group_name = _group_name(command)
    client = _client(work, command)
    if group_name not in work.config.groups:
        raise _Fail("Group not found")
    client.groups = [link for link in client.groups if link.name != group_name]
    _changed(work)


def add_group_role(work: _Work, command: dict[str, Any]) -> None:
    group = _group(work, command)
    rolename = _role_name(command)
    if rolename not in work.config.roles:
        raise _Fail("Role not found")
    if any(link.name == rolename for link in group.roles):
        raise _Fail("Group is already in this role")
    group.roles.append(Link(rolename, _int(command, "priority", NO_PRIORITY)))
    _changed(work)


def remove_group_role(work: _Work, command: dict[str, Any]) -> None:
    group = _group(work, command)
    rolename = _role_name(command)
    if rolename not in work.config.roles:
        raise _Fail("Role not found")
    group.roles = [link for link in group.roles if link.name != rolename]
    _changed(work)


# --- default access -------------------------------------------------------------------------------------------------
def set_default_acl_access(work: _Work, command: dict[str, Any]) -> None:
    actions = command.get("acls")
    if not isinstance(actions, list):
        raise _Fail("Missing/invalid actions array")
    for action in actions:
        if not isinstance(action, dict) or not isinstance(action.get("allow"), bool):
            continue
        wanted = str(action.get("acltype", "")).lower()
        kind = next((k for k in DEFAULT_KINDS if k.lower() == wanted), None)
        if kind is not None:
            work.config.defaults[kind] = action["allow"]
    _changed(work)


def get_default_acl_access(work: _Work, command: dict[str, Any]) -> dict[str, Any]:
    return {"acls": [{"acltype": kind, "allow": work.config.defaults.get(kind, False)} for kind in DEFAULT_KINDS]}


_COMMANDS: dict[str, Callable[[_Work, dict[str, Any]], dict[str, Any] | None]] = {
    "createClient": create_client, "deleteClient": delete_client, "enableClient": enable_client,
    "disableClient": disable_client, "setClientId": set_client_id, "setClientPassword": set_client_password,
    "modifyClient": modify_client, "getClient": get_client, "listClients": list_clients,
    "addClientRole": add_client_role, "removeClientRole": remove_client_role,
    "createRole": create_role, "deleteRole": delete_role, "getRole": get_role, "listRoles": list_roles,
    "modifyRole": modify_role, "addRoleACL": add_role_acl, "removeRoleACL": remove_role_acl,
    "createGroup": create_group, "deleteGroup": delete_group, "getGroup": get_group, "listGroups": list_groups,
    "modifyGroup": modify_group, "addGroupClient": add_group_client, "removeGroupClient": remove_group_client,
    "addGroupRole": add_group_role, "removeGroupRole": remove_group_role,
    "setDefaultACLAccess": set_default_acl_access, "getDefaultACLAccess": get_default_acl_access,
}
# Mosquitto matches command names without regard to case and answers with its own spelling.
_HANDLERS = {name.lower(): handler for name, handler in _COMMANDS.items()}
_SPELLING = {name.lower(): name for name in _COMMANDS}
COMMANDS = tuple(_COMMANDS)
