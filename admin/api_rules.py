"""Admin API of the rules, one job: `/api/v1/rules` — list them with this node's counts, create or replace,
enable or disable, delete, and try a statement against a sample message without running anything."""

from __future__ import annotations

import base64
from typing import Annotated, Any

from fastapi import APIRouter, Depends
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException

from tidewire.admin.app import API_PREFIX, Endpoints, endpoints, require_token
from tidewire.bridges.rules.engine import RuleEngine, try_rule
from tidewire.bridges.rules.settings import RuleSettings
from tidewire.bridges.rules.sql import RuleError
from tidewire.gateway.node import Node
from tidewire.store.base import Message
from tidewire.store.properties import Properties

Found = Annotated[Endpoints, Depends(endpoints)]


class Enabled(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool


class SampleMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    topic: str = Field(min_length=1, max_length=65535)
    payload: str = Field("", description="the payload as text (or base64 with payload_encoding base64)")
    payload_encoding: str = Field("plain", pattern="^(plain|base64)$")
    clientid: str = ""
    qos: int = Field(0, ge=0, le=2)
    retain: bool = False
    user_properties: list[tuple[str, str]] = Field(default_factory=list)


class RuleTest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sql: str = Field(min_length=1, max_length=65536)
    message: SampleMessage


def _engine(found: Endpoints) -> RuleEngine:
    if found.rules is None:
        raise HTTPException(503, "the rule engine is not running")
    return found.rules


def router(node: Node) -> APIRouter:
    api = APIRouter(prefix=API_PREFIX, tags=["rules"], dependencies=[Depends(require_token)])

    @api.get("/rules")
    async def list_rules(found: Found) -> dict[str, Any]:
        """Every rule of the cluster, with what it did on this node: matched, sent, failed, dead_lettered."""
        return {"node": node.node_id, "data": _engine(found).statuses()}

    @api.get("/rules/{name}")
    async def one_rule(name: str, found: Found) -> dict[str, Any]:
        for status in _engine(found).statuses():
            if status["name"] == name:
                return status
        raise HTTPException(404, f"no rule {name!r}")

    @api.put("/rules/{name}")
    async def put_rule(name: str, rule: RuleSettings, found: Found) -> dict[str, Any]:
        """Create or replace the rule `name` (the body's name must match); it runs on every node within seconds."""
        if rule.name != name:
            raise HTTPException(422, "the rule's name differs from the path's")
        try:
            await _engine(found).put(rule)
        except ValueError as exc:
            raise HTTPException(422, str(exc)) from None
        return await one_rule(name, found)

    @api.put("/rules/{name}/enabled")
    async def enable_rule(name: str, body: Enabled, found: Found) -> dict[str, Any]:
        if not await _engine(found).set_enabled(name, body.enabled):
            raise HTTPException(404, f"no rule {name!r}")
        return await one_rule(name, found)

    @api.delete("/rules/{name}", status_code=204)
    async def delete_rule(name: str, found: Found) -> None:
        if not await _engine(found).delete(name):
            raise HTTPException(404, f"no rule {name!r}")

    @api.post("/rules/test")
    async def test_rule(body: RuleTest) -> dict[str, Any]:
        """What the statement makes of the sample message: whether it is selected, and the result."""
        sample = body.message
        try:
            payload = base64.b64decode(sample.payload, validate=True) if sample.payload_encoding == "base64" \
                else sample.payload.encode()
        except ValueError:
            raise HTTPException(422, "payload is not base64") from None
        block = Properties(user=list(sample.user_properties)).to_block() if sample.user_properties else b""
        message = Message(sample.topic, payload, sample.qos, sample.retain, block, int(node.clock.time() * 1000), 0,
                          sample.clientid)
        outcome = try_rule(body.sql, message)
        if isinstance(outcome, RuleError):
            raise HTTPException(422, outcome.reason)
        selected, result = outcome
        return {"selected": selected, "result": result}

    return api
