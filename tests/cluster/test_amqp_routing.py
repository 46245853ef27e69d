"""AMQP routing decided at publish (headers exchanges, exchange-to-exchange bindings) across a 3-node cluster,
with aio-pika: bindings made through one node route what another node takes in, within the second a node keeps
its routing graph, and each message reaches the queue once."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aio_pika
import pytest

from tests.cluster.conftest import ClusterFactory
from tests.waiting import until

pytestmark = pytest.mark.timeout(120)


async def _connect(port: int) -> Any:
    return await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{port}/", timeout=10)


async def test_bindings_made_on_one_node_route_publishes_on_another(cluster: ClusterFactory) -> None:
    c = cluster(3)
    n1, n2, n3 = c.nodes
    admin, publisher, reader = await _connect(n1.amqp_port), await _connect(n2.amqp_port), await _connect(n3.amqp_port)
    try:
        setup = await admin.channel()
        hx = await setup.declare_exchange("hx", aio_pika.ExchangeType.HEADERS, durable=True)
        chain = await setup.declare_exchange("chain", aio_pika.ExchangeType.TOPIC, durable=True)
        queue = await setup.declare_queue("hq", durable=True)
        out = await publisher.channel(publisher_confirms=True)
        hx2 = await out.get_exchange("hx")
        chain2 = await out.get_exchange("chain")
        # node 2 routes before the bindings exist (and keeps that graph for up to a second)
        await hx2.publish(aio_pika.Message(b"before", headers={"n": 5}), routing_key="", mandatory=False)
        await queue.bind(hx, arguments={"x-match": "all", "n": 5})
        await hx.bind(chain, routing_key="sensors.#")  # chain → hx: what chain routes reaches hx's bindings
        got: list[bytes] = []
        origins: set[tuple[str, str]] = set()  # (exchange, routing key) of what came through `chain`
        inbox = await (await reader.channel()).get_queue("hq")

        async def drain() -> None:
            while (message := await inbox.get(no_ack=True, fail=False)) is not None:
                got.append(message.body)
                if message.body.startswith(b"c"):
                    origins.add((message.exchange, message.routing_key))

        probes = 0

        async def routed() -> bool:
            nonlocal probes
            probes += 1
            await hx2.publish(aio_pika.Message(b"probe", headers={"n": 5}), routing_key="", mandatory=False)
            await asyncio.sleep(0.1)
            await drain()
            return b"probe" in got

        started = time.monotonic()
        await until(routed, 5, lambda: f"a probe published on node 2 in hq\n{c.logs()}")
        seen_after = time.monotonic() - started
        assert seen_after < 2.5, seen_after  # within the routing graph's second (and the load's slack)
        for i in range(50):
            await hx2.publish(aio_pika.Message(b"h%d" % i, headers={"n": 5 if i % 2 else "5"}), routing_key="")
            await chain2.publish(aio_pika.Message(b"c%d" % i, headers={"n": 5 if i % 2 else 0}),
                                 routing_key="sensors.t" if i % 3 else "other.t")
        want = sorted([b"h%d" % i for i in range(50) if i % 2]
                      + [b"c%d" % i for i in range(50) if i % 2 and i % 3])

        async def drain_and_count() -> bool:
            await drain()
            return len([b for b in got if b != b"probe"]) >= len(want)

        await until(drain_and_count, 10, lambda: f"{len(want)} routed (got {len(got)})\n{c.logs()}")

        await asyncio.sleep(0.3)  # absence: a message routed twice, or wrongly, would show up now
        await drain()
        assert sorted(b for b in got if b != b"probe") == want  # none lost, none twice, none that should not
        assert got.count(b"probe") <= probes and b"before" not in got
        assert origins == {("chain", "sensors.t")}  # as published, though hq is bound to hx only
    finally:
        for conn in (admin, publisher, reader):
            await conn.close()
