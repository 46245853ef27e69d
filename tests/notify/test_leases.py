"""Leases on owners' answers, with a clock passed in: expiry, bounds, updates and what a holder must catch up."""

from __future__ import annotations

from tidewire.notify.leases import GrantedLeases, HeldLeases


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_held_answer_is_valid_until_its_lease_ends() -> None:
    clock = Clock()
    held = HeldLeases(clock)
    held.take(3, 5.0, [("q", frozenset({"b"}))])
    assert held.nodes("q", 3) == {"b"}
    assert held.nodes("other", 3) is None
    clock.now += 4.99
    assert held.nodes("q", 3) == {"b"}
    clock.now += 0.01
    assert held.nodes("q", 3) is None and len(held) == 0


def test_another_epoch_voids_every_held_answer() -> None:
    held = HeldLeases(Clock())
    held.take(3, 5.0, [("q", frozenset({"b"})), ("r", frozenset())])
    assert held.nodes("r", 3) == frozenset()  # "nobody reads it" is an answer too
    assert held.nodes("q", 4) is None and len(held) == 0
    held.take(3, 5.0, [("q", frozenset({"b"}))])  # a late grant of the old epoch
    assert held.nodes("q", 4) is None


def test_an_update_names_the_added_nodes_only_after_a_use() -> None:
    held = HeldLeases(Clock())
    held.take(1, 5.0, [("q", frozenset({"b"}))])
    assert held.update(1, "q", frozenset({"b", "c"})) == frozenset()  # never used: nobody to catch up
    assert held.nodes("q", 1) == {"b", "c"}
    assert held.update(1, "q", frozenset({"c", "d"})) == {"d"}
    assert held.update(1, "q", frozenset({"c"})) == frozenset()
    assert held.nodes("q", 1) == {"c"}
    assert held.update(2, "q", frozenset({"x"})) == frozenset()  # another epoch's update is ignored
    assert held.update(1, "unheld", frozenset({"x"})) == frozenset()


def test_held_answers_are_bounded_oldest_first() -> None:
    held = HeldLeases(Clock(), max_entries=3)
    held.take(1, 5.0, [(f"q{i}", frozenset()) for i in range(3)])
    held.take(1, 5.0, [("q0", frozenset({"b"}))])  # renewed: now the newest
    held.take(1, 5.0, [("q3", frozenset())])
    assert len(held) == 3
    assert held.nodes("q1", 1) is None and held.nodes("q0", 1) == {"b"} and held.nodes("q3", 1) == frozenset()


def test_granted_leases_expire_and_are_bounded() -> None:
    clock = Clock()
    granted = GrantedLeases(clock, 5.0, max_entries=3)
    assert granted.grant("q", "a") and granted.grant("q", "b") and granted.grant("r", "a")
    assert not granted.grant("s", "a") and not granted.grant("q", "c")  # full: answered without a lease
    assert granted.grant("q", "a")  # a renewal needs no room
    assert sorted(granted.holders("q")) == ["a", "b"] and granted.all_holders() == {"a", "b"}
    clock.now += 3
    granted.grant("q", "a")
    clock.now += 2.5
    assert granted.holders("q") == ["a"] and len(granted) == 2
    granted.sweep()
    assert len(granted) == 1 and granted.holders("r") == []
    assert granted.grant("s", "c")


def test_a_holder_that_went_away_is_forgotten() -> None:
    granted = GrantedLeases(Clock(), 5.0)
    for q in ("q", "r"):
        granted.grant(q, "a")
        granted.grant(q, "b")
    granted.drop_holder("a")
    assert granted.holders("q") == ["b"] and granted.holders("r") == ["b"] and len(granted) == 2
    granted.clear()
    assert len(granted) == 0 and granted.all_holders() == set()
