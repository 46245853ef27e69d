"""Admin API of delayed publishes, one job: `/api/v1/delayed` — list the delayed messages waiting cluster-wide
(topic, due time, publisher) and cancel one (`gateway.core.delayed`: they wait in the store, so any node lists and
cancels them)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Response
from pydantic import BaseModel, Field

from tidewire.admin.app import API_PREFIX, error, require_token
from tidewire.admin.models import MAX_PAGE_LIMIT
from tidewire.gateway.core.delayed import Waiting
from tidewire.gateway.node import Node


class DelayedEntry(BaseModel):
    id: int = Field(description="its id (the store's seq): what DELETE takes")
    topic: str = Field(description="the topic it will be published on")
    due: float = Field(description="epoch seconds when it is published")
    published_at: float = Field(description="epoch seconds when its publisher sent it")
    publisher: str = Field(description="the publisher's client id")
    qos: int
    retain: bool
    node: str = Field(description="the node holding it until due (\"\": none yet)")


class DelayedPage(BaseModel):
    data: list[DelayedEntry]
    next_after: int | None = Field(description="pass as `after` for the next page; null: this was the last")


def entry(waiting: Waiting) -> DelayedEntry:
    return DelayedEntry(id=waiting.seq, topic=waiting.topic, due=waiting.due_ms / 1000,
                        published_at=waiting.published_ms / 1000, publisher=waiting.publisher, qos=waiting.qos,
                        retain=waiting.retain, node=waiting.holder)


def router(node: Node) -> APIRouter:
    api = APIRouter(prefix=f"{API_PREFIX}/delayed", tags=["delayed"], dependencies=[Depends(require_token)])

    @api.get("", response_model=DelayedPage)
    async def list_delayed(after: Annotated[int, Query(ge=0)] = 0,
                           limit: Annotated[int, Query(ge=1, le=MAX_PAGE_LIMIT)] = 100) -> DelayedPage:
        """Delayed messages not yet published, oldest first, after id `after`."""
        found = await node.delayed.waiting(after, limit)
        return DelayedPage(data=[entry(w) for w in found], next_after=found[-1].seq if len(found) == limit else None)

    @api.delete("/{message_id}", status_code=204, response_class=Response,
                responses={404: {"description": "no such delayed message waits (published, cancelled or unknown)"}})
    async def cancel_delayed(message_id: int) -> Response:
        """Cancel a delayed message: it is never published."""
        if not await node.delayed.cancel(message_id):
            return error(404, "no such delayed message waits")
        return Response(status_code=204)

    return api
