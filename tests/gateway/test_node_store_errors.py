"""The node's background loops survive store errors: a real gateway in-process over a store that fails on
demand (`store.failing.FailingStore` around a real `EmbeddedStore`), driven by real clients over real sockets:
paho subscribers, raw-socket publishers (one thread writes every packet in order; paho publishing from outside
its loop thread may reorder packets on the wire).

While appends or syncs fail, QoS 1 publishers get no PUBACK and nothing is lost; after recovery every message
is acked and delivered once, in order. Failing reads delay delivery, never skip it. Only clients' QoS 0
publishes may be dropped, only while the store is down and the append queue is full, and they are counted.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.integration.paho import PahoClient, Received
from tests.integration.rawmqtt import RawClient
from tests.store.failing import FailingStore
from tests.waiting import until
from tidewire.extensions.hooks import AllowAll
from tidewire.gateway.config import Settings
from tidewire.gateway.node import Node
from tidewire.gateway.protocols.mqtt.codec import Puback, Publish, encode
from tidewire.gateway.server import open_listeners
from tidewire.lookup.base import InProcessLookup
from tidewire.notify.base import LocalNotifier
from tidewire.store.base import Message
from tidewire.store.embedded.engine import EmbeddedStore

MAX_PENDING = 20  # small, so that 50 publishes overflow the append queue while the store is down
N = 50


@dataclass
class Running:
    node: Node
    store: FailingStore
    port: int
    clients: list[PahoClient | RawClient]

    async def subscriber(self, client_id: str, filters: list[tuple[str, int]], clean: bool = True,
                         session_expiry: int | None = None) -> PahoClient:
        paho = PahoClient(self.port, client_id, version=5, clean=clean)
        self.clients.append(paho)
        await asyncio.to_thread(paho.connect, None, session_expiry)
        await asyncio.to_thread(paho.subscribe, filters)
        return paho

    async def publisher(self, client_id: str) -> RawClient:
        raw = await asyncio.to_thread(RawClient, self.port, 5)
        self.clients.append(raw)
        await asyncio.to_thread(raw.connect, client_id)
        return raw


@pytest.fixture
async def gw(tmp_path: Path) -> AsyncIterator[Running]:
    settings = Settings(data_dir=tmp_path, port=0, sys_events=False, node_id="n1")
    store = FailingStore(EmbeddedStore(tmp_path, fsync="batch"))
    await store.open()
    lookup = InProcessLookup()
    node = Node(settings, store, lookup, LocalNotifier(lookup), AllowAll(), max_pending=MAX_PENDING)
    await node.start()
    servers = await open_listeners(node, None)
    port = servers[0].sockets[0].getsockname()[1]  # type: ignore[attr-defined]
    running = Running(node, store, port, [])
    try:
        yield running
    finally:
        for client in running.clients:
            await asyncio.to_thread(client.close)
        store.heal()
        for server in servers:
            server.close()
        await node.stop()
        await store.close()


async def send(raw: RawClient, topic: str, numbers: range, qos: int = 1) -> None:
    """One write of PUBLISH packets, payload `m<i>` and (QoS > 0) packet id i + 1."""
    data = b"".join(encode(Publish(topic=topic, payload=f"m{i}".encode(), qos=qos, packet_id=i + 1 if qos else 0), 5)
                    for i in numbers)
    await asyncio.to_thread(raw.send_raw, data)


async def pubacks(raw: RawClient, n: int, timeout: float = 5.0) -> list[tuple[int, int]]:
    """The next `n` PUBACKs as (packet id, reason code), in the order they came."""
    def read() -> list[tuple[int, int]]:
        acks = [raw.expect(Puback, timeout) for _ in range(n)]
        return [(ack.packet_id, ack.reason_code) for ack in acks]

    return await asyncio.to_thread(read)


def in_order(numbers: range) -> list[tuple[int, int]]:
    return [(i + 1, 0) for i in numbers]


async def no_packet(raw: RawClient, seconds: float) -> None:
    await asyncio.to_thread(raw.nothing, seconds)


async def expect(paho: PahoClient, n: int, timeout: float = 5.0) -> list[Received]:
    got = await asyncio.to_thread(paho.expect, n, timeout)
    await asyncio.to_thread(paho.assert_nothing, 0.3)  # exactly once: nothing more follows
    return got


def payloads(messages: list[Received]) -> list[bytes]:
    return [m.payload for m in messages]


def sent(numbers: range) -> list[bytes]:
    return [f"m{i}".encode() for i in numbers]


def log_events(caplog: pytest.LogCaptureFixture, event: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "tidewire.node" and r.getMessage() == event]


async def round_trip(pub: RawClient, sub: PahoClient, topic: str) -> None:
    """The loops are still alive: a new publish is acked and delivered."""
    await send(pub, topic, range(N, N + 1))
    assert await pubacks(pub, 1) == in_order(range(N, N + 1))
    assert payloads(await expect(sub, 1)) == sent(range(N, N + 1))


async def test_failing_append_holds_acks_then_delivers_everything_in_order(
        gw: Running, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="tidewire.node")
    sub = await gw.subscriber("sub", [("e/append", 1)])
    pub = await gw.publisher("pub")
    gw.store.fail("append")
    await send(pub, "e/append", range(N))
    await no_packet(pub, 1.0)  # no PUBACK before the messages are stored
    assert sub.messages.empty()
    assert gw.store.failures["append"] >= 4, "not retried"
    assert gw.store.failures["append"] <= 30, "retried without backing off"
    assert gw.node.store_down
    held = gw.node.connections["pub"].io.transport  # type: ignore[attr-defined]  # the asyncio side's socket
    assert held is not None and not held.is_reading(), (
        "the publisher was not paused while the append queue was full")
    gw.store.heal()
    assert await pubacks(pub, N) == in_order(range(N))
    assert payloads(await expect(sub, N)) == sent(range(N))
    assert not gw.node.store_down and held.is_reading()
    assert len(log_events(caplog, "store.failing")) == 1, "a failure streak is logged once, not per retry"
    assert len(log_events(caplog, "store.recovered")) == 1
    await round_trip(pub, sub, "e/append")


async def test_failing_sync_holds_acks_until_durable(gw: Running) -> None:
    sub = await gw.subscriber("sub", [("e/sync", 1)])
    pub = await gw.publisher("pub")
    gw.store.fail("sync")
    await send(pub, "e/sync", range(N))
    await no_packet(pub, 1.0)  # no PUBACK before the messages are durable
    assert gw.store.failures["sync"] >= 4
    gw.store.heal()
    assert await pubacks(pub, N) == in_order(range(N))
    assert payloads(await expect(sub, N)) == sent(range(N))
    await round_trip(pub, sub, "e/sync")


async def test_failing_reads_delay_delivery_but_skip_nothing(gw: Running) -> None:
    sub = await gw.subscriber("sub", [("e/read/a", 1), ("e/read/+", 1)])
    pub = await gw.publisher("pub")
    # Appended as by another node, unseen by the cache: it cannot take this node's batches as appended any more
    # (`QueueCache.add_appended`), so every delivery needs a store read until one succeeds.
    queues = gw.node.subscriptions.wildcards.queues_for("e/read/a")
    await gw.store.append([Message("e/read/a", b"other", qos=1, queues=queues)])
    gw.store.fail("read")
    await send(pub, "e/read/a", range(N))
    assert await pubacks(pub, N) == in_order(range(N))  # the log is fine: publishers are acked
    await until(lambda: gw.store.failures["read"] >= 3, what="3 failed reads")
    assert sub.messages.empty()
    gw.store.heal()
    assert payloads(await expect(sub, N + 1)) == [b"other", *sent(range(N))]
    await round_trip(pub, sub, "e/read/a")


async def test_qos0_is_dropped_and_counted_only_while_down_and_full_qos1_never(gw: Running) -> None:
    sub = await gw.subscriber("sub", [("e/q0", 0), ("e/q1", 1)])
    pub0 = await gw.publisher("pub0")
    pub1 = await gw.publisher("pub1")
    gw.store.fail("append")
    first = range(5)
    await send(pub1, "e/q1", first)
    await until(lambda: gw.node.store_down, what="the store seen failing")
    await send(pub0, "e/q0", range(N), qos=0)
    await until(lambda: gw.node.counters.dropped > 0, what="a QoS 0 drop")
    await send(pub1, "e/q1", range(len(first), N))
    await no_packet(pub1, 0.3)
    gw.store.heal()
    assert await pubacks(pub1, N) == in_order(range(N))
    dropped = gw.node.counters.dropped
    assert dropped <= N - (MAX_PENDING - len(first)), "dropped although there was room"
    got = await expect(sub, 2 * N - dropped)
    assert [m.payload for m in got if m.topic == "e/q1"] == sent(range(N)), "a QoS 1 message lost or reordered"
    q0 = [int(m.payload[1:]) for m in got if m.topic == "e/q0"]
    assert q0 == sorted(q0) and len(q0) + dropped == N
    await round_trip(pub1, sub, "e/q1")


async def test_failing_offset_writes_are_retried(gw: Running) -> None:
    sub = await gw.subscriber("keeper", [("e/offsets", 1)], clean=False, session_expiry=3600)
    pub = await gw.publisher("pub")
    gw.store.fail("set_offsets")
    await send(pub, "e/offsets", range(10))
    assert await pubacks(pub, 10) == in_order(range(10))
    assert len(await expect(sub, 10)) == 10  # and acked: nothing more happens in the session from here on
    await until(lambda: gw.store.failures["set_offsets"] >= 1, what="an offset write")
    failed = gw.store.failures["set_offsets"]
    # The positions that failed to be written are still due: the writes go on being retried.
    await until(lambda: gw.store.failures["set_offsets"] >= failed + 2, what="offset writes retried")
    before = await gw.store.inner.get_session("keeper")
    assert before is not None and before.offset < gw.store.last_seq()
    gw.store.heal()

    async def stored_offset() -> int:
        record = await gw.store.inner.get_session("keeper")
        assert record is not None
        return record.offset

    async def written() -> bool:
        return await stored_offset() >= gw.store.last_seq()

    await until(written, what="the offsets acked during the failure written")
