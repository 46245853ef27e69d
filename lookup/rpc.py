"""Cluster RPC: authenticated, batched calls and one-way casts between gateway nodes over TCP.

Thin asyncio IO over the sans-IO core in `lookup.rpc_wire` (u32 length + msgpack frames). Everything queued
for a peer within one event-loop tick leaves in one write (one frame unless the batch exceeds `max_frame`); a
frame announcing more than `max_frame` bytes, or one that does not decode, closes that connection only.

Authentication is a mutual HMAC-SHA256 challenge/response over the shared cluster secret: the dialer sends
its node id and a nonce; the listener answers with its id, its own nonce and HMAC(secret, dialer nonce + own id
+ "server"); the dialer checks it and answers HMAC(secret, listener nonce + own id + "client"); the listener
checks that and welcomes. Until then a peer may send only tiny frames. Each node dials its peers lazily, one
connection per peer, reused and redialled on the next use after a failure (with a short backoff); calls and
casts go out on the dialled connection and replies come back on it.
"""

from __future__ import annotations

import asyncio
import hmac
import inspect
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, cast

from tidewire.errors import ClusterError
from tidewire.lookup.rpc_wire import Call, Cast, Challenge, FrameCodec, Hello, Message, Proof, Reply, Welcome, proof

log = logging.getLogger("tidewire.cluster.rpc")

DEFAULT_MAX_FRAME = 4 * 1024 * 1024  # bytes in one frame body; a bigger one closes the connection
HANDSHAKE_MAX_FRAME = 1024  # bytes per frame before the peer has authenticated
HANDSHAKE_TIMEOUT = 5.0  # seconds from accept until the peer must have authenticated
DEFAULT_MAX_QUEUE = 10_000  # messages queued for one peer (written out each tick unless its socket is full)
RECONNECT_BACKOFF = (0.05, 1.0)  # seconds: first and longest wait before dialling a failed peer again
NONCE_BYTES = 32
MAX_NODE_ID = 200  # characters in a node id sent in a handshake

Handler = Callable[[str, Any], Any]  # (from_node, payload) -> reply, or an awaitable of it
LostCallback = Callable[[], None]


class RpcError(ClusterError):
    """The peer answered a call with an error (unknown method, failing handler, message too large)."""


