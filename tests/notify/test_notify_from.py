"""LocalNotifier.notify_from: the only node in the process gets its own names back at once (it dispatches them in
the tick of its append); with other nodes, every name goes as by `notify`."""

from __future__ import annotations

import asyncio

from tidewire.lookup.base import InProcessLookup
from tidewire.notify.base import LocalNotifier


async def test_the_only_node_gets_its_names_back_and_no_event() -> None:
    notifier = LocalNotifier(InProcessLookup())
    events: list[set[str]] = []
    notifier.register("n1", events.append)
    assert notifier.notify_from("n1", {"a", "b"}) == {"a", "b"}
    await asyncio.sleep(0)  # two turns of the loop: where a notify's event would have been dispatched
    await asyncio.sleep(0)
    assert events == []


async def test_with_other_nodes_names_are_notified_as_usual() -> None:
    lookup = InProcessLookup()
    notifier = LocalNotifier(lookup)
    got: dict[str, list[set[str]]] = {"n1": [], "n2": []}
    notifier.register("n1", got["n1"].append)
    notifier.register("n2", got["n2"].append)
    lookup.add_queue_subscriber("a", "n1")
    lookup.add_queue_subscriber("b", "n2")
    assert notifier.notify_from("n1", {"a", "b"}) == set()
    await asyncio.sleep(0)  # the tick ends: notifies are dispatched, merged, in the next turn of the loop
    assert got == {"n1": [{"a"}], "n2": [{"b"}]}
