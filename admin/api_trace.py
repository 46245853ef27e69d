"""Admin API of tracing and per-client statistics, one job: `/api/v1/traces` (start a trace of a client id or a
topic filter, list, stop, delete, download its packets as JSON lines), `/api/v1/slow-subscribers` (the ranking of
the slowest acknowledgers) and per-client counters (`/api/v1/clients/<id>/stats`, `/api/v1/client-stats`).

In a cluster a trace is started, stopped and deleted on every node (through the fabric's `call`/`serve`), so it
follows its client wherever it connects, and its download merges every node's lines by wall-clock time."""

from __future__ import annotations

import asyncio
import logging
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Response
from pydantic import BaseModel, ConfigDict, Field, model_validator
from starlette.exceptions import HTTPException

from tidewire.admin.app import API_PREFIX, require_token
from tidewire.errors import ClusterError
from tidewire.gateway.core.topics import valid_topic_filter
from tidewire.gateway.node import Node
from tidewire.gateway.ops.slow_subscribers import merge
from tidewire.gateway.ops.trace import TRACE_NAME, TraceRefused, TraceSpec, merge_lines
from tidewire.gateway.protocols.mqtt.lifecycle import ChannelBase

log = logging.getLogger("tidewire.admin")

MAX_ID_CHARS = 65535
MAX_CLIENT_STATS = 1000  # rows of /client-stats in one answer
CLUSTER_CALL_TIMEOUT = 5.0  # s another node has to answer a trace call
LINES_REPLY_MAX = 3 * 1024 * 1024  # bytes of lines one node sends for a download (the fabric's frames are 4 MiB)


class TraceStart(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=64, pattern=f"^{TRACE_NAME.pattern}$",
                      description="letters, digits, _ . -")
    client_id: str | None = Field(None, min_length=1, max_length=MAX_ID_CHARS, description="trace this client")
    topic: str | None = Field(None, min_length=1, max_length=MAX_ID_CHARS,
                              description="or: trace the PUBLISH packets whose topic matches this filter")
    duration: float = Field(300.0, gt=0, description="s until the trace stops itself (up to trace_max_duration)")
    max_packets: int | None = Field(None, ge=1, description="packets kept (default and cap: trace_max_packets)")
    max_bytes: int | None = Field(None, ge=1024, description="bytes kept (default and cap: trace_max_bytes)")
    payload_bytes: int = Field(0, ge=0, description="payload bytes recorded per PUBLISH (up to "
                                                    "trace_max_payload_bytes); 0: sizes only")

    @model_validator(mode="after")
    def _one_target(self) -> TraceStart:
        if (self.client_id is None) == (self.topic is None):
            raise ValueError("give exactly one of client_id and topic")
        return self


def _spec(node: Node, body: TraceStart) -> TraceSpec:
    settings = node.settings
    if body.topic is not None and not valid_topic_filter(body.topic):
        raise HTTPException(400, "invalid topic filter")
    over = [what for what, asked, cap in (
        ("duration", body.duration, settings.trace_max_duration),
        ("max_packets", body.max_packets or 0, settings.trace_max_packets),
        ("max_bytes", body.max_bytes or 0, settings.trace_max_bytes),
        ("payload_bytes", body.payload_bytes, settings.trace_max_payload_bytes)) if asked > cap]
    if over:
        raise HTTPException(400, f"over the node's trace_max_{over[0].removeprefix('max_')}: {', '.join(over)}")
    return TraceSpec(body.name, body.client_id, body.topic, body.duration,
                     body.max_packets or settings.trace_max_packets, body.max_bytes or settings.trace_max_bytes,
                     body.payload_bytes)


def _spec_of(payload: dict[str, Any]) -> TraceSpec:
    return TraceSpec(str(payload["name"]), payload.get("client_id"), payload.get("topic"), float(payload["duration"]),
                     int(payload["max_packets"]), int(payload["max_bytes"]), int(payload["payload_bytes"]))


def _newest(lines: list[str], budget: int) -> list[str]:
    """The newest of `lines` within `budget` bytes."""
    kept = 0
    for index in range(len(lines) - 1, -1, -1):
        kept += len(lines[index]) + 16
        if kept > budget:
            return lines[index + 1:]
    return lines


