"""Token buckets with an explicit clock: admission (take) and metering (charge)."""

from __future__ import annotations

import pytest

from tidewire.gateway.transport.ratelimit import InboundLimiter, TokenBucket


def test_take_admits_burst_then_rate() -> None:
    bucket = TokenBucket(rate=2, burst=3, now=0.0)
    assert [bucket.take(0.0) for _ in range(4)] == [True, True, True, False]
    assert not bucket.take(0.4)  # 0.8 tokens
    assert bucket.take(0.5)  # 1.0 token
    assert not bucket.take(0.5)
    assert [bucket.take(100.0) for _ in range(4)] == [True, True, True, False]  # never above burst


def test_charge_goes_into_debt_and_says_how_long() -> None:
    bucket = TokenBucket(rate=10, burst=10, now=0.0)
    assert bucket.charge(0.0, 10) == 0.0
    assert bucket.charge(0.0, 5) == pytest.approx(0.5)
    assert bucket.charge(0.5, 0) == 0.0  # paid off exactly
    assert bucket.charge(0.5, 20) == pytest.approx(2.0)


def test_clock_going_backwards_adds_nothing() -> None:
    bucket = TokenBucket(rate=1, burst=1, now=10.0)
    assert bucket.take(10.0)
    assert not bucket.take(5.0)


def test_invalid_rates_refused() -> None:
    with pytest.raises(ValueError):
        TokenBucket(0, 1, 0.0)
    with pytest.raises(ValueError):
        TokenBucket(1, 0, 0.0)


def test_inbound_limiter_admits_one_publish_at_a_time() -> None:
    limiter = InboundLimiter(messages_per_s=10, bytes_per_s=1000, now=0.0)
    assert all(limiter.admit(0.0, 50) == 0.0 for _ in range(10))  # a second's worth at once
    assert limiter.admit(0.0, 50) == pytest.approx(0.1)  # then one message per 0.1 s
    assert limiter.admit(0.1, 50) == 0.0
    bytes_only = InboundLimiter(0, 100, 0.0)
    assert bytes_only.messages is None
    assert bytes_only.admit(0.0, 60) == 0.0
    assert bytes_only.admit(0.0, 60) == pytest.approx(0.2)  # 40 left, 60 needed: 20 bytes at 100/s
    # larger than the burst: waits for a full bucket, then goes into debt rather than never going
    assert bytes_only.admit(0.2, 500) == pytest.approx(0.4)  # 60 there, a full 100 needed
    assert bytes_only.admit(1.0, 500) == 0.0
    assert bytes_only.admit(1.0, 1) == pytest.approx(4.01)
