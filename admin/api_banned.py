"""Admin API of the ban list, one job: `/api/v1/banned` — list, add (kicking matching clients of this node) and
lift the cluster-wide bans the node's `BanList` (`gateway.ops.bans`) keeps in the store."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from tidewire.admin.app import API_PREFIX, error, require_token
from tidewire.admin.models import Page, Paging, paging
from tidewire.gateway.node import Node
from tidewire.gateway.ops.bans import MAX_REASON, MAX_WHO, new_ban, normalize_who
from tidewire.store.base import BAN_KINDS, Ban

MAX_DURATION = 100 * 365 * 86400.0  # s: longer is "for ever" (until null)
MAX_UNTIL = 4_102_444_800.0  # 2100-01-01 in epoch s


class BanEntry(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    as_: str = Field(alias="as", serialization_alias="as", description="clientid, username or peerhost")
    who: str = Field(description="client id, user name, or address / CIDR network (canonical form)")
    reason: str
    at: float = Field(description="epoch seconds when it was made")
    until: float | None = Field(description="epoch seconds when it lapses; null: never")


class BanAdded(BanEntry):
    kicked: int = Field(description="clients of this node it disconnected")


class BanRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    as_: str = Field(alias="as", max_length=16, description="clientid, username or peerhost")
    who: str = Field(min_length=1, max_length=MAX_WHO)
    reason: str = Field("", max_length=MAX_REASON)
    until: float | None = Field(None, gt=0, le=MAX_UNTIL, description="epoch seconds")
    duration: float | None = Field(None, gt=0, le=MAX_DURATION, description="seconds from now")


def entry(ban: Ban) -> BanEntry:
    return BanEntry(as_=ban.kind, who=ban.who, reason=ban.reason, at=ban.at, until=ban.until)


def router(node: Node) -> APIRouter:
    api = APIRouter(prefix=f"{API_PREFIX}/banned", tags=["bans"], dependencies=[Depends(require_token)])

    @api.get("", response_model=Page[BanEntry], response_model_by_alias=True)
    async def list_bans(pages: Annotated[Paging, Depends(paging)]) -> Page[BanEntry]:
        """The bans in force across the cluster (read from the store), by kind and who."""
        data, meta = pages.cut([entry(b) for b in await node.bans.listing()])
        return Page[BanEntry](data=data, meta=meta)

    @api.post("", status_code=201, response_model=BanAdded, response_model_by_alias=True,
              responses={400: {"description": "invalid ban"}})
    async def add_ban(body: BanRequest) -> BanAdded | JSONResponse:
        """Ban a client id, user name or peer address / network (kicking the matching clients of this node; the
        other nodes do at their next refresh). The same kind and who replaces an existing ban."""
        made = new_ban(body.as_, body.who, body.reason, body.until, body.duration, now=node.clock.time())
        if isinstance(made, str):
            return error(400, made)
        kicked = await node.bans.add(made)
        return BanAdded(**entry(made).model_dump(), kicked=kicked)

    @api.delete("/{kind}/{who:path}", status_code=204, response_class=Response,
                responses={400: {"description": "unknown kind"}, 404: {"description": "no such ban"}})
    async def delete_ban(kind: str, who: str) -> Response:
        """Lift a ban (`who` percent-encoded; a network's `/` may stay as is)."""
        if kind not in BAN_KINDS:
            return error(400, f"'as' must be one of {', '.join(BAN_KINDS)}")
        canonical = normalize_who(kind, who) or who  # a stored form this build would not make is lifted as is
        if not await node.bans.remove(kind, canonical):
            return error(404, "no such ban")
        return Response(status_code=204)

    return api
