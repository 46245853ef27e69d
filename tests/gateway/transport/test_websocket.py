"""WebSocketProtocol over real sockets: the websockets client, paho-mqtt over WebSocket, and a raw socket for
what no well-behaved client sends. The inner protocol records what reaches it, as MqttProtocol would see it."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import os
import socket
import struct
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any, cast

import paho.mqtt.client as paho
import pytest
import uvloop
from hypothesis import given, settings
from hypothesis import strategies as st
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.typing import Subprotocol

from tests.waiting import until
from tidewire.gateway.transport.websocket import WebSocketError, WebSocketProtocol, WebSocketTransport
from tidewire.gateway.transport.websocket_core import FrameReader, WebSocketOptions, WebSocketRequest

CONNACK = b"\x20\x02\x00\x00"
MQTT = [Subprotocol("mqtt")]


class Recorder(asyncio.Protocol):
    """The inner protocol: keeps every byte and callback; answers a CONNECT with a CONNACK when asked."""

    def __init__(self, *, connack: bool = False) -> None:
        self.transport: WebSocketTransport | None = None
        self.data = bytearray()
        self.lost: list[Exception | None] = []
        self.eof = 0
        self.pauses: list[str] = []
        self.connack = connack

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(WebSocketTransport, transport)

    def data_received(self, data: bytes) -> None:
        self.data += data
        if self.connack and self.data[:1] == b"\x10":
            assert self.transport is not None
            self.transport.write(CONNACK)

    def eof_received(self) -> bool | None:
        self.eof += 1
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost.append(exc)

    def pause_writing(self) -> None:
        self.pauses.append("pause")

    def resume_writing(self) -> None:
        self.pauses.append("resume")

    async def until(self, check: Callable[[], bool], timeout: float = 3.0) -> None:
        await until(check, timeout)


class Counted(WebSocketProtocol):
    """The server's protocol, counting the connections that ended: after that nothing reaches their inner."""

    def __init__(self, server: Server) -> None:
        super().__init__(server._inner, server.options)
        self.server = server

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self.server.ended += 1


