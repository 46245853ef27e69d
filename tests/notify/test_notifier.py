"""LocalNotifier: names only, merged per tick, targeted by the lookup, broadcast when it can't tell."""

from __future__ import annotations

import asyncio

from tidewire.lookup.base import InProcessLookup
from tidewire.notify.base import LocalNotifier


async def test_events_for_one_queue_are_merged_and_targeted() -> None:
    lookup = InProcessLookup()
    notifier = LocalNotifier(lookup)
    got: dict[str, list[set[str]]] = {"n1": [], "n2": []}
    notifier.register("n1", got["n1"].append)
    notifier.register("n2", got["n2"].append)
    lookup.add_queue_subscriber("a/b", "n1")
    lookup.add_queue_subscriber("c", "n2")
    for _ in range(100):
        notifier.notify(["a/b"])
    notifier.notify(["c", "nobody"])
    await asyncio.sleep(0)  # the tick ends: notifies are dispatched, merged, in the next turn of the loop
    assert got["n1"] == [{"a/b"}]  # 100 notifies, one event
    assert got["n2"] == [{"c"}]


class _UnsureLookup(InProcessLookup):
    def nodes_for_queue(self, queue: str) -> frozenset[str] | None:
        return None


async def test_unknown_queue_location_broadcasts() -> None:
    notifier = LocalNotifier(_UnsureLookup())
    seen: list[tuple[str, set[str]]] = []
    for node in ("n1", "n2"):
        notifier.register(node, lambda qs, node=node: seen.append((node, qs)))  # type: ignore[misc]
    notifier.notify(["q"])
    await asyncio.sleep(0)  # the next turn of the loop: dispatched
    assert sorted(seen) == [("n1", {"q"}), ("n2", {"q"})]