class _Link(asyncio.Protocol):
    """One TCP connection: the handshake, then calls and casts in (listener) or replies in (dialer)."""

    def __init__(self, rpc: RpcNode, peer: _Peer | None) -> None:
        self.rpc = rpc
        self.peer = peer  # None on the listening side
        self.codec = FrameCodec(HANDSHAKE_MAX_FRAME)
        self.transport: asyncio.Transport | None = None
        self.remote = ""  # the peer's node id, authenticated once state == "ready"
        self.state = "hello"
        self.nonce = os.urandom(NONCE_BYTES)
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.paused = False
        self.closed = False
        self._replies: list[Message] = []
        self._timer: asyncio.TimerHandle | None = None

    # transport callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's TCPTransport is not an asyncio.Transport subclass, but has its whole interface
        self.transport = cast(asyncio.Transport, transport)
        self._timer = asyncio.get_running_loop().call_later(HANDSHAKE_TIMEOUT, self.abort, "handshake timeout")
        if self.peer is not None:
            self.write([Hello(self.rpc.node_id, self.nonce)])
        else:
            self.rpc._inbound.add(self)

    def data_received(self, data: bytes) -> None:
        frames, error = self.codec.feed(data)
        for frame in frames:
            self.rpc.frames_received += 1
            for msg in frame:
                if self.closed:
                    return
                self._on_message(msg)
        if error is not None and not self.closed:
            self.abort(error)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
        if not self.ready.done():
            if self.peer is not None:  # the dialler awaits it; nobody awaits a listener's
                self.ready.set_exception(ConnectionError("cluster connection closed during the handshake"))
            else:
                self.ready.cancel()
        if self.peer is not None:
            self.peer.link_lost(self)
        else:
            self.rpc._inbound.discard(self)

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        if self.peer is not None:
            self.peer.flush()
        else:
            self._flush_replies()

    # helpers
    def abort(self, reason: str, *, quiet: bool = False) -> None:
        if self.closed:
            return
        self.closed = True
        if not quiet:
            where = self.remote or self._address()
            log.warning("cluster connection %s %s closed: %s", "to" if self.peer else "from", where, reason)
        if self.transport is not None:
            self.transport.abort()

    def _address(self) -> str:
        info = self.transport.get_extra_info("peername") if self.transport is not None else None
        return f"{info[0]}:{info[1]}" if isinstance(info, tuple) else "?"

    def write(self, messages: list[Message]) -> list[int]:
        """Write `messages` in one go; returns the indexes that could not be sent."""
        frames, rejected = self.codec.encode(messages)
        if frames and self.transport is not None and not self.closed:
            self.transport.write(b"".join(frames) if len(frames) > 1 else frames[0])
            self.rpc.frames_sent += len(frames)
        return rejected

    def reply(self, msg: Reply) -> None:
        if self.closed:
            return
        self._replies.append(msg)
        if len(self._replies) == 1:
            asyncio.get_running_loop().call_soon(self._flush_replies)

    def _flush_replies(self) -> None:
        if self.closed or not self._replies:
            return
        if self.paused:  # the peer does not read: hold replies, within a bound
            if len(self._replies) > self.rpc.max_queue:
                self.abort("peer does not read its replies")
            return
        replies, self._replies = self._replies, []
        for i in self.write(replies):
            bad = replies[i]
            assert isinstance(bad, Reply)
            self.write([Reply(bad.id, "reply too large or not encodable", None)])

    # the handshake and the messages
    def _on_message(self, msg: Message) -> None:
        rpc = self.rpc
        if self.state == "ready":
            if self.peer is None and isinstance(msg, Call):
                rpc._serve_call(self, msg)
            elif self.peer is None and isinstance(msg, Cast):
                rpc._serve(self.remote, msg.method, msg.payload)
            elif self.peer is not None and isinstance(msg, Reply):
                self.peer.on_reply(msg)
            else:
                self.abort("unexpected message")
        elif self.peer is None and self.state == "hello" and isinstance(msg, Hello):
            if not msg.node or len(msg.node) > MAX_NODE_ID or len(msg.nonce) != NONCE_BYTES:
                self.abort("malformed hello")
                return
            self.remote = msg.node
            self.write([Challenge(rpc.node_id, self.nonce, proof(rpc.secret, msg.nonce, rpc.node_id, "server"))])
            self.state = "proof"
        elif self.peer is None and self.state == "proof" and isinstance(msg, Proof):
            if not hmac.compare_digest(msg.proof, proof(rpc.secret, self.nonce, self.remote, "client")):
                rpc.auth_failures += 1
                self.abort("authentication failed (wrong cluster secret?)")
                return
            self.write([Welcome()])
            self._authenticated()
        elif self.peer is not None and self.state == "hello" and isinstance(msg, Challenge):
            if msg.node != self.peer.node_id:
                self.abort(f"the node at this address is {msg.node[:MAX_NODE_ID]!r}, not {self.peer.node_id!r}")
                return
            if len(msg.nonce) != NONCE_BYTES or not hmac.compare_digest(
                    msg.proof, proof(rpc.secret, self.nonce, msg.node, "server")):
                rpc.auth_failures += 1
                self.abort("authentication failed (wrong cluster secret?)")
                return
            self.remote = msg.node
            self.write([Proof(proof(rpc.secret, msg.nonce, rpc.node_id, "client"))])
            self.state = "welcome"
        elif self.peer is not None and self.state == "welcome" and isinstance(msg, Welcome):
            self._authenticated()
        else:
            self.abort("unexpected message during the handshake")

    def _authenticated(self) -> None:
        self.state = "ready"
        self.codec.max_frame = self.rpc.max_frame
        if self._timer is not None:
            self._timer.cancel()
        if not self.ready.done():
            self.ready.set_result(None)


