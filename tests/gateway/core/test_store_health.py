"""`StoreHealth`: down from any loop's first failed store call until every loop that failed has succeeded again;
its reason names the loop, the error and for how long; one log line each way."""

from __future__ import annotations

import logging

import pytest

from tests.gateway.fakeclock import FakeClock
from tidewire.gateway.core.store_health import StoreHealth


def test_down_until_every_failing_loop_succeeds(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    health = StoreHealth(clock)
    assert not health.down and health.reason() is None and health.down_for() == 0.0
    health.report("housekeeping", None)  # a success while up changes nothing
    assert not health.down
    with caplog.at_level(logging.INFO, logger="tidewire.node"):
        health.report("cluster heartbeat", ConnectionError("reset"))
        health.report("flush", TimeoutError())
        clock.advance(1.5)
        assert health.down
        assert health.reason() == "store unreachable for 1.5 s (cluster heartbeat: ConnectionError: reset)"
        health.report("cluster heartbeat", None)
        assert health.down, "the flush loop has not reached the store yet"
        health.report("flush", None)
        assert not health.down and health.reason() is None
    events = [record.msg for record in caplog.records]
    assert events == ["store.unreachable", "store.reachable"]
