"""A webhook's HTTP/1.1 client: keep-alive connections to one endpoint, framed by h11 (the sans-IO HTTP core httpx
itself stands on) over asyncio streams, TLS when the URL says https. It only POSTs and reads the status. Why not
httpx: with it a webhook rule fell behind at 1,000 requests/s on the node's shared core (`loadtest.rules_bench`:
p50 190 ms publish → webhook); with this client, 0.5 ms."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import urllib.parse

import h11

from tidewire.errors import TidewireError

READ_CHUNK = 65536


class HttpError(TidewireError, ConnectionError):
    """The request could not be made or answered (connection, TLS, timeout, a malformed answer)."""


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.h11 = h11.Connection(h11.CLIENT)

    def close(self) -> None:
        self.writer.close()


class Endpoint:
    """POSTs to one URL over up to `size` kept-alive connections."""

    def __init__(self, url: str, size: int, timeout: float) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        # h11 sends only a valid request target: what the URL holds beyond it is percent-encoded, as httpx does.
        path = urllib.parse.quote(parts.path or "/", safe="/%:@!$&'()*+,;=-._~")
        query = urllib.parse.quote(parts.query, safe="/?%:@!$&'()*+,;=-._~")
        self.target = path + (f"?{query}" if query else "")
        self.authority = parts.netloc.rsplit("@", 1)[-1]
        self.tls = ssl.create_default_context() if parts.scheme == "https" else None
        self.timeout = timeout
        self._idle: list[_Connection] = []
        self._slots = asyncio.Semaphore(size)

    async def post(self, body: bytes, headers: dict[str, str]) -> int:
        """The answer's status code; HttpError when there is none within the timeout."""
        async with self._slots:
            conn = self._idle.pop() if self._idle else None
            try:
                async with asyncio.timeout(self.timeout):
                    if conn is None:
                        reader, writer = await asyncio.open_connection(self.host, self.port, ssl=self.tls)
                        conn = _Connection(reader, writer)
                    status, reusable = await self._exchange(conn, body, headers)
            except (OSError, TimeoutError, h11.ProtocolError) as exc:
                if conn is not None:
                    conn.close()
                raise HttpError(f"{type(exc).__name__}: {exc}") from exc
            if reusable:
                conn.h11.start_next_cycle()
                self._idle.append(conn)
            else:
                conn.close()
            return status

    async def _exchange(self, conn: _Connection, body: bytes, headers: dict[str, str]) -> tuple[int, bool]:
        h = conn.h11
        fields = [("Host", self.authority), ("Content-Length", str(len(body))), *headers.items()]
        conn.writer.write(h.send(h11.Request(method="POST", target=self.target, headers=fields)) or b"")
        conn.writer.write(h.send(h11.Data(data=body)) or b"")
        conn.writer.write(h.send(h11.EndOfMessage()) or b"")
        await conn.writer.drain()
        status = 0
        while True:
            event = h.next_event()
            if event is h11.NEED_DATA:
                data = await conn.reader.read(READ_CHUNK)
                if not data and h.their_state is h11.SEND_RESPONSE:
                    raise HttpError("the endpoint closed the connection without an answer")
                h.receive_data(data)
            elif isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.EndOfMessage):
                return status, h.our_state is h11.DONE and h.their_state is h11.DONE
            elif isinstance(event, h11.ConnectionClosed):
                return status, False
            # InformationalResponse (1xx) and Data (a body we do not read) are passed over

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            with contextlib.suppress(Exception):
                conn.close()
