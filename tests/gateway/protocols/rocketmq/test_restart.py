"""A RocketMQ consumer group's progress is in the store: it survives `kill -9` of the gateway."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest
from grpc.aio import AioRpcError

from tests.integration.conftest import Gateway, PahoFactory

from .conftest import Clients, restart


@pytest.mark.slow  # seconds long: `make test-slow` keeps `make test` under its 10 minutes
def test_group_progress_survives_kill9(rmq_gateway: Callable[..., Gateway], clients: Clients,
                                       paho_factory: PahoFactory) -> None:
    gw = rmq_gateway()
    consumer = clients.consumer(gw, "g", "a")
    pub = paho_factory(gw.port, "device-1")
    pub.connect()
    for i in range(4):
        pub.publish(f"a/{i}", b"m%d" % i, qos=1)
    got = consumer.receive(4, 30)
    assert [m.body for m in got] == [b"m0", b"m1", b"m2", b"m3"]
    consumer.ack(got[0])
    consumer.ack(got[2])
    clients.shutdown(consumer)
    pub.drop()

    restart(gw, kill=True)
    consumer = clients.consumer(gw, "g", "a", wait_declared=False)
    consumer.ack(got[3])  # a receipt handle from before the restart still settles its message
    again = consumer.receive(4, 30)  # what this node had claimed is visible again at once
    assert [(m.body, m.message_id, m.delivery_attempt) for m in again] == [(b"m1", got[1].message_id, 2)]
    consumer.ack(again[0])
    pub = paho_factory(gw.port, "device-1")
    pub.connect()
    pub.publish("a/4", b"m4", qos=1)
    after = consumer.receive(4, 30)
    assert [(m.body, m.delivery_attempt) for m in after] == [(b"m4", 1)]
    consumer.ack(after[0])
    assert consumer.receive(4, 30) == []


def test_sigterm_ends_long_polls_and_streams(rmq_gateway: Callable[..., Gateway], clients: Clients) -> None:
    gw = rmq_gateway()
    consumer = clients.consumer(gw, "g", "a", await_s=20)  # its telemetry stream is open
    with ThreadPoolExecutor(1) as pool:
        polling = pool.submit(consumer.receive, 1, 30)
        time.sleep(0.5)  # no event to wait on: the node does not report a poll under way; it waits 30 s, so this one is
        started = time.monotonic()
        gw.stop()  # fails the test if SIGTERM is ignored for 10 s
        assert time.monotonic() - started < 5
        with pytest.raises(AioRpcError):
            polling.result(timeout=5)
    assert "level=error" not in gw.stderr
