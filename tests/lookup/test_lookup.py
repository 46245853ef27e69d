"""InProcessLookup: client locations and reference-counted queue subscribers."""

from __future__ import annotations

from tidewire.lookup.base import InProcessLookup


def test_queue_subscribers_are_counted_per_node() -> None:
    lookup = InProcessLookup()
    lookup.add_queue_subscriber("q", "n1")
    lookup.add_queue_subscriber("q", "n1")
    lookup.add_queue_subscriber("q", "n2")
    assert lookup.nodes_for_queue("q") == {"n1", "n2"}
    lookup.remove_queue_subscriber("q", "n1")
    assert lookup.nodes_for_queue("q") == {"n1", "n2"}
    lookup.remove_queue_subscriber("q", "n1")
    lookup.remove_queue_subscriber("q", "n2")
    assert lookup.nodes_for_queue("q") == frozenset()
    lookup.remove_queue_subscriber("q", "n9")  # unknown: harmless


async def test_client_location_follows_takeover() -> None:
    lookup = InProcessLookup()
    lookup.set_client_location("c", "n1")
    lookup.set_client_location("c", "n2")  # taken over on another node
    lookup.remove_client_location("c", "n1")  # the old node's late cleanup must not erase it
    assert await lookup.client_location("c") == "n2"
    lookup.remove_client_location("c", "n2")
    assert await lookup.client_location("c") is None