class Server:
    def __init__(self, options: WebSocketOptions, **inner: Any) -> None:
        self.options = options
        self.inner_kwargs = inner
        self.inners: list[Recorder] = []
        self.server: asyncio.Server | None = None
        self.port = 0
        self.ended = 0  # connections whose connection_lost the server protocol has seen

    def _inner(self) -> Recorder:
        self.inners.append(Recorder(**self.inner_kwargs))
        return self.inners[-1]

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(lambda: Counted(self), "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    def url(self, path: str = "/mqtt") -> str:
        return f"ws://127.0.0.1:{self.port}{path}"

    async def inner(self) -> Recorder:
        await until(lambda: self.inners, timeout=3, what="a connection's inner protocol")
        return self.inners[0]


@contextlib.asynccontextmanager
async def serving(options: WebSocketOptions | None = None, **inner: Any) -> AsyncIterator[Server]:
    server = Server(options or WebSocketOptions(), **inner)
    await server.start()
    try:
        yield server
    finally:
        assert server.server is not None
        server.server.close()
        for recorder in server.inners:
            if recorder.transport is not None:
                recorder.transport.abort()
        await server.server.wait_closed()


def upgrade_request(path: str = "/mqtt", protocol: str | None = "mqtt", **headers: str) -> bytes:
    fields = {"Host": "127.0.0.1", "Upgrade": "websocket", "Connection": "Upgrade",
              "Sec-WebSocket-Key": base64.b64encode(os.urandom(16)).decode(), "Sec-WebSocket-Version": "13"}
    if protocol is not None:
        fields["Sec-WebSocket-Protocol"] = protocol
    fields.update({name.replace("_", "-"): value for name, value in headers.items()})
    lines = [f"GET {path} HTTP/1.1", *(f"{name}: {value}" for name, value in fields.items() if value)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def client_frame(opcode: int, payload: bytes, *, fin: bool = True, mask: bool = True, rsv: int = 0) -> bytes:
    n = len(payload)
    length = bytes((0x80 * mask | n,)) if n < 126 else bytes((0x80 * mask | 126,)) + struct.pack("!H", n) \
        if n < 65536 else bytes((0x80 * mask | 127,)) + struct.pack("!Q", n)
    head = bytes((0x80 * fin | rsv << 4 | opcode,)) + length
    if not mask:
        return head + payload
    key = os.urandom(4)
    return head + key + bytes(b ^ key[i & 3] for i, b in enumerate(payload))


async def raw_client(server: Server, request: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(request)
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 3)
    return reader, writer, head


async def read_frame(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    b0, b1 = await asyncio.wait_for(reader.readexactly(2), 3)
    n = b1 & 0x7F
    if n == 126:
        n = struct.unpack("!H", await reader.readexactly(2))[0]
    elif n == 127:
        n = struct.unpack("!Q", await reader.readexactly(8))[0]
    assert not b1 & 0x80, "server frames are never masked"
    return b0, await reader.readexactly(n)


# --- handshake --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("offered", "chosen"), [(["mqtt"], "mqtt"), (["mqttv3.1"], "mqttv3.1"),
                                                 (["mqttv3.1", "mqtt"], "mqtt"), (None, None)])
async def test_handshake_selects_subprotocol(offered: list[Any] | None, chosen: str | None) -> None:
    async with serving() as server, connect(server.url("/mqtt?token=x"), subprotocols=offered) as ws:
        assert ws.subprotocol == chosen
        inner = await server.inner()
        assert inner.transport is not None
        request = inner.transport.get_extra_info("websocket_request")
        assert request == WebSocketRequest("/mqtt?token=x", chosen)
        assert inner.transport.get_extra_info("peername") == ws.local_address
        assert inner.transport.get_extra_info("sslcontext") is None
        assert not inner.transport.can_write_eof() and not inner.transport.is_closing()


@pytest.mark.parametrize(("options", "url_path", "offered", "status"), [
    (WebSocketOptions(), "/other", ["mqtt"], 404),
    (WebSocketOptions(path="/ws"), "/mqtt", ["mqtt"], 404),
    (WebSocketOptions(), "/mqtt", ["chat"], 400),
    (WebSocketOptions(require_subprotocol=True), "/mqtt", None, 400),
])
async def test_handshake_refusals(options: WebSocketOptions, url_path: str, offered: list[Any] | None,
                                  status: int) -> None:
    async with serving(options) as server:
        with pytest.raises(InvalidStatus) as info:
            async with connect(server.url(url_path), subprotocols=offered):
                pass
        assert info.value.response.status_code == status
        assert server.inners == []


@pytest.mark.parametrize(("request_bytes", "status"), [
    (b"GET /mqtt HTTP/1.1\r\nHost: x\r\n\r\n", 426),  # a browser, not a WebSocket client
    (upgrade_request(Sec_WebSocket_Version="8"), 426),
    (upgrade_request(Connection="keep-alive"), 426),
    (upgrade_request(Sec_WebSocket_Key="c2hvcnQ="), 400),
    (upgrade_request().replace(b"GET", b"POST", 1), 405),
    (upgrade_request().replace(b"HTTP/1.1", b"HTTP/1.0", 1), 400),
    (b"GARBAGE\r\n\r\n", 400),
    (upgrade_request().replace(b"Host:", b"Host :", 1), 400),
    (upgrade_request(X_Filler="a" * 9000), 431),
    (upgrade_request(Origin="https://evil.example"), 403),
])
async def test_bad_upgrade_gets_http_error(request_bytes: bytes, status: int) -> None:
    options = WebSocketOptions(origins=frozenset({"https://good.example"}))
    async with serving(options) as server:
        reader, writer, head = await raw_client(server, request_bytes + b"\r\n" * (status == 403))
        assert head.startswith(f"HTTP/1.1 {status} ".encode())
        if status == 426:
            assert b"\r\nUpgrade: websocket\r\n" in head
        length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
        assert len(await reader.readexactly(length)) == length
        assert await asyncio.wait_for(reader.read(), 3) == b""  # and the server closes
        writer.close()
        assert server.inners == []


async def test_origin_allowed_and_headers_kept() -> None:
    options = WebSocketOptions(origins=frozenset({"https://good.example"}),
                               keep_headers=frozenset({"x-forwarded-for"}))
    async with serving(options) as server:
        request = upgrade_request(Origin="https://good.example", X_Forwarded_For="10.1.2.3")
        _, writer, head = await raw_client(server, request)
        assert head.startswith(b"HTTP/1.1 101 ")
        inner = await server.inner()
        assert inner.transport is not None
        kept = inner.transport.get_extra_info("websocket_request").headers
        assert kept == (("x-forwarded-for", "10.1.2.3"),)
        writer.close()


async def test_handshake_timeout_closes() -> None:
    async with serving(WebSocketOptions(handshake_timeout=0.2)) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(upgrade_request()[:20])
        assert await asyncio.wait_for(reader.read(), 3) == b""
        writer.close()
        assert server.inners == []


# --- data ---------------------------------------------------------------------------------------------------------
async def test_packets_split_and_joined_across_frames_reach_inner_intact() -> None:
    publish_a = b"\x30\x0b\x00\x03a/b" + b"payload"[:6]
    publish_b = b"\x30\x07\x00\x01c" + b"xyzw"
    async with serving() as server, connect(server.url(), subprotocols=MQTT) as ws:
        inner = await server.inner()
        await ws.send(publish_a[:5])  # one packet over two messages
        await ws.send(publish_a[5:])
        await ws.send(publish_a + publish_b)  # two packets in one frame
        await ws.send([publish_b[:3], publish_b[3:]])  # a fragmented message: binary then continuation
        expected = publish_a + publish_a + publish_b + publish_b
        await inner.until(lambda: len(inner.data) >= len(expected))
        assert bytes(inner.data) == expected


async def test_writes_arrive_as_one_binary_frame_each() -> None:
    async with serving() as server, connect(server.url(), subprotocols=MQTT, max_size=None) as ws:
        inner = await server.inner()
        assert inner.transport is not None
        big = os.urandom(70_000)
        inner.transport.write(b"\x20\x02\x00\x00")
        inner.transport.writelines([b"\x90\x03", b"\x00\x01", b"\x00"])
        inner.transport.writelines(iter([b"x" * 300]))
        inner.transport.write(big)
        inner.transport.write(b"")  # nothing, as asyncio does for an empty write
        assert await ws.recv() == b"\x20\x02\x00\x00"
        assert await ws.recv() == b"\x90\x03\x00\x01\x00"
        assert await ws.recv() == b"x" * 300
        assert await ws.recv() == big


async def test_ping_gets_pong() -> None:
    async with serving() as server, connect(server.url(), subprotocols=MQTT) as ws:
        await asyncio.wait_for(await ws.ping(b"are you there"), 3)  # fails unless our pong carries the payload
        await ws.pong(b"unsolicited")  # ignored
        await ws.send(b"\xc0\x00")
        inner = await server.inner()
        await inner.until(lambda: bytes(inner.data) == b"\xc0\x00")


async def test_client_close_reaches_inner_once() -> None:
    async with serving() as server:
        ws = await connect(server.url(), subprotocols=MQTT)
        inner = await server.inner()
        await ws.close(1000, "bye")
        assert ws.close_code == 1000  # the server echoed the code
        await until(lambda: server.ended == 1, what="the connection ended")  # nothing reaches the inner after
        assert inner.lost == [None]
        assert inner.transport is not None and inner.transport.is_closing()
        inner.transport.write(b"late")  # dropped, no error


async def test_server_close_sends_close_frame() -> None:
    async with serving() as server, connect(server.url(), subprotocols=MQTT) as ws:
        inner = await server.inner()
        assert inner.transport is not None
        inner.transport.write(b"\xe0\x00")
        inner.transport.close()
        assert await ws.recv() == b"\xe0\x00"
        with pytest.raises(ConnectionClosed):
            await ws.recv()
        assert ws.close_code == 1000
        await inner.until(lambda: bool(inner.lost))
        assert inner.lost == [None]


async def _closed_with(ws: ClientConnection, code: int) -> None:
    with pytest.raises(ConnectionClosed):
        await asyncio.wait_for(ws.recv(), 3)
    assert ws.close_code == code


async def test_text_frame_closes_1003() -> None:
    async with serving() as server, connect(server.url(), subprotocols=MQTT) as ws:
        await ws.send("text is not MQTT")
        await _closed_with(ws, 1003)
        inner = await server.inner()
        await inner.until(lambda: bool(inner.lost))
        assert len(inner.lost) == 1 and isinstance(inner.lost[0], WebSocketError) and inner.lost[0].code == 1003
        assert inner.data == b""


async def test_oversize_frame_closes_1009() -> None:
    async with serving(WebSocketOptions(max_frame=1000)) as server, \
            connect(server.url(), subprotocols=MQTT) as ws:
        await ws.send(b"a" * 1000)  # at the limit: accepted
        await ws.send(b"b" * 1001)
        await _closed_with(ws, 1009)
        inner = await server.inner()
        await inner.until(lambda: bool(inner.lost))
        assert bytes(inner.data) == b"a" * 1000
        assert isinstance(inner.lost[0], WebSocketError) and inner.lost[0].code == 1009


@pytest.mark.parametrize(("frame", "code"), [
    (client_frame(2, b"abc", mask=False), 1002),
    (client_frame(2, b"abc", rsv=4), 1002),  # compressed, but nothing was negotiated
    (client_frame(0, b"abc"), 1002),  # continuation with no message begun
    (client_frame(2, b"ab", fin=False) + client_frame(2, b"c"), 1002),  # new message inside a fragmented one
    (client_frame(9, b"p", fin=False), 1002),  # fragmented control frame
    (client_frame(9, b"p" * 126), 1002),
    (client_frame(5, b""), 1002),  # reserved opcode
    (client_frame(8, b"\x03"), 1002),  # one-byte close payload
    (client_frame(8, b"\x03\xec"), 1002),  # close code 1004 is reserved
    (client_frame(8, b"\x03\xe8\xff"), 1007),  # close reason not UTF-8
    (client_frame(1, b"t"), 1003),
])
async def test_malformed_frames_close_with_code(frame: bytes, code: int) -> None:
    delivered = b"okab" if frame.startswith(b"\x02") else b"ok"  # a fragment is passed on as it arrives
    async with serving() as server:
        reader, writer, head = await raw_client(server, upgrade_request())
        assert head.startswith(b"HTTP/1.1 101 ")
        writer.write(client_frame(2, b"ok") + frame)
        b0, payload = await read_frame(reader)
        assert b0 == 0x88 and int.from_bytes(payload[:2], "big") == code
        inner = await server.inner()
        await inner.until(lambda: bool(inner.lost))
        assert bytes(inner.data) == delivered  # what came before the bad frame was delivered
        assert isinstance(inner.lost[0], WebSocketError) and inner.lost[0].code == code
        writer.write(client_frame(8, b"\x03\xe8"))  # our close reply: the server then closes TCP
        assert await asyncio.wait_for(reader.read(), 3) == b""
        writer.close()
        assert len(inner.lost) == 1


async def test_frames_right_after_request_and_close_without_reply() -> None:
    async with serving(WebSocketOptions(close_timeout=0.2)) as server:
        reader, writer, _ = await raw_client(server, upgrade_request() + client_frame(2, b"early"))
        inner = await server.inner()
        await inner.until(lambda: bytes(inner.data) == b"early")
        assert inner.transport is not None
        inner.transport.close()
        b0, payload = await read_frame(reader)
        assert (b0, payload) == (0x88, b"\x03\xe8")
        writer.write(client_frame(2, b"ignored after close"))
        assert await asyncio.wait_for(reader.read(), 3) == b""  # no close reply: closed after close_timeout
        await inner.until(lambda: bool(inner.lost))
        assert bytes(inner.data) == b"early" and inner.lost == [None]
        writer.close()


async def test_abrupt_disconnect_reaches_inner_once() -> None:
    async with serving() as server:
        _, writer, _ = await raw_client(server, upgrade_request())
        inner = await server.inner()
        writer.write(client_frame(2, b"\x10"))
        writer.transport.abort()
        await until(lambda: server.ended == 1, what="the connection ended")  # nothing reaches the inner after
        assert inner.lost == [None] and bytes(inner.data) == b"\x10"


async def test_pause_reading_and_write_flow_control_pass_through() -> None:
    async with serving() as server:
        reader, writer, _ = await raw_client(server, upgrade_request())
        inner = await server.inner()
        assert inner.transport is not None
        inner.transport.pause_reading()
        writer.write(client_frame(2, b"held"))
        await asyncio.sleep(0.1)  # absence: the frame stays in the socket while reading is paused
        assert inner.data == b""
        inner.transport.resume_reading()
        await inner.until(lambda: bytes(inner.data) == b"held")
        inner.transport.set_write_buffer_limits(high=4096)
        assert inner.transport.get_write_buffer_limits()[1] == 4096
        chunk = b"z" * 65536
        for _ in range(64):  # more than the kernel buffers: the client is not reading yet
            inner.transport.write(chunk)
        assert inner.pauses == ["pause"] and inner.transport.get_write_buffer_size() > 0
        received = 0
        while received < 64 * len(chunk):
            _, payload = await read_frame(reader)
            received += len(payload)
        await inner.until(lambda: inner.pauses == ["pause", "resume"])
        writer.close()


def test_paho_over_websocket_gets_connack() -> None:
    """paho-mqtt with transport="websockets", in its own thread against the server on uvloop."""

    async def main() -> None:
        async with serving(connack=True) as server:
            connected = threading.Event()
            client = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id="ws-client", transport="websockets",
                                 protocol=paho.MQTTv311)
            client.ws_set_options(path="/mqtt")
            codes: list[Any] = []

            def on_connect(client: paho.Client, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
                codes.append(reason)
                connected.set()

            client.on_connect = on_connect
            await asyncio.to_thread(client.connect, "127.0.0.1", server.port, 30)  # blocks on the handshake
            client.loop_start()
            try:
                assert await asyncio.to_thread(connected.wait, 5)
                assert codes[0] == 0
                inner = await server.inner()
                assert inner.data[0] == 0x10 and b"\x00\x04MQTT\x04" in inner.data and b"ws-client" in inner.data
                request = inner.transport.get_extra_info("websocket_request") if inner.transport else None
                assert request is not None and request.subprotocol == "mqtt"
            finally:
                client.disconnect()
                client.loop_stop()
            await inner.until(lambda: bool(inner.lost))
            assert inner.data.endswith(b"\xe0\x00")  # DISCONNECT came through as well

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main())


