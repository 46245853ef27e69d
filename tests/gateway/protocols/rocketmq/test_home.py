"""The RocketMQ listener writes nothing outside the data directory: the gateway does not import the client
library (whose import creates `~/logs/rocketmq_python/` and reconfigures logging), so a node serving RocketMQ
clients leaves its $HOME as it found it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integration.conftest import Gateway

from .conftest import Clients, message


@pytest.mark.slow  # starts its own gateway
def test_home_stays_empty(rmq_gateway: Callable[..., Gateway], clients: Clients, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    gw = rmq_gateway(env={"HOME": str(home)})
    consumer = clients.consumer(gw, "g", "T")
    producer = clients.producer(gw, ["T"])
    producer.send(message("T", b"x"))
    got = consumer.receive(1, 10)
    assert [m.body for m in got] == [b"x"]
    consumer.ack(got[0])
    gw.stop()
    assert sorted(p.relative_to(home).as_posix() for p in home.rglob("*")) == []