def _refused(exc: TraceRefused) -> HTTPException:
    return HTTPException(exc.status, str(exc))


def router(node: Node) -> APIRouter:
    api = APIRouter(prefix=API_PREFIX, dependencies=[Depends(require_token)], tags=["tracing"])
    traces = node.traces
    clock = node.clock
    fabric = getattr(node.topology, "fabric", None)  # a cluster's (gateway.cluster.ClusterRole); None: alone

    # --- the cluster: every node runs the same trace ----------------------------------------------------
    def here(action: str, payload: dict[str, Any]) -> Any:
        """One trace call on this node (ours, or another node's through the fabric)."""
        try:
            if action == "start":
                return traces.start(_spec_of(payload)).summary(clock.monotonic())
            if action == "stop":
                return traces.stop(str(payload["name"])).summary(clock.monotonic())
            if action == "delete":
                traces.delete(str(payload["name"]))
                return None
            if action == "slow":
                return ranking_here()
            if action == "stats":
                return stats_here(str(payload["client_id"]))
            return _newest(traces.get(str(payload["name"])).lines(), LINES_REPLY_MAX)
        except TraceRefused as exc:
            return {"refused": exc.status, "error": str(exc)}

    if fabric is not None:
        for action in ("start", "stop", "delete", "lines", "slow", "stats"):
            def serve(sender: str, payload: Any, action: str = action) -> Any:
                return here(action, payload)
            fabric.serve("trace." + action, serve)

    async def everywhere(action: str, payload: dict[str, Any]) -> dict[str, Any]:
        """The same call on every other member: node id -> its answer (or an error)."""
        if fabric is None:
            return {}
        others = [m for m in fabric.members if m != node.node_id]

        async def one(member: str) -> Any:
            try:
                return await asyncio.wait_for(fabric.call(member, "trace." + action, payload), CLUSTER_CALL_TIMEOUT)
            except (ClusterError, OSError, TimeoutError) as exc:
                log.warning("trace.cluster_call_failed", extra={"node": member, "action": action, "error": str(exc)})
                return {"refused": 503, "error": str(exc)}

        answers = await asyncio.gather(*(one(m) for m in others))
        return dict(zip(others, answers, strict=True))

    def summary_with(trace_summary: dict[str, Any], others: dict[str, Any]) -> dict[str, Any]:
        nodes = {node.node_id: "ok"}
        for member, answer in others.items():
            nodes[member] = answer["error"] if isinstance(answer, dict) and "refused" in answer else "ok"
        return {**trace_summary, "nodes": nodes}

    # --- traces -----------------------------------------------------------------------------------------
    @api.post("/traces", status_code=201)
    async def start_trace(body: TraceStart) -> dict[str, Any]:
        """Start a trace on this node and every other member. 409: the name is taken, or too many traces."""
        spec = _spec(node, body)
        try:
            started = traces.start(spec)
        except TraceRefused as exc:
            raise _refused(exc) from None
        payload = {"name": spec.name, "client_id": spec.client_id, "topic": spec.topic, "duration": spec.duration,
                   "max_packets": spec.max_packets, "max_bytes": spec.max_bytes, "payload_bytes": spec.payload_bytes}
        return summary_with(started.summary(clock.monotonic()), await everywhere("start", payload))

    @api.get("/traces")
    async def list_traces() -> dict[str, Any]:
        """This node's traces (running and stopped), oldest first; `packets` and `dropped` are this node's."""
        now = clock.monotonic()
        return {"data": [t.summary(now) for t in traces.all()]}

    @api.get("/traces/{name}")
    async def get_trace(name: str) -> dict[str, Any]:
        try:
            return traces.get(name).summary(clock.monotonic())
        except TraceRefused as exc:
            raise _refused(exc) from None

    @api.post("/traces/{name}/stop")
    async def stop_trace(name: str) -> dict[str, Any]:
        """Stop recording (on every node); what was recorded stays for download until the trace is deleted."""
        try:
            stopped = traces.stop(name)
        except TraceRefused as exc:
            raise _refused(exc) from None
        return summary_with(stopped.summary(clock.monotonic()), await everywhere("stop", {"name": name}))

    @api.delete("/traces/{name}", status_code=204, response_class=Response)
    async def delete_trace(name: str) -> Response:
        try:
            traces.delete(name)
        except TraceRefused as exc:
            raise _refused(exc) from None
        await everywhere("delete", {"name": name})
        return Response(status_code=204)

    @api.get("/traces/{name}/download", response_class=Response)
    async def download_trace(name: str) -> Response:
        """The trace's packets as JSON lines (`application/x-ndjson`), every node's merged by wall-clock time:
        `t` (s since the trace started, monotonic, per node), `ts` (epoch s), `node`, `client`, `dir` (in/out),
        `type`, and the packet's fields (packet_id, topic, qos, retain, dup, size, reason codes, filters, ...)."""
        try:
            parts = [traces.get(name).lines()]
        except TraceRefused as exc:
            raise _refused(exc) from None
        for answer in (await everywhere("lines", {"name": name})).values():
            if isinstance(answer, list):
                parts.append([str(line) for line in answer])
        lines = parts[0] if len(parts) == 1 else merge_lines(parts)
        body = "".join(line + "\n" for line in lines)
        return Response(body, media_type="application/x-ndjson",
                        headers={"Content-Disposition": f'attachment; filename="{name}.jsonl"'})

    # --- slow subscribers and per-client counters ---------------------------------------------------------
    def online() -> list[tuple[str, ChannelBase]]:
        return [(cid, conn) for cid, conn in node.connections.items() if conn.session is not None]

    def ranking_here() -> list[dict[str, Any]]:
        ranked = node.slow_subscribers.ranking(
            ((cid, conn.session.stats) for cid, conn in online() if conn.session is not None), clock.monotonic())
        return [{**entry, "node": node.node_id} for entry in ranked]

    def stats_here(client_id: str) -> dict[str, Any] | None:
        conn = node.connections.get(client_id)
        if conn is None or conn.session is None:
            return None
        return {"client_id": client_id, "node": node.node_id, **conn.session.stats.as_dict()}

    @api.get("/slow-subscribers")
    async def slow_subscribers() -> dict[str, Any]:
        """The clients whose average (EWMA) time from a PUBLISH sent to its PUBACK/PUBREC is at least
        `slow_subscribers_threshold_ms`, slowest first, at most `slow_subscribers_top`, of every node: those
        online, and those that left in the last `slow_subscribers_expire` s (`online` false)."""
        settings = node.settings
        rankings = [ranking_here()]
        rankings += [a for a in (await everywhere("slow", {})).values() if isinstance(a, list)]
        return {"data": merge(rankings, settings.slow_subscribers_top),
                "threshold_ms": settings.slow_subscribers_threshold_ms, "top": settings.slow_subscribers_top}

    @api.get("/client-stats")
    async def client_stats(limit: Annotated[int, Query(ge=1, le=MAX_CLIENT_STATS)] = 100,
                           client_id: Annotated[str | None, Query(max_length=1024)] = None) -> dict[str, Any]:
        """The counters of the MQTT clients online here, by client id (`client_id`: a substring)."""
        rows = sorted(((cid, conn) for cid, conn in online() if client_id is None or client_id in cid),
                      key=lambda row: row[0])
        return {"data": [{"client_id": cid, "node": node.node_id, **conn.session.stats.as_dict()}
                         for cid, conn in rows[:limit] if conn.session is not None], "count": len(rows)}

    @api.get("/clients/{client_id:path}/stats")
    async def one_client_stats(client_id: str) -> dict[str, Any]:
        """A client's counters, from whichever node it is connected to (asked in turn if not here)."""
        found = stats_here(client_id)
        if found is None:
            found = next((a for a in (await everywhere("stats", {"client_id": client_id})).values()
                          if isinstance(a, dict) and "refused" not in a), None)
        if found is None:
            raise HTTPException(404, "no such client online")
        return found

    return api
