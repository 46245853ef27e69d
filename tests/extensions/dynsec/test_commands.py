"""Mosquitto's dynamic-security commands, sans-IO (`extensions.dynsec.commands`): the responses' shapes and error
strings as Mosquitto 2.0 answers, a bad command harming nothing, passwords never shown, the limits."""

from __future__ import annotations

import json
from typing import Any

from tidewire.extensions.dynsec import commands
from tidewire.extensions.dynsec.model import Config
from tidewire.extensions.password_file import parse_mosquitto, verify_mosquitto


def _hash(password: str) -> str:
    from tidewire.extensions.password_file import mosquitto_hash

    return mosquitto_hash(password, iterations=2)


def run(config: Config, *cmds: dict[str, Any]) -> commands.Result:
    return commands.run(config, json.dumps({"commands": list(cmds)}).encode(), _hash)


def apply(config: Config, *cmds: dict[str, Any]) -> Config:
    result = run(config, *cmds)
    assert all("error" not in r for r in result.responses), result.responses
    assert result.config is not None
    return result.config


def test_create_client_and_role_then_read_them_back_as_mosquitto_does() -> None:
    config = apply(Config(),
                   {"command": "createRole", "rolename": "sensor", "acls": [
                       {"acltype": "publishClientSend", "topic": "sensors/%c/#", "allow": True, "priority": 1}]},
                   {"command": "createClient", "username": "dev1", "password": "s3cret", "clientid": "dev1-id",
                    "textname": "Device 1", "roles": [{"rolename": "sensor", "priority": 5}], "tenant": "acme"})
    stored = config.clients["dev1"]
    assert stored.password is not None and "s3cret" not in stored.password
    assert verify_mosquitto(parse_mosquitto("dev1", stored.password), b"s3cret")
    result = run(config, {"command": "getClient", "username": "dev1", "correlationData": "c1"},
                 {"command": "listClients"}, {"command": "getRole", "rolename": "sensor"},
                 {"command": "listRoles", "verbose": True})
    assert result.config is None  # reads change nothing
    get_client, list_clients, get_role, list_roles = result.responses
    assert get_client == {"command": "getClient", "correlationData": "c1", "data": {"client": {
        "username": "dev1", "clientid": "dev1-id", "textname": "Device 1",
        "roles": [{"rolename": "sensor", "priority": 5}], "groups": [], "tenant": "acme"}}}
    assert list_clients == {"command": "listClients", "data": {"totalCount": 1, "clients": ["dev1"]}}
    assert get_role["data"]["role"]["acls"] == [
        {"acltype": "publishClientSend", "topic": "sensors/%c/#", "priority": 1, "allow": True}]
    assert list_roles["data"]["roles"][0]["rolename"] == "sensor"
    for response in result.responses:
        assert "password" not in json.dumps(response) and "$7$" not in json.dumps(response)
    # The document round-trips, password hash included.
    assert Config.from_json(config.to_json()) == config


def test_errors_are_mosquittos_and_change_nothing() -> None:
    base = apply(Config(), {"command": "createRole", "rolename": "r"},
                 {"command": "createClient", "username": "u", "password": "p"})
    cases: list[tuple[dict[str, Any], str]] = [
        ({"command": "createClient", "username": "u", "password": "x"}, "Client already exists"),
        ({"command": "createClient"}, "Invalid/missing username"),
        ({"command": "createClient", "username": "v", "password": 5}, "Invalid/missing password"),
        ({"command": "createClient", "username": "v", "roles": [{"rolename": "nope"}]}, "Role not found"),
        ({"command": "deleteClient", "username": "ghost"}, "Client not found"),
        ({"command": "setClientPassword", "username": "u", "password": ""}, "Empty password is not allowed"),
        ({"command": "createRole", "rolename": "r"}, "Role already exists"),
        ({"command": "addRoleACL", "rolename": "r", "acltype": "bogus", "topic": "a"}, "Unknown acltype"),
        ({"command": "addRoleACL", "rolename": "r", "acltype": "subscribePattern", "topic": "a/#/b"},
         "Invalid ACL topic"),
        ({"command": "addRoleACL", "rolename": "r", "acltype": "subscribePattern"}, "Invalid/missing topic"),
        ({"command": "addRoleACL", "rolename": "nope", "acltype": "subscribePattern", "topic": "a"},
         "Role not found"),
        ({"command": "removeRoleACL", "rolename": "r", "acltype": "subscribePattern", "topic": "a"}, "ACL not found"),
        ({"command": "modifyRole", "rolename": "nope"}, "Role does not exist"),
        ({"command": "addClientRole", "username": "u", "rolename": "nope"}, "Role not found"),
        ({"command": "setDefaultACLAccess"}, "Missing/invalid actions array"),
        ({"command": "addGroupClient", "username": "u", "groupname": "g"}, "Group not found"),
        ({"command": "frobnicate"}, "Unknown command"),
    ]
    for command, error in cases:
        result = run(base, {**command, "correlationData": "k"})
        assert result.responses == [{"command": result.responses[0]["command"], "error": error,
                                     "correlationData": "k"}], command
        assert result.config is None, command
    assert run(base, {"command": "frobnicate"}).responses == [{"command": "frobnicate", "error": "Unknown command"}]
    bad = commands.run(base, b"{not json", _hash)
    assert bad.responses == [{"command": "Unknown command", "error": "Payload not valid JSON"}]
    assert commands.run(base, b'{"command": "x"}', _hash).responses == [
        {"command": "Unknown command", "error": "Invalid/missing commands"}]
    assert commands.run(base, b'{"commands": [7]}', _hash).responses == [
        {"command": "Unknown command", "error": "Command not an object"}]
    # The configuration passed in is never changed, whatever a request does.
    apply(base, {"command": "deleteClient", "username": "u"}, {"command": "deleteRole", "rolename": "r"})
    assert set(base.clients) == {"u"} and set(base.roles) == {"r"}