# --- FrameReader (sans-IO) ----------------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(payloads=st.lists(st.binary(max_size=300), min_size=1, max_size=6),
       cuts=st.lists(st.integers(min_value=0, max_value=2000), max_size=8), ping=st.binary(max_size=125))
def test_reader_streams_any_split(payloads: list[bytes], cuts: list[int], ping: bytes) -> None:
    stream = b"".join(client_frame(2, p) + client_frame(9, ping) for p in payloads) + client_frame(8, b"\x03\xe8")
    reader = FrameReader(max_frame=1000)
    out = b""
    pings = []
    bounds = [0, *sorted(c % (len(stream) + 1) for c in cuts), len(stream)]
    for start, end in itertools.pairwise(bounds):
        out += reader.feed(stream[start:end])
        assert len(reader._head) <= 139  # never more than one header or control frame held
        pings += reader.events or []
        reader.events = None
    assert out == b"".join(payloads)
    assert pings == [(9, ping)] * len(payloads) + [(8, b"\x03\xe8")]
    assert reader.done and reader.feed(client_frame(2, b"after close")) == b""


def test_reader_bounds_64bit_length() -> None:
    reader = FrameReader(max_frame=1 << 20)
    assert reader.feed(b"\x82\xff" + (1 << 63).to_bytes(8, "big") + b"mask") == b""
    assert reader.events == [(-1, b"\x03\xf1frame too large")] and reader.done


async def test_socket_cleanup_leaves_no_connection() -> None:
    async with serving() as server:
        sock = socket.create_connection(("127.0.0.1", server.port))
        sock.close()
        await until(lambda: server.ended == 1, what="the connection ended")
        assert server.inners == []
