"""Smoke run of the lake events benchmark: a real gateway, a small flood, a buffer too small for it and one
large enough (nothing lost)."""

from __future__ import annotations

import pytest

from loadtest import lake_events_bench

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]  # two gateways, about 4 s


def test_a_small_buffer_loses_and_a_large_one_does_not() -> None:
    small = lake_events_bench.run(50, 2000, 2, 30.0, core=None)
    assert small.produced == 8000 and 0 < small.written < small.produced
    assert "lost" in small.line()
    large = lake_events_bench.run(100_000, 2000, 2, 30.0, core=None)
    assert large.written == large.produced == 8000