class _Peer:
    """The dialled connection to one member: its outgoing queue, its calls awaiting replies, its redial policy."""

    def __init__(self, rpc: RpcNode, node_id: str, address: str) -> None:
        self.rpc = rpc
        self.node_id = node_id
        self.address = address
        host, _, port = address.rpartition(":")
        self.host, self.port = host.strip("[]"), int(port)
        self.link: _Link | None = None
        self.connecting: asyncio.Task[None] | None = None
        self.queue: list[tuple[Message, LostCallback | None]] = []
        self.calls: dict[int, asyncio.Future[Any]] = {}
        self.retry_at = 0.0
        self.backoff = RECONNECT_BACKOFF[0]
        self.closed = False
        self._flush_scheduled = False

    def enqueue(self, msg: Message, on_lost: LostCallback | None) -> bool:
        if self.closed or len(self.queue) >= self.rpc.max_queue:
            return False
        if self.link is None and self.connecting is None:
            if time.monotonic() < self.retry_at:
                return False
            self.connecting = asyncio.get_running_loop().create_task(self._connect())
        self.queue.append((msg, on_lost))
        if self.link is not None and not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)
        return True

    def flush(self) -> None:
        self._flush_scheduled = False
        link = self.link
        if link is None or link.closed or link.paused or not self.queue:
            return
        items, self.queue = self.queue, []
        for i in link.write([msg for msg, _ in items]):
            msg, on_lost = items[i]
            self._lose(msg, on_lost, RpcError("message too large or not encodable"))

    def on_reply(self, msg: Reply) -> None:
        fut = self.calls.pop(msg.id, None)
        if fut is not None and not fut.done():
            if msg.error is not None:
                fut.set_exception(RpcError(msg.error))
            else:
                fut.set_result(msg.payload)

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        link: _Link | None = None
        try:
            async with asyncio.timeout(self.rpc.call_timeout):
                _, link = await loop.create_connection(lambda: _Link(self.rpc, self), self.host, self.port)
                await link.ready
        except (OSError, TimeoutError) as exc:
            if link is not None:
                link.abort("handshake did not finish")
            self.retry_at = time.monotonic() + self.backoff
            self.backoff = min(self.backoff * 2, RECONNECT_BACKOFF[1])
            log.info("cluster peer %s at %s unreachable: %s", self.node_id, self.address, exc or type(exc).__name__)
            self.connecting = None
            self._fail(ConnectionError(f"cluster node {self.node_id!r} unreachable"))
            return
        self.connecting = None
        if self.closed:
            link.abort("", quiet=True)
            return
        if link.closed:  # lost between the handshake and now: its loss was not this peer's business yet
            self._fail(ConnectionError(f"connection to cluster node {self.node_id!r} lost"))
            return
        self.link = link
        self.backoff = RECONNECT_BACKOFF[0]
        self.flush()

    def link_lost(self, link: _Link) -> None:
        if link is self.link:
            self.link = None
            self._fail(ConnectionError(f"connection to cluster node {self.node_id!r} lost"))

    def _fail(self, exc: Exception) -> None:
        """Everything in flight to this peer is lost: calls fail, casts report loss, listeners hear about it."""
        items, self.queue = self.queue, []
        for msg, on_lost in items:
            self._lose(msg, on_lost, exc)
        calls, self.calls = self.calls, {}
        for fut in calls.values():
            if not fut.done():
                fut.set_exception(exc)
        self.rpc._peer_down(self.node_id)

    def _lose(self, msg: Message, on_lost: LostCallback | None, exc: Exception) -> None:
        if isinstance(msg, Call):
            fut = self.calls.pop(msg.id, None)
            if fut is not None and not fut.done():
                fut.set_exception(exc)
            return
        self.rpc.casts_dropped += 1
        if on_lost is not None:
            on_lost()

    def close(self) -> None:
        self.closed = True
        if self.connecting is not None:
            self.connecting.cancel()
        link, self.link = self.link, None
        if link is not None:
            link.abort("", quiet=True)
        self._fail(ConnectionError(f"cluster node {self.node_id!r} left"))


