"""Admin API of the tenants, one job: `/api/v1/tenants` — every tenant this node knows (configured, or met through a
client's identity) with its mount point, its limits and its usage on this node (`gateway.core.tenants`): how an
operator, as the superuser of every tenant, sees them all."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from tidewire.admin.app import API_PREFIX, error, require_token
from tidewire.admin.models import Page, Paging, paging
from tidewire.gateway.core.tenants import Tenant
from tidewire.gateway.node import Node


class TenantLimitsOut(BaseModel):
    max_connections: int = Field(description="connected clients on this node (0: no limit)")
    max_connection_rate: float = Field(description="CONNECTs/s on this node (0: no limit)")
    max_message_rate: float = Field(description="PUBLISHes/s on this node (0: no limit)")
    max_retained_bytes: int = Field(description="payload bytes of its retained messages (0: no limit)")


class TenantEntry(BaseModel):
    name: str
    mount: str = Field(description="the mount point its topics live under; a default-tenant superuser "
                                   "subscribes to `<mount>#` to see them")
    configured: bool = Field(description="listed in the `tenants` setting (else met through a client's identity)")
    connections: int = Field(description="MQTT clients of the tenant connected to this node")
    messages_in: int = Field(description="PUBLISHes its clients sent, taken")
    messages_out: int = Field(description="PUBLISHes sent to its clients (first sends)")
    retained_bytes: int | None = Field(description="its stored bytes: payload bytes of its retained messages as "
                                                   "last measured plus admitted since; null: not measured (no cap)")
    refused: dict[str, int] = Field(description="what its limits refused, by reason: quota (connections), rate "
                                                "(connection rate), message_rate, retained_bytes")
    limits: TenantLimitsOut


def entry(tenant: Tenant, configured: bool) -> TenantEntry:
    limits = tenant.limits
    return TenantEntry(name=tenant.name, mount=tenant.mount, configured=configured, connections=tenant.connections,
                       messages_in=tenant.messages_in, messages_out=tenant.messages_out,
                       retained_bytes=tenant.retained_bytes if limits.max_retained_bytes else None,
                       refused=dict(tenant.refused),
                       limits=TenantLimitsOut(max_connections=limits.max_connections,
                                              max_connection_rate=limits.max_connection_rate,
                                              max_message_rate=limits.max_message_rate,
                                              max_retained_bytes=limits.max_retained_bytes))


def router(node: Node) -> APIRouter:
    api = APIRouter(prefix=f"{API_PREFIX}/tenants", tags=["tenants"], dependencies=[Depends(require_token)])
    configured = node.settings.tenants

    @api.get("", response_model=Page[TenantEntry])
    async def list_tenants(pages: Annotated[Paging, Depends(paging)]) -> Page[TenantEntry]:
        """The tenants of this node by name, with their limits and usage here."""
        data, meta = pages.cut([entry(t, t.name in configured) for t in node.tenants.all()])
        return Page[TenantEntry](data=data, meta=meta)

    @api.get("/{name}", response_model=TenantEntry, responses={404: {"description": "no such tenant"}})
    async def get_tenant(name: str) -> TenantEntry | JSONResponse:
        """One tenant."""
        tenant = node.tenants.find(name)
        if tenant is None:
            return error(404, f"no tenant {name!r} on this node")
        return entry(tenant, name in configured)

    return api
