"""The node's wildcard index over a real embedded store: which queues a topic is indexed into, and the stored
sessions' filters let go of once no stored session holds them - never one a session may still need."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tidewire.gateway.core.topology import SingleNode
from tidewire.gateway.core.wildcards import WildcardIndex, is_wildcard_queue
from tidewire.gateway.core.writes import RecordWrites
from tidewire.store.base import SessionRecord, SubscriptionRecord
from tidewire.store.embedded.engine import EmbeddedStore


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[EmbeddedStore]:
    s = EmbeddedStore(tmp_path, fsync="never")
    await s.open()
    try:
        yield s
    finally:
        await s.close()


def stored_session(client_id: str, topic_filter: str) -> SessionRecord:
    return SessionRecord(client_id, disconnected_at_ms=1, expiry_interval=60,
                         subscriptions={topic_filter: SubscriptionRecord(topic_filter, 1)})


async def parked(index: WildcardIndex, writes: RecordWrites, store: EmbeddedStore, client_id: str,
                 topic_filter: str) -> None:
    """A session subscribes online, is stored with its subscription, and goes offline (as the opener does)."""
    index.hold(topic_filter, client_id)
    await writes.settled("wildcard:" + topic_filter)
    await store.put_session(stored_session(client_id, topic_filter))
    index.park(topic_filter, client_id)


def test_which_filters_get_an_index_of_their_own() -> None:
    assert is_wildcard_queue("a/+/c") and is_wildcard_queue("a/b/#")
    assert not is_wildcard_queue("a/#")  # the first-level queue, indexed anyway
    assert not is_wildcard_queue("a/b") and not is_wildcard_queue("p2p#c1")


async def test_a_topic_is_indexed_into_its_queues(store: EmbeddedStore) -> None:
    index = WildcardIndex(store, RecordWrites(store), SingleNode())
    await index.refresh_wildcards()
    index.hold("dev/+/cmd", "c1")
    await index.writes.settled("wildcard:dev/+/cmd")
    assert index.queues_for("dev/7/cmd") == ("dev/7/cmd", "dev/#", "dev/+/cmd")
    assert index.queues_for("t/p2p/c9") == ("p2p#c9",)
    assert index.matches("dev/1/cmd") and not index.matches("dev/1/x")
    assert index.wildcard_version >= 0


async def test_a_filter_no_stored_session_holds_any_more_is_let_go(store: EmbeddedStore) -> None:
    writes = RecordWrites(store)
    index = WildcardIndex(store, writes, SingleNode())
    await index.refresh_wildcards()
    await parked(index, writes, store, "gone", "dev/gone/+/cmd")
    await parked(index, writes, store, "kept", "dev/kept/+/cmd")
    await store.delete_session("gone")  # expired or evicted, by whichever node
    # The first check may not let go of what was held since the check before it (a count read then may
    # predate the session record); the second does.
    assert await index.prune_stored() == 0
    assert await index.prune_stored() == 1
    await writes.settled("wildcard:dev/gone/+/cmd")
    assert len(index) == 1 and not index.matches("dev/gone/x/cmd") and index.matches("dev/kept/x/cmd")
    assert (await store.wildcards())[1] == {"dev/kept/+/cmd"}
    assert await index.prune_stored() == 0  # the survivor's filter stays


async def test_a_filter_parked_while_its_count_is_read_is_kept(store: EmbeddedStore) -> None:
    """A session parked after the store's counts were read (its record not yet among them) keeps its filter."""
    writes = RecordWrites(store)
    index = WildcardIndex(store, writes, SingleNode())
    await index.refresh_wildcards()
    await parked(index, writes, store, "old", "dev/x/+/cmd")
    await store.delete_session("old")
    await index.prune_stored()
    index.hold("dev/x/+/cmd", "new")  # a new session subscribes to the same filter ...
    index.park("dev/x/+/cmd", "new")  # ... and leaves before its record with the subscription is written
    assert await index.prune_stored() == 0
    await store.put_session(stored_session("new", "dev/x/+/cmd"))
    assert await index.prune_stored() == 0
    assert await index.prune_stored() == 0
    assert index.matches("dev/x/1/cmd")


async def test_an_online_holder_keeps_a_filter_its_stored_sessions_left(store: EmbeddedStore) -> None:
    writes = RecordWrites(store)
    index = WildcardIndex(store, writes, SingleNode())
    await index.refresh_wildcards()
    await parked(index, writes, store, "off", "dev/+/cmd")
    index.hold("dev/+/cmd", "online")
    await store.delete_session("off")
    await index.prune_stored()
    assert await index.prune_stored() == 1
    assert index.matches("dev/1/cmd")  # the online session still needs it
    index.release("dev/+/cmd", "online")
    await writes.settled("wildcard:dev/+/cmd")
    assert not index.matches("dev/1/cmd")
