"""amqtt (asyncio, MQTT 3.1.1) against the running gateway: pub/sub at QoS 0/1/2 and retained messages."""

from __future__ import annotations

import asyncio

import pytest
from amqtt.client import MQTTClient

from tests.integration.conftest import Gateway

CONFIG = {"auto_reconnect": False, "keep_alive": 10}


async def client(gateway: Gateway, client_id: str) -> MQTTClient:
    c = MQTTClient(client_id=client_id, config=dict(CONFIG))
    await c.connect(f"mqtt://127.0.0.1:{gateway.port}/", cleansession=True)
    return c


@pytest.mark.parametrize("qos", [0, 1, 2])
async def test_amqtt_pub_sub(gateway: Gateway, qos: int) -> None:
    sub = await client(gateway, f"am-sub{qos}")
    pub = await client(gateway, f"am-pub{qos}")
    try:
        assert await sub.subscribe([("am/t/#", qos)]) == [qos]
        for i in range(3):
            await pub.publish(f"am/t/{i}", f"m{i}".encode(), qos=qos)
        got = []
        for _ in range(3):
            m = await sub.deliver_message(timeout_duration=3)
            assert m is not None
            got.append((m.topic, bytes(m.data), m.qos))
        assert sorted(got) == [(f"am/t/{i}", f"m{i}".encode(), qos) for i in range(3)]
        with pytest.raises(asyncio.TimeoutError):
            await sub.deliver_message(timeout_duration=0.3)
    finally:
        await pub.disconnect()
        await sub.disconnect()


async def test_amqtt_retained(gateway: Gateway) -> None:
    pub = await client(gateway, "am-rpub")
    try:
        await pub.publish("am/ret", b"kept", qos=1, retain=True)
        await pub.publish("am/ret2", b"kept2", qos=2, retain=True)
    finally:
        await pub.disconnect()
    sub = await client(gateway, "am-rsub")
    try:
        assert await sub.subscribe([("am/+", 2)]) == [2]
        got = []
        for _ in range(2):
            m = await sub.deliver_message(timeout_duration=3)
            assert m is not None and m.publish_packet is not None
            got.append((m.topic, bytes(m.data), m.publish_packet.retain_flag))
        assert sorted(got) == [("am/ret", b"kept", True), ("am/ret2", b"kept2", True)]
    finally:
        await sub.disconnect()
