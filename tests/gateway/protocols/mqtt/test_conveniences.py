"""Auto-subscribe entries for one client (`gateway.protocols.mqtt.conveniences.auto_requests`)."""

from __future__ import annotations

from tidewire.gateway.config import AutoSubscription
from tidewire.gateway.protocols.mqtt.conveniences import auto_requests


def test_client_names_substituted_and_never_widening() -> None:
    entries = [AutoSubscription(topic="cmd/%c", qos=1, nl=True), AutoSubscription(topic="u/${username}/#"),
               AutoSubscription(topic="all/news", rh=2)]
    got = auto_requests(entries, "dev1", "alice")
    assert [(r.topic_filter, r.qos, r.no_local, r.retain_handling) for r in got] == [
        ("cmd/dev1", 1, True, 0), ("u/alice/#", 0, False, 0), ("all/news", 0, False, 2)]
    assert [r.topic_filter for r in auto_requests(entries, "dev1", None)] == ["cmd/dev1", "all/news"]
    assert [r.topic_filter for r in auto_requests(entries, "#", "a+")] == ["all/news"]
