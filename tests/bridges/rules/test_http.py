"""The webhook's HTTP/1.1 client against a real HTTP server (the standard library's): status codes, kept-alive
connections, URLs that need percent-encoding, and errors (nothing listening, no answer in time) as HttpError."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator

import pytest

from tests.bridges.rules.webhook_server import WebhookServer
from tidewire.bridges.rules.http import Endpoint, HttpError


@pytest.fixture
def server() -> Iterator[WebhookServer]:
    made = WebhookServer()
    yield made
    made.close()


async def test_posts_and_reads_the_status(server: WebhookServer) -> None:
    endpoint = Endpoint(f"http://127.0.0.1:{server.port}/a b/<x>?q=1 2", 2, 5.0)
    try:
        assert await endpoint.post(b'{"a":1}', {"Content-Type": "application/json"}) == 200
        server.status = 503
        assert await endpoint.post(b"[]", {}) == 503
        await asyncio.gather(*(endpoint.post(b"{}", {}) for _ in range(10)))
    finally:
        await endpoint.close()
    assert [r.path for r in server.requests[:1]] == ["/a%20b/%3Cx%3E?q=1%202"]
    assert server.requests[0].body == b'{"a":1}' and server.requests[0].headers["content-type"] == "application/json"
    assert len(server.requests) == 12


async def test_nothing_listening_or_no_answer_is_an_http_error() -> None:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    closed = Endpoint(f"http://127.0.0.1:{port}/", 1, 2.0)
    with pytest.raises(HttpError):
        await closed.post(b"{}", {})
    silent = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)  # accepts, never answers
    try:
        endpoint = Endpoint(f"http://127.0.0.1:{silent.sockets[0].getsockname()[1]}/", 1, 0.3)
        with pytest.raises(HttpError, match="TimeoutError"):
            await endpoint.post(b"{}", {})
    finally:
        silent.close()
