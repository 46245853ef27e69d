"""The retained caps' arithmetic: what is admitted counts until the store's usage says where it landed."""

from __future__ import annotations

from tidewire.gateway.core.retained_quota import RetainedQuota


def test_no_caps_admits_everything() -> None:
    q = RetainedQuota()
    assert not q.capped and all(q.admit(10**6) for _ in range(1000))


def test_count_cap_counts_what_is_in_flight_until_the_store_answers() -> None:
    q = RetainedQuota(max_messages=3)
    q.settled(1, 10)
    assert q.admit(5) and q.admit(5)
    assert not q.admit(5)  # 1 stored + 2 in flight
    q.landed(5)
    q.landed(5)
    q.settled(2, 20)  # one of the two replaced a topic: the store holds 2
    assert q.admit(5) and not q.admit(5)


def test_byte_and_payload_caps() -> None:
    q = RetainedQuota(max_bytes=100, max_payload=40)
    assert not q.admit(41)
    assert q.admit(40) and q.admit(40) and not q.admit(21)
    assert q.admit(20)
    q.landed(0)  # a delete admitted nothing
    assert not q.admit(1)
    for size in (40, 40, 20):
        q.landed(size)
    q.settled(0, 0)  # deleted meanwhile
    assert q.admit(40)


def test_landed_never_goes_below_zero() -> None:
    q = RetainedQuota(max_messages=1)
    q.landed(7)  # a will or a $SYS message: never admitted here
    assert q.admitted == 0 and q.admit(1) and not q.admit(1)
