"""A real HTTP endpoint for webhook tests (the standard library's threaded server): it records every request and
answers with the status its test sets (e.g. 503 while "down"), checking the HMAC signature when given a secret."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Request:
    path: str
    headers: dict[str, str]
    body: bytes
    status: int  # what the server answered
    signed: bool | None = None  # the signature checked out (None: no secret to check with)

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class WebhookServer:
    secret: str | None = None
    status: int = 200  # answer to the next requests
    requests: list[Request] = field(default_factory=list)

    def __post_init__(self) -> None:
        owner = self
        self._lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                headers = {k.lower(): v for k, v in self.headers.items()}
                signed = None
                if owner.secret is not None:
                    stamp = headers.get("x-tidewire-timestamp", "")
                    want = hmac.new(owner.secret.encode(), stamp.encode() + b"." + body, hashlib.sha256).hexdigest()
                    signed = hmac.compare_digest(headers.get("x-tidewire-signature", ""), f"sha256={want}")
                with owner._lock:
                    status = owner.status if signed is not False else 401
                    owner.requests.append(Request(self.path, headers, body, status, signed))
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def delivered(self) -> list[Any]:
        """Every JSON result the server accepted (2xx), batches flattened."""
        out: list[Any] = []
        with self._lock:
            for request in self.requests:
                if 200 <= request.status < 300:
                    got = request.json()
                    out += got if isinstance(got, list) else [got]
        return out

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
