"""Admin API of dynamic security, one job: `/api/v1/security` — list, create and delete clients and roles, add and
remove a role's ACLs, and any Mosquitto dynamic-security request (`/commands`: the same JSON as the control topic).
Each call runs as Mosquitto's commands through the node's `DynamicSecurity` (`gateway.ops.dynsec`): stored in the
store, in force on every node, never answering a password or its hash. The admin token stands for an admin, so this
is also how a first dynamic-security admin can be made."""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Depends, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from tidewire.admin.app import API_PREFIX, error, require_token
from tidewire.extensions.dynsec.commands import MAX_NAME, MAX_TEXT
from tidewire.gateway.node import Node

_NOT_FOUND = ("Client not found", "Role not found", "Role does not exist", "ACL not found", "Group not found")
_CONFLICT = ("Client already exists", "Role already exists", "ACL with this topic already exists")


class RoleLink(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rolename: str = Field(min_length=1, max_length=MAX_NAME)
    priority: int = -1


class ClientRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    username: str = Field(min_length=1, max_length=MAX_NAME)
    password: str | None = Field(None, min_length=1, max_length=65535)
    clientid: str | None = Field(None, max_length=MAX_NAME)
    textname: str | None = Field(None, max_length=MAX_TEXT)
    tenant: str | None = Field(None, max_length=MAX_TEXT, description="the tenant the client belongs to")
    roles: list[RoleLink] = Field(default_factory=list, max_length=1000)


class AclRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    acltype: str = Field(description="publishClientSend, publishClientReceive, subscribeLiteral, subscribePattern, "
                                     "unsubscribeLiteral or unsubscribePattern", max_length=64)
    topic: str = Field(min_length=1, max_length=MAX_NAME)
    priority: int = 0
    allow: bool = False


class RoleRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rolename: str = Field(min_length=1, max_length=MAX_NAME)
    textname: str | None = Field(None, max_length=MAX_TEXT)
    acls: list[AclRequest] = Field(default_factory=list, max_length=100_000)


def router(node: Node) -> APIRouter:
    api = APIRouter(prefix=f"{API_PREFIX}/security", tags=["security"], dependencies=[Depends(require_token)])

    async def run(*commands: dict[str, Any]) -> list[dict[str, Any]] | JSONResponse:
        """The responses, or the error answer of the first failed command."""
        if node.dynsec is None:
            return error(404, "dynamic security is off (dynsec_enabled)")
        result = await node.dynsec.execute(_request(*commands))
        for response in result.responses:
            if (text := response.get("error")) is not None:
                status = 404 if text in _NOT_FOUND else 409 if text in _CONFLICT else 400
                return error(status, text)
        return result.responses

    @api.get("/clients")
    async def list_clients() -> Any:
        """Every client (Mosquitto's listClients, verbose): user name, client id, roles, groups, disabled, tenant."""
        answer = await run({"command": "listClients", "verbose": True})
        return answer if isinstance(answer, JSONResponse) else {"data": answer[0]["data"]["clients"]}

    @api.post("/clients", status_code=201)
    async def create_client(body: ClientRequest) -> Any:
        """Create a client (its password is stored salted and hashed, never answered)."""
        command = {k: v for k, v in body.model_dump().items() if v is not None}
        answer = await run({"command": "createClient", **command})
        return answer if isinstance(answer, JSONResponse) else {"username": body.username}

    @api.delete("/clients/{username}", status_code=204, response_class=Response, response_model=None)
    async def delete_client(username: str) -> Response:
        """Delete a client (its connections are closed, on every node)."""
        answer = await run({"command": "deleteClient", "username": username})
        return answer if isinstance(answer, Response) else Response(status_code=204)

    @api.get("/roles")
    async def list_roles() -> Any:
        """Every role with its ACLs (Mosquitto's listRoles, verbose)."""
        answer = await run({"command": "listRoles", "verbose": True})
        return answer if isinstance(answer, JSONResponse) else {"data": answer[0]["data"]["roles"]}

    @api.post("/roles", status_code=201)
    async def create_role(body: RoleRequest) -> Any:
        answer = await run({"command": "createRole", **{k: v for k, v in body.model_dump().items() if v is not None}})
        return answer if isinstance(answer, JSONResponse) else {"rolename": body.rolename}

    @api.delete("/roles/{rolename}", status_code=204, response_class=Response, response_model=None)
    async def delete_role(rolename: str) -> Response:
        answer = await run({"command": "deleteRole", "rolename": rolename})
        return answer if isinstance(answer, Response) else Response(status_code=204)

    @api.post("/roles/{rolename}/acls", status_code=201)
    async def add_role_acl(rolename: str, body: AclRequest) -> Any:
        answer = await run({"command": "addRoleACL", "rolename": rolename, **body.model_dump()})
        return answer if isinstance(answer, JSONResponse) else body.model_dump()

    @api.delete("/roles/{rolename}/acls", status_code=204, response_class=Response, response_model=None)
    async def remove_role_acl(rolename: str, acltype: str, topic: str) -> Response:
        """Remove the role's ACL of this type and topic (query parameters)."""
        answer = await run({"command": "removeRoleACL", "rolename": rolename, "acltype": acltype, "topic": topic})
        return answer if isinstance(answer, Response) else Response(status_code=204)

    @api.post("/commands")
    async def commands(body: dict[str, Any]) -> Any:
        """A Mosquitto dynamic-security request as is (`{"commands": [...]}`); its `{"responses": [...]}`."""
        if node.dynsec is None:
            return error(404, "dynamic security is off (dynsec_enabled)")
        result = await node.dynsec.execute(json.dumps(body).encode())
        return {"responses": result.responses}

    return api


def _request(*commands: dict[str, Any]) -> bytes:
    return json.dumps({"commands": list(commands)}).encode()
