"""Cluster RPC over real sockets: calls, batched casts, authentication, frame limits, reconnects."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import struct
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.waiting import until
from tidewire.lookup.rpc import NONCE_BYTES, RpcError, RpcNode
from tidewire.lookup.rpc_wire import Challenge, FrameCodec, Hello, Proof, Welcome, proof

SECRET = "correct horse battery staple"


@contextlib.asynccontextmanager
async def nodes(*ids: str, secrets: dict[str, str] | None = None, **kw: Any) -> AsyncIterator[dict[str, RpcNode]]:
    made = {i: RpcNode(i, "127.0.0.1", 0, (secrets or {}).get(i, SECRET), **kw) for i in ids}
    try:
        for n in made.values():
            await n.start()
        peers = {i: f"127.0.0.1:{n.port}" for i, n in made.items()}
        for n in made.values():
            n.set_peers(peers)
        yield made
    finally:
        for n in made.values():
            await n.close()


async def test_call_reply_and_errors() -> None:
    async with nodes("a", "b") as n:
        n["b"].handle("echo", lambda frm, p: [frm, p])

        async def slow(frm: str, p: Any) -> int:
            await asyncio.sleep(0.01)  # a handler that takes a while: replies come back out of turn
            return int(p) * 2

        n["b"].handle("double", slow)
        n["b"].handle("boom", lambda frm, p: 1 // 0)
        assert await n["a"].call("b", "echo", {"x": [1, b"\x00"]}) == ["a", {"x": [1, b"\x00"]}]
        assert await asyncio.gather(*(n["a"].call("b", "double", i) for i in range(20))) == [i * 2 for i in range(20)]
        with pytest.raises(RpcError):
            await n["a"].call("b", "nope", None)
        with pytest.raises(RpcError):
            await n["a"].call("b", "boom", None)
        with pytest.raises(ConnectionError):
            await n["a"].call("zz", "echo", None)
        assert await n["a"].call("b", "echo", 1) == ["a", 1]  # the connection survived the errors
        n["a"].handle("echo", lambda frm, p: p)
        assert await n["a"].call("a", "echo", 5) == 5  # to itself: no socket


async def test_call_timeout() -> None:
    async with nodes("a", "b") as n:
        n["b"].handle("hang", lambda frm, p: asyncio.sleep(10))  # never answers within the call's timeout
        with pytest.raises(TimeoutError):
            await n["a"].call("b", "hang", None, timeout=0.05)


async def test_casts_in_one_tick_leave_in_one_frame_in_order() -> None:
    async with nodes("a", "b") as n:
        got: list[Any] = []
        n["b"].handle("m", lambda frm, p: got.append((frm, p)))
        n["b"].handle("ping", lambda frm, p: p)
        await n["a"].call("b", "ping", 0)  # connected
        sent, received = n["a"].frames_sent, n["b"].frames_received
        for i in range(500):
            assert n["a"].cast("b", "m", i)
        await until(lambda: len(got) == 500)
        assert got == [("a", i) for i in range(500)]
        assert n["a"].frames_sent - sent == 1
        assert n["b"].frames_received - received == 1
        assert n["a"].casts_dropped == 0


async def test_casts_to_self_are_delivered_without_frames() -> None:
    async with nodes("a") as n:
        got: list[Any] = []
        n["a"].handle("m", lambda frm, p: got.append(p))
        n["a"].cast("a", "m", 1)
        n["a"].cast("a", "m", 2)
        assert got == []  # never inline: cast does not block or reenter
        await until(lambda: got == [1, 2])
        assert n["a"].frames_sent == 0


async def test_big_batches_split_into_frames_under_the_limit() -> None:
    async with nodes("a", "b", max_frame=64 * 1024) as n:
        got: list[int] = []
        n["b"].handle("m", lambda frm, p: got.append(len(p)))
        for _ in range(10):
            n["a"].cast("b", "m", b"x" * 20_000)  # 200 KB in one tick
        n["a"].cast("b", "m", b"y" * 100_000)  # alone over the limit: dropped, reported lost
        await until(lambda: len(got) == 10)
        assert n["a"].frames_sent >= 4
        assert n["a"].casts_dropped == 1


async def test_wrong_secret_is_refused_without_logging_it(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    async with nodes("a", "b", secrets={"a": "wrong-secret-1234"}) as n:
        n["b"].handle("echo", lambda frm, p: p)
        with pytest.raises(ConnectionError):
            await n["a"].call("b", "echo", 1)
        assert n["a"].auth_failures == 1  # the dialler checks the listener first
    assert "authentication failed" in caplog.text
    assert SECRET not in caplog.text and "wrong-secret-1234" not in caplog.text


async def _raw_handshake(port: int, secret: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, FrameCodec]:
    """A hand-rolled dialler (the listener's real peer here is this test)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    codec = FrameCodec(1 << 20)
    nonce = os.urandom(NONCE_BYTES)
    writer.write(b"".join(codec.encode([Hello("raw", nonce)])[0]))
    frames: list[list[Any]] = []
    while not frames:
        frames, error = codec.feed(await reader.read(4096))
        assert error is None
    challenge = frames[0][0]
    assert isinstance(challenge, Challenge) and challenge.node == "b"
    writer.write(b"".join(codec.encode([Proof(proof(secret.encode(), challenge.nonce, "raw", "client"))])[0]))
    return reader, writer, codec


async def test_listener_refuses_a_wrong_client_proof() -> None:
    async with nodes("b") as n:
        reader, writer, codec = await _raw_handshake(n["b"].port, "not the secret")
        assert await reader.read() == b""  # closed, no welcome
        writer.close()
        assert n["b"].auth_failures == 1
        reader, writer, codec = await _raw_handshake(n["b"].port, SECRET)
        frames, _ = codec.feed(await reader.read(4096))
        assert isinstance(frames[0][0], Welcome)
        writer.close()


async def test_oversized_frame_closes_only_that_connection() -> None:
    async with nodes("a", "c") as big, nodes("b", max_frame=64 * 1024) as small:
        b = small["b"]
        peers = {"b": f"127.0.0.1:{b.port}"}
        for n in big.values():
            n.set_peers(peers)
        got: list[tuple[str, int]] = []
        b.handle("m", lambda frm, p: got.append((frm, len(p))))
        b.handle("ping", lambda frm, p: p)
        assert await big["a"].call("b", "ping", 1) == 1
        assert await big["c"].call("b", "ping", 1) == 1
        big["a"].cast("b", "m", b"x" * 200_000)  # over b's limit
        await until(lambda: big["a"].stats()["peers_connected"] == 0)
        assert got == []
        assert await big["c"].call("b", "ping", 2) == 2  # the other connection is untouched
        big["c"].cast("b", "m", b"y")
        await until(lambda: got == [("c", 1)])
        assert await big["a"].call("b", "ping", 3) == 3  # a redials

        # before authentication even a modest frame is too big
        reader, writer = await asyncio.open_connection("127.0.0.1", b.port)
        writer.write(struct.pack(">I", 100_000) + b"\x00" * 100)
        assert await reader.read() == b""
        writer.close()


async def test_unreachable_peer_reports_lost_casts_then_backs_off() -> None:
    async with nodes("a", "b") as n:
        port = n["b"].port
        await n["b"].close()
        lost: list[int] = []
        down: list[str] = []
        n["a"].on_peer_down(down.append)
        n["a"].set_peers({"b": f"127.0.0.1:{port}"})
        for i in range(3):
            assert n["a"].cast("b", "m", i, on_lost=functools.partial(lost.append, i))  # queued while dialling
        await until(lambda: lost == [0, 1, 2])
        assert down == ["b"]
        assert not n["a"].cast("b", "m", 9)  # backing off: dropped at once
        assert n["a"].casts_dropped == 4
        with pytest.raises(ConnectionError):
            await n["a"].call("b", "m", None)


async def test_bounded_queue_drops_and_counts() -> None:
    async with nodes("a", "b", max_queue=5) as n:
        results = [n["a"].cast("b", "m", i) for i in range(8)]  # still dialling: all wait in the queue
        assert results == [True] * 5 + [False] * 3
        assert n["a"].casts_dropped == 3


async def test_peer_restart_is_redialled_and_a_wrong_node_refused() -> None:
    async with nodes("a", "b", "c") as n:
        n["b"].handle("ping", lambda frm, p: "b1")
        assert await n["a"].call("b", "ping", None) == "b1"
        down: list[str] = []
        n["a"].on_peer_down(down.append)
        port = n["b"].port
        await n["b"].close()
        await until(lambda: down == ["b"])
        b2 = RpcNode("b", "127.0.0.1", port, SECRET)
        await b2.start()
        try:
            b2.handle("ping", lambda frm, p: "b2")

            async def answered_by_b2() -> bool:
                try:
                    return await n["a"].call("b", "ping", None) == "b2"
                except ConnectionError:
                    return False  # a dial failed while b was down: backing off

            await until(answered_by_b2, timeout=3.0, what="a call answered by the restarted b")
        finally:
            await b2.close()
        n["a"].set_peers({"b": f"127.0.0.1:{n['c'].port}"})  # the address now answers as another node
        with pytest.raises(ConnectionError):
            await n["a"].call("b", "ping", None)
