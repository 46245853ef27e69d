"""The admin port itself: health and readiness, the dashboard and OpenAPI without a token, the bearer token on
every API route (missing, wrong, other schemes: 401), body limits, the token's sources (setting, file, generated
0600 file reused across restarts, never logged), and `AdminServer` in a running loop (port 0, no signal
handlers of its own, a port in use refused, a clean stop)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from loadtest.ports import free_port
from tests.admin.conftest import http
from tests.integration.conftest import Gateway
from tidewire.admin.server import AdminServer
from tidewire.admin.token import TokenError, resolve_token
from tidewire.gateway.config import Settings
from tidewire.gateway.node import Node
from tidewire.gateway.security import Security
from tidewire.lookup.base import InProcessLookup
from tidewire.notify.base import LocalNotifier
from tidewire.store.embedded.engine import EmbeddedStore

# Every route of the API modules of this helper: (method, path, JSON body).
API_ROUTES = [
    ("GET", "/api/v1/status", None), ("GET", "/api/v1/nodes", None), ("GET", "/api/v1/listeners", None),
    ("GET", "/api/v1/config", None), ("GET", "/api/v1/stats", None), ("GET", "/api/v1/clients", None),
    ("GET", "/api/v1/clients/c1", None), ("DELETE", "/api/v1/clients/c1", None),
    ("GET", "/api/v1/clients/c1/subscriptions", None),
    ("POST", "/api/v1/clients/c1/subscriptions", {"topic": "a", "qos": 0}),
    ("DELETE", "/api/v1/clients/c1/subscriptions?topic=a", None), ("GET", "/api/v1/subscriptions", None),
    ("GET", "/api/v1/sessions/c1", None), ("DELETE", "/api/v1/sessions/c1", None),
    ("POST", "/api/v1/publish", {"topic": "a", "payload": "x"}), ("GET", "/api/v1/retained", None),
    ("GET", "/api/v1/retained/a", None), ("DELETE", "/api/v1/retained/a", None),
]


def test_health_readiness_dashboard_and_schema_need_no_token(admin_gateway: Gateway) -> None:
    with http(admin_gateway, "") as anonymous:
        assert anonymous.get("/healthz").json() == {"status": "ok"}
        ready = anonymous.get("/readyz")
        assert ready.status_code == 200 and ready.json() == {"status": "ready"}
        schema = anonymous.get("/api/v1/openapi.json")
        assert schema.status_code == 200 and schema.json()["info"]["title"] == "Tidewire admin API"
        assert "/api/v1/clients/{client_id}" in schema.json()["paths"]
        assert anonymous.get("/api/v1/docs").status_code == 404  # no Swagger UI: it would need a CDN
        page = anonymous.get("/")
        if (Path(__file__).parents[2] / "admin" / "static" / "index.html").exists():
            assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
            assert anonymous.get("/static/index.html").status_code == 200
        else:
            assert page.status_code == 404 and "error" in page.json()
        assert anonymous.get("/static/no-such-file.js").status_code == 404


@pytest.mark.parametrize("authorization", [None, "Bearer wrong-token", "Basic dXNlcjpwYXNz", "Bearer", "Bearer a b"])
def test_every_api_route_refuses_without_the_token(admin_gateway: Gateway, authorization: str | None) -> None:
    headers = {"Authorization": authorization} if authorization is not None else {}
    with httpx.Client(base_url=f"http://127.0.0.1:{admin_gateway.admin_port}", timeout=10.0) as client:
        for method, path, body in API_ROUTES:
            r = client.request(method, path, json=body, headers=headers)
            assert r.status_code == 401, (method, path, r.status_code, r.text)
            assert r.json() == {"error": "unauthorized"}
            assert r.headers["www-authenticate"] == "Bearer"


def test_the_token_is_accepted_and_errors_have_an_error_body(api: httpx.Client) -> None:
    assert api.get("/api/v1/status").status_code == 200
    r = api.get("/api/v1/no-such-route")
    assert r.status_code == 404 and r.json() == {"error": "Not Found"}
    r = api.request("PUT", "/api/v1/status")
    assert r.status_code == 405 and "error" in r.json()


def test_request_bodies_are_bounded(api: httpx.Client) -> None:
    huge = b'{"topic": "a", "payload": "' + b"x" * (2 * 1024 * 1024) + b'"}'
    r = api.post("/api/v1/publish", content=huge, headers={"content-type": "application/json"})
    assert r.status_code == 413 and "error" in r.json()

    def chunks() -> object:
        yield b'{"topic": "a", "payload": "x"}'

    r = api.post("/api/v1/publish", content=chunks(), headers={"content-type": "application/json"})  # type: ignore[arg-type]
    assert r.status_code == 411 and "error" in r.json()


def _restartable(tmp: Path, **kwargs: object) -> Gateway:
    gw = Gateway(tmp, admin=True, **kwargs)  # type: ignore[arg-type]
    gw.env.pop("TIDEWIRE_API_TOKEN", None)
    return gw


def test_generated_token_file_is_private_reused_and_never_logged(tmp_path: Path) -> None:
    gw = _restartable(tmp_path / "gen")
    try:
        gw.start()
        token_file = gw.data_dir / "api_token"
        token = token_file.read_text().strip()
        assert len(token) >= 40
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        with http(gw, token) as api:
            assert api.get("/api/v1/status").status_code == 200
        with http(gw, gw.api_token) as other:
            assert other.get("/api/v1/status").status_code == 401
        gw.stop()
        gw.start()
        assert token_file.read_text().strip() == token  # the same token after a restart
        with http(gw, token) as api:
            assert api.get("/api/v1/status").status_code == 200
        log = gw.stderr
        assert "admin.started" in log and str(token_file) in log and token not in log
    finally:
        gw.close()


def test_token_file_flag(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("file-token-123\nsecond line ignored\n")
    gw = _restartable(tmp_path / "file", extra_args=["--api-token-file", str(token_file)])
    try:
        gw.start()
        with http(gw, "file-token-123") as api:
            assert api.get("/api/v1/status").status_code == 200
        with http(gw, "second line ignored") as api:
            assert api.get("/api/v1/status").status_code == 401
        assert "file-token-123" not in gw.stderr
        assert not (gw.data_dir / "api_token").exists()
    finally:
        gw.close()


def test_resolve_token_sources(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("from-file\n")
    token, where = resolve_token(Settings(data_dir=tmp_path, api_token="direct", api_token_file=token_file))
    assert (token.value, token.source, where) == ("direct", "setting", None)
    assert "direct" not in repr(token)
    token, where = resolve_token(Settings(data_dir=tmp_path, api_token=" ", api_token_file=token_file))
    assert (token.value, where) == ("from-file", token_file)  # a blank api_token is no token
    token_file.write_text("\n")
    with pytest.raises(TokenError, match="no token"):
        resolve_token(Settings(data_dir=tmp_path, api_token_file=token_file))
    with pytest.raises(TokenError, match="no such file"):
        resolve_token(Settings(data_dir=tmp_path, api_token_file=tmp_path / "missing"))
    data = tmp_path / "data"
    made, where = resolve_token(Settings(data_dir=data))
    assert made.source == "generated" and where == data / "api_token"
    os.chmod(data / "api_token", 0o644)  # loosened by hand: tightened again when read
    again, _ = resolve_token(Settings(data_dir=data))
    assert again.value == made.value and stat.S_IMODE((data / "api_token").stat().st_mode) == 0o600


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[Node]:
    settings = Settings(data_dir=tmp_path, node_id="a1", sys_events=False, api_token="in-loop-token",
                        host="127.0.0.1", admin_port=free_port())
    store = EmbeddedStore(tmp_path / "data")
    await store.open()
    security = Security.build(settings)
    lookup = InProcessLookup()
    made = Node(settings, store, lookup, LocalNotifier(lookup), security.authorizer, security.enhanced,
                security.chain)
    await made.start()
    try:
        yield made
    finally:
        await made.stop()
        await security.close()
        await store.close()


async def test_admin_server_in_the_node_loop(node: Node) -> None:
    loop = asyncio.get_running_loop()
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    admin = AdminServer(node, node.settings)
    await admin.start()
    try:
        assert admin.port > 0  # port 0: a free one
        assert {sig: signal.getsignal(sig) for sig in before} == before  # uvicorn took no signal over
        assert not loop.remove_signal_handler(signal.SIGTERM)  # and added none to the loop
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{admin.port}", timeout=5.0) as client:
            assert (await client.get("/healthz")).json() == {"status": "ok"}
            status = await client.get("/api/v1/status", headers={"Authorization": "Bearer in-loop-token"})
            assert status.status_code == 200 and status.json()["node_id"] == "a1"
            node.draining = True
            ready = await client.get("/readyz")
            assert ready.status_code == 503
            assert ready.json() == {"status": "not ready", "reasons": ["draining"]}
            node.draining = False
        taken = node.settings.model_copy(update={"admin_port": admin.port})
        with pytest.raises(OSError):
            await AdminServer(node, taken).start()  # the port is in use: an error, not an exit
    finally:
        await admin.stop()
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", admin.port), timeout=1):
        pass  # closed
    await admin.stop()  # twice: a no-op