def test_each_command_applies_on_its_own_and_kicks_are_named() -> None:
    base = apply(Config(), {"command": "createClient", "username": "a", "password": "p"},
                 {"command": "createClient", "username": "b", "password": "p"})
    result = run(base, {"command": "disableClient", "username": "a"}, {"command": "deleteClient", "username": "zz"},
                 {"command": "deleteClient", "username": "b"}, {"command": "setClientPassword", "username": "a",
                                                                "password": "new"})
    assert [r.get("error") for r in result.responses] == [None, "Client not found", None, None]
    assert result.config is not None and set(result.config.clients) == {"a"} and result.config.clients["a"].disabled
    assert result.kick == {"a", "b"}  # a new password alone kicks nobody
    enabled = run(result.config, {"command": "enableClient", "username": "a"})
    assert enabled.config is not None and not enabled.config.clients["a"].disabled and not enabled.kick


def test_role_acls_groups_and_defaults() -> None:
    config = apply(Config(), {"command": "createRole", "rolename": "r"},
                   {"command": "addRoleACL", "rolename": "r", "acltype": "SUBSCRIBELITERAL", "topic": "a/b",
                    "allow": True, "priority": 3},
                   {"command": "createGroup", "groupname": "g", "roles": [{"rolename": "r"}]},
                   {"command": "createClient", "username": "u"},
                   {"command": "addGroupClient", "username": "u", "groupname": "g", "priority": 2},
                   {"command": "setDefaultACLAccess", "acls": [{"acltype": "subscribe", "allow": True}]})
    assert config.roles["r"].acls[0].acltype == "subscribeLiteral"  # stored as Mosquitto spells it
    assert run(config, {"command": "addRoleACL", "rolename": "r", "acltype": "subscribeLiteral",
                        "topic": "a/b"}).responses[0]["error"] == "ACL with this topic already exists"
    got = run(config, {"command": "getGroup", "groupname": "g"}, {"command": "getDefaultACLAccess"}).responses
    assert got[0]["data"]["group"] == {"groupname": "g", "roles": [{"rolename": "r"}], "clients": [{"username": "u"}]}
    assert got[1]["data"]["acls"] == [{"acltype": "publishClientSend", "allow": False},
                                      {"acltype": "publishClientReceive", "allow": True},
                                      {"acltype": "subscribe", "allow": True},
                                      {"acltype": "unsubscribe", "allow": True}]
    gone = apply(config, {"command": "deleteRole", "rolename": "r"}, {"command": "deleteGroup", "groupname": "g"})
    assert gone.clients["u"].groups == [] and gone.roles == {} and gone.groups == {}


def test_limits_refuse_what_is_over_them() -> None:
    limits = commands.Limits(max_clients=1, max_roles=1, max_groups=1, max_acls=1, max_commands=3)
    config = commands.run(Config(), json.dumps({"commands": [
        {"command": "createClient", "username": "a"}, {"command": "createClient", "username": "b"},
        {"command": "createRole", "rolename": "r", "acls": [{"acltype": "subscribePattern", "topic": "x"},
                                                            {"acltype": "subscribePattern", "topic": "y"}]}]}).encode(),
        _hash, limits)
    assert [r.get("error") for r in config.responses] == [None, "Too many clients (at most 1)",
                                                          "Too many ACLs (at most 1)"]
    many = commands.run(Config(), json.dumps({"commands": [{"command": "listRoles"}] * 4}).encode(), _hash, limits)
    assert many.responses == [{"command": "Unknown command", "error": "Too many commands (at most 3)"}]
