"""The admin HTTP application, one job: assemble the FastAPI app of a node's admin port: bearer-token auth
(`require_token`, for every `/api/v1` router), `{"error": ...}` bodies for every failure, `/healthz`,
`/readyz`, the routers (API, bans, metrics) and the dashboard's static files at `/`.

Without a token: `/healthz`, `/readyz`, `/metrics`, `/`, `/static/*` and the OpenAPI schema
(`/api/v1/openapi.json`; no Swagger UI: it would load from a CDN)."""

from __future__ import annotations

import hmac
import importlib.util
import logging
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException

from tidewire.gateway.node import Node

if TYPE_CHECKING:
    from tidewire.bridges.rules.engine import RuleEngine
    from tidewire.bridges.runner import BridgeRunner
    from tidewire.gateway.protocols.amqp.server import AmqpServer

log = logging.getLogger("tidewire.admin")

STATIC_DIR = Path(__file__).parent / "static"
API_PREFIX = "/api/v1"
BODY_SLACK = 64 * 1024  # bytes a request body may carry beyond one payload (JSON, properties)
MAX_ERROR_DETAILS = 10  # validation errors listed in one answer

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
Asgi = Callable[[Scope, Receive, Send], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class ListenerSpec:
    """A listening port the node opened (its live connection count is read when asked)."""

    name: str  # mqtt, mqtts, ws, wss, amqp, amqps, rocketmq
    host: str
    port: int
    max_connections: int | None


@dataclass(slots=True)
class Endpoints:
    """What `gateway.server.serve` opened besides the node itself: the listeners with their bound ports, the
    AMQP backend (its connections are listed with the MQTT clients) and the bridges."""

    listeners: list[ListenerSpec] = field(default_factory=list)
    amqp: AmqpServer | None = None
    bridges: BridgeRunner | None = None
    rules: RuleEngine | None = None


def endpoints(request: Request) -> Endpoints:
    found: Endpoints = request.app.state.endpoints
    return found


def error(status: int, text: str, headers: Mapping[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": text}, status_code=status, headers=headers)


def require_token(request: Request) -> None:
    """The `Authorization: Bearer <token>` check of every `/api/v1` route (a FastAPI dependency)."""
    expected: str = request.app.state.api_token
    scheme, _, presented = request.headers.get("authorization", "").partition(" ")
    ok = scheme.lower() == "bearer" and hmac.compare_digest(presented.strip().encode(), expected.encode())
    if not ok:
        raise HTTPException(401, "unauthorized", headers={"WWW-Authenticate": "Bearer"})


def readiness(node: Node) -> list[str]:
    """Why the node should get no new clients now (empty: ready)."""
    reasons: list[str] = []
    if node.draining:
        reasons.append("draining")
    if (unreachable := node.store_health.reason()) is not None:
        reasons.append(unreachable)
    topology = node.topology
    if topology.shared:
        if node.node_id not in topology.members or not topology.stats().get("lookup_complete", 1):
            reasons.append("lookup unavailable")
    return reasons


class BodyLimit:
    """Request bodies up to `limit` bytes, announced by Content-Length (a chunked body is refused: its size
    is unknown until read)."""

    def __init__(self, app: Asgi, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            length = headers.get(b"content-length")
            refusal: Response | None = None
            if b"transfer-encoding" in headers:
                refusal = error(411, "a request body needs Content-Length")
            elif length is not None and (not length.isdigit() or int(length) > self.limit):
                refusal = error(413, f"request body over {self.limit} bytes")
            if refusal is not None:
                await refusal(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _validation_text(exc: RequestValidationError) -> tuple[str, list[dict[str, str]]]:
    details = [{"loc": ".".join(str(part) for part in e.get("loc", ())), "msg": str(e.get("msg", ""))}
               for e in exc.errors()[:MAX_ERROR_DETAILS]]  # never the input itself: it may be a payload or secret
    first = details[0] if details else {"loc": "", "msg": "invalid"}
    return f"invalid {first['loc']}: {first['msg']}", details


def _install_error_handlers(app: FastAPI) -> None:
    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        if exc.status_code == 204 or exc.status_code < 200:
            return Response(status_code=exc.status_code, headers=exc.headers)
        return error(exc.status_code, str(exc.detail), exc.headers)

    async def invalid(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        text, details = _validation_text(exc)
        return JSONResponse({"error": text, "details": details}, status_code=422)

    async def store_failed(request: Request, exc: Exception) -> Response:
        log.warning("admin.store_unavailable", extra={"path": request.url.path, "error": str(exc)})
        return error(503, "store unavailable")

    async def crashed(request: Request, exc: Exception) -> Response:
        log.error("admin.request_failed", extra={"path": request.url.path}, exc_info=exc)
        return error(500, "internal error")

    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(OSError, store_failed)  # the store engines raise OSError when unreachable
    app.add_exception_handler(Exception, crashed)


def _optional_router(module: str, attribute: str, node: Node) -> Any | None:
    """A router of a module that may not exist yet; a module that exists but fails to import is an error."""
    if importlib.util.find_spec(module) is None:
        return None
    return getattr(importlib.import_module(module), attribute)(node)


def build_app(node: Node, token: str, endpoints: Endpoints | None = None) -> FastAPI:
    """The node's admin app; `token` is the bearer token every `/api/v1` route asks for."""
    if not token:
        raise ValueError("the admin API needs a non-empty token")
    # Here: they import `require_token` from this module.
    import tidewire.admin.api_clients as api_clients
    import tidewire.admin.api_messages as api_messages
    import tidewire.admin.api_node as api_node

    app = FastAPI(title="Tidewire admin API", version=api_node.version(), openapi_url=f"{API_PREFIX}/openapi.json",
                  docs_url=None, redoc_url=None, swagger_ui_oauth2_redirect_url=None)
    app.state.api_token = token
    app.state.endpoints = endpoints if endpoints is not None else Endpoints()
    _install_error_handlers(app)
    app.add_middleware(BodyLimit, limit=node.settings.max_packet_size * 4 // 3 + BODY_SLACK)

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", include_in_schema=False)
    async def readyz() -> Response:
        reasons = readiness(node)
        if reasons:
            return JSONResponse({"status": "not ready", "reasons": reasons}, status_code=503)
        return JSONResponse({"status": "ready"})

    @app.get("/", include_in_schema=False)
    async def dashboard() -> Response:
        index = STATIC_DIR / "index.html"
        if not index.is_file():
            return error(404, "no dashboard installed")
        return FileResponse(index, headers={"Cache-Control": "no-cache"})

    app.mount("/static", StaticFiles(directory=STATIC_DIR, check_dir=False), name="static")
    # api_trace first: its /clients/<id>/stats would be swallowed by api_clients' /clients/{client_id:path}
    for router in (_optional_router("tidewire.admin.api_trace", "router", node),
                   api_node.router(node), api_clients.router(node, app.state.endpoints), api_messages.router(node),
                   _optional_router("tidewire.admin.api_banned", "router", node),
                   _optional_router("tidewire.admin.api_security", "router", node),
                   _optional_router("tidewire.admin.api_bridges", "router", node),
                   _optional_router("tidewire.admin.api_rules", "router", node),
                   _optional_router("tidewire.admin.api_tenants", "router", node),
                   _optional_router("tidewire.admin.api_delayed", "router", node),
                   _optional_router("tidewire.admin.metrics", "metrics_router", node)):
        if router is not None:
            app.include_router(router)
    return app
