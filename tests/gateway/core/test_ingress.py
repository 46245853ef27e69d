"""The neutral ingress model: properties survive the stored MQTT 5 block both ways, and `refuse_publish` says
why a topic is refused (limits, wildcards, `$SYS`, the ACL) the same way for every protocol."""

from __future__ import annotations

from tidewire.extensions.hooks import AllowAll, ClientInfo, SubscribeAccess
from tidewire.gateway.config import Settings
from tidewire.gateway.core.ingress import INVALID_TOPIC, NOT_AUTHORIZED, neutral_message, refuse_publish
from tidewire.store.properties import Properties


def test_properties_round_trip_through_the_stored_block() -> None:
    props = Properties(content_type="application/json", correlation_data=b"\x00id", response_topic="reply/x",
                       user=[("a", "1"), ("a", "2"), ("ü", "ß")], utf8_payload=True, expiry_interval=30)
    message = neutral_message("t/1", b"{}", properties=props, publisher="amqp:1", now_ms=1_000_000)
    assert message.expires_at_ms == 1_030_000
    back = Properties.from_block(message.properties, message.expires_at_ms, now_ms=1_010_000)
    assert back == Properties("application/json", b"\x00id", "reply/x", [("a", "1"), ("a", "2"), ("ü", "ß")],
                              True, 20)
    assert Properties.from_block(b"") == Properties()
    assert Properties().to_block() == b""


class _DenyAll(AllowAll):
    def allow_publish(self, client: ClientInfo, topic: str) -> bool:
        return False

    def subscribe_access(self, client: ClientInfo, topic_filter: str) -> SubscribeAccess:
        return SubscribeAccess.DENIED


def test_refuse_publish_names_the_reason() -> None:
    settings = Settings(max_topic_levels=3, max_topic_length=20)
    who = ClientInfo("c", "u")
    assert refuse_publish(settings, AllowAll(), who, "a/b/c") is None
    for bad in ("", "a/+", "a/#", "a/b/c/d", "x" * 21, "é" * 11):
        assert refuse_publish(settings, AllowAll(), who, bad) == INVALID_TOPIC, bad
    assert refuse_publish(settings, AllowAll(), who, "$SYS/x") == NOT_AUTHORIZED
    assert refuse_publish(settings, _DenyAll(), who, "a/b") == NOT_AUTHORIZED


def test_a_client_may_write_only_its_own_bridge_state_under_sys() -> None:
    settings = Settings()
    who = ClientInfo("bridge-1", "u")
    assert refuse_publish(settings, AllowAll(), who, "$SYS/broker/connection/bridge-1/state") is None
    for other in ("$SYS/broker/connection/bridge-2/state", "$SYS/broker/connection/bridge-1/state/x",
                  "$SYS/broker/connection/bridge-1", "$SYS/brokers/n1/stats/uptime"):
        assert refuse_publish(settings, AllowAll(), who, other) == NOT_AUTHORIZED, other
    assert refuse_publish(settings, _DenyAll(), who, "$SYS/broker/connection/bridge-1/state") == NOT_AUTHORIZED
