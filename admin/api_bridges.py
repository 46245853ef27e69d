"""Admin API of the node's MQTT bridges, one job: `/api/v1/bridges` — each bridge's state, counters and lag as
this node sees it (the node holding a bridge's lease runs it; the others show it in standby)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends
from starlette.exceptions import HTTPException

from tidewire.admin.app import API_PREFIX, Endpoints, endpoints, require_token
from tidewire.gateway.node import Node

Found = Annotated[Endpoints, Depends(endpoints)]


def router(node: Node) -> APIRouter:
    api = APIRouter(prefix=API_PREFIX, tags=["bridges"], dependencies=[Depends(require_token)])

    @api.get("/bridges")
    async def list_bridges(found: Found) -> dict[str, Any]:
        """Every configured bridge: state (standby, connecting, connected, waiting, stopped), address, counters
        (sent, acked, redelivered, received, stored, denied, ...) and lag (messages waiting, age of the oldest)."""
        runner = found.bridges
        return {"node": node.node_id, "data": await runner.statuses() if runner is not None else []}

    @api.get("/bridges/{name}")
    async def one_bridge(name: str, found: Found) -> dict[str, Any]:
        runner = found.bridges
        for status in await runner.statuses() if runner is not None else []:
            if status["name"] == name:
                status["node"] = node.node_id
                return status
        raise HTTPException(404, f"no bridge {name!r}")

    return api