class RpcNode:
    """This node's end of the cluster RPC: a listener, one dialled connection per peer, method handlers."""

    def __init__(self, node_id: str, host: str, port: int, secret: bytes | str, *, call_timeout: float = 2.0,
                 max_frame: int = DEFAULT_MAX_FRAME, max_queue: int = DEFAULT_MAX_QUEUE) -> None:
        if not secret:
            raise ValueError("the cluster secret must not be empty")
        self.node_id = node_id
        self.host = host
        self.port = port
        self.secret = secret.encode() if isinstance(secret, str) else secret
        self.call_timeout = call_timeout
        self.max_frame = max_frame
        self.max_queue = max_queue
        self.frames_sent = 0
        self.frames_received = 0
        self.casts_dropped = 0
        self.auth_failures = 0
        self._handlers: dict[str, Handler] = {}
        self._peers: dict[str, _Peer] = {}
        self._inbound: set[_Link] = set()
        self._server: asyncio.Server | None = None
        self._local: list[tuple[str, Any]] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self._down_listeners: list[Callable[[str], None]] = []
        self._next_id = 0
        self._closed = False

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Link(self, None), self.host, self.port)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        self._closed = True
        if self._server is not None:
            self._server.close()
        for peer in list(self._peers.values()):
            peer.close()
        self._peers.clear()
        for link in list(self._inbound):
            link.abort("", quiet=True)
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    def stats(self) -> dict[str, int]:
        return {"frames_sent": self.frames_sent, "frames_received": self.frames_received,
                "casts_dropped": self.casts_dropped, "auth_failures": self.auth_failures,
                "peers_connected": sum(1 for p in self._peers.values() if p.link is not None)}

    def set_peers(self, peers: Mapping[str, str]) -> None:
        """The members and their "host:port" cluster addresses; connections to others are closed."""
        if self._closed:
            return
        for node_id in list(self._peers):
            if node_id not in peers or peers[node_id] != self._peers[node_id].address:
                self._peers.pop(node_id).close()
        for node_id, address in peers.items():
            if node_id != self.node_id and node_id not in self._peers:
                self._peers[node_id] = _Peer(self, node_id, address)

    def handle(self, method: str, fn: Handler) -> None:
        self._handlers[method] = fn

    def on_peer_down(self, listener: Callable[[str], None]) -> None:
        """`listener(node_id)` when a connection to a peer failed or broke: what was sent may be lost."""
        self._down_listeners.append(listener)

    async def call(self, node_id: str, method: str, payload: Any, *, timeout: float | None = None) -> Any:
        """The peer's reply. Raises RpcError, ConnectionError or TimeoutError."""
        if self._closed:
            raise ConnectionError("the cluster RPC is closed")
        if node_id == self.node_id:
            fn = self._handlers.get(method)
            if fn is None:
                raise RpcError(f"no handler for {method!r}")
            result = fn(node_id, payload)
            return await result if inspect.isawaitable(result) else result
        peer = self._peers.get(node_id)
        if peer is None:
            raise ConnectionError(f"{node_id!r} is not a cluster member")
        self._next_id += 1
        call_id = self._next_id
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        peer.calls[call_id] = fut
        if not peer.enqueue(Call(call_id, method, payload), None):
            del peer.calls[call_id]
            raise ConnectionError(f"cluster node {node_id!r} unreachable or its queue is full")
        try:
            async with asyncio.timeout(self.call_timeout if timeout is None else timeout):
                return await fut
        finally:
            peer.calls.pop(call_id, None)

    def cast(self, node_id: str, method: str, payload: Any, on_lost: LostCallback | None = None) -> bool:
        """Send one-way, never blocking. False: dropped now (unknown peer, peer down, queue full). `on_lost` is
        called later if a queued message is never written (no call when this returns False)."""
        if self._closed:
            self.casts_dropped += 1
            return False
        if node_id == self.node_id:
            self._local.append((method, payload))
            if len(self._local) == 1:
                asyncio.get_running_loop().call_soon(self._flush_local)
            return True
        peer = self._peers.get(node_id)
        if peer is None or not peer.enqueue(Cast(method, payload), on_lost):
            self.casts_dropped += 1
            return False
        return True

    def _flush_local(self) -> None:
        local, self._local = self._local, []
        if self._closed:
            return
        for method, payload in local:
            self._serve(self.node_id, method, payload)

    def _serve(self, from_node: str, method: str, payload: Any) -> None:
        fn = self._handlers.get(method)
        if fn is None:
            log.warning("cluster cast of unknown method %r from %s", method[:64], from_node)
            return
        try:
            result = fn(from_node, payload)
        except Exception:
            log.exception("cluster cast handler %s failed", method)
            return
        if inspect.isawaitable(result):
            self._spawn(self._finish(None, 0, method, result))

    def _serve_call(self, link: _Link, msg: Call) -> None:
        fn = self._handlers.get(msg.method)
        if fn is None:
            link.reply(Reply(msg.id, f"no handler for {msg.method[:64]!r}", None))
            return
        try:
            result = fn(link.remote, msg.payload)
        except Exception:
            log.exception("cluster call handler %s failed", msg.method)
            link.reply(Reply(msg.id, "handler failed", None))
            return
        if inspect.isawaitable(result):
            self._spawn(self._finish(link, msg.id, msg.method, result))
        else:
            link.reply(Reply(msg.id, None, result))

    async def _finish(self, link: _Link | None, call_id: int, method: str, result: Awaitable[Any]) -> None:
        try:
            value = await result
        except Exception:
            log.exception("cluster handler %s failed", method)
            if link is not None:
                link.reply(Reply(call_id, "handler failed", None))
            return
        if link is not None:
            link.reply(Reply(call_id, None, value))

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _peer_down(self, node_id: str) -> None:
        for listener in self._down_listeners:
            try:
                listener(node_id)
            except Exception:
                log.exception("cluster peer-down listener failed")
