"""The bridge's settings model: Mosquitto's defaults, the topic rules (mosquitto.conf(5)'s remapping table row by
row), what is refused and how the errors read."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from tidewire.bridges.mqtt.settings import Address, BridgeSettings, TopicRule, check_unique, parse_address
from tidewire.errors import ConfigError


def bridge(**fields: Any) -> BridgeSettings:
    return BridgeSettings(**{"name": "b1", "addresses": ["remote.example:1883"], "topics": [{"pattern": "x/#"}],
                             **fields})


def refused(**fields: Any) -> str:
    with pytest.raises(ValidationError) as info:
        bridge(**fields)
    return str(info.value)


# -- defaults and derived values -------------------------------------------------------------------------------

def test_defaults_are_mosquittos() -> None:
    b = bridge()
    assert b.bridge_protocol_version == "mqttv311" and b.protocol_level == 4
    assert (b.cleansession, b.local_clean, b.keepalive_interval, b.restart_timeout) == (False, False, 60, (5.0, 30.0))
    assert (b.round_robin, b.start_type, b.notifications, b.notifications_local_only) == (False, "automatic", True,
                                                                                          False)
    assert (b.try_private, b.bridge_attempt_unsubscribe, b.bridge_outgoing_retain) == (True, True, True)
    assert (b.bridge_max_packet_size, b.bridge_insecure, b.tls, b.max_inflight) == (0, False, False, 100)
    assert b.addresses == [Address(host="remote.example", port=1883)]
    assert b.topics == [TopicRule(pattern="x/#", direction="out", qos=0)]


def test_client_ids_and_state_topic_follow_mosquitto_2_0_11() -> None:
    # Mosquitto 2.0.11 writes `<hostname>.<name>` (config__check), whatever its man page says.
    b = bridge(name="edge")
    r = b.resolved("host7")
    assert (r.client_id, r.local_client_id) == ("host7.edge", "local.host7.edge")
    assert r.state_topic == "$SYS/broker/connection/host7.edge/state"
    assert b.client_id == f"{socket.gethostname()}.edge"  # unresolved: this machine's hostname
    assert b.remote_clientid is None  # resolving makes a copy


def test_explicit_client_ids_and_topic_are_kept() -> None:
    b = bridge(remote_clientid="r", local_clientid="l", notification_topic="state/of/b1").resolved("h")
    assert (b.client_id, b.local_client_id, b.state_topic) == ("r", "l", "state/of/b1")
    assert bridge(remote_clientid="r").resolved("h").local_client_id == "local.r"


def test_derived_protocol_tls_and_local_clean() -> None:
    assert bridge(bridge_protocol_version="mqttv31").protocol_level == 3
    assert bridge(bridge_protocol_version="mqttv50").protocol_level == 5
    assert bridge(bridge_capath=Path("/etc/ssl/certs")).tls
    assert bridge(bridge_cafile="ca.pem", bridge_certfile="c.pem", bridge_keyfile="k.pem").tls
    assert bridge(cleansession=True).local_clean
    assert not bridge(cleansession=True, local_cleansession=False).local_clean


@pytest.mark.parametrize(("given", "expected"), [(20, (20.0, 20.0)), ([7], (7.0, 7.0)), ((10, 60), (10.0, 60.0))])
def test_restart_timeout_one_number_is_a_constant(given: Any, expected: tuple[float, float]) -> None:
    assert bridge(restart_timeout=given).restart_timeout == expected


@pytest.mark.parametrize(("text", "host", "port"), [("h", "h", 1883), ("h.example:1884", "h.example", 1884),
                                                    ("10.0.0.1:8883", "10.0.0.1", 8883), ("::1:1883", "::1", 1883),
                                                    ("[::1]:1885", "::1", 1885), ("[fe80::1]:1", "fe80::1", 1)])
def test_address_in_mosquitto_syntax(text: str, host: str, port: int) -> None:
    assert parse_address(text) == (host, port)
    assert Address.model_validate(text) == Address(host=host, port=port)


def test_address_text_and_bad_addresses() -> None:
    assert str(Address(host="::1", port=1883)) == "[::1]:1883" and str(Address(host="h")) == "h:1883"
    with pytest.raises(ValidationError, match="IPv6 address needs its port"):
        Address.model_validate("::1")  # Mosquitto would read host ':' port 1
    for bad in ("h:0", "h:65536", "h:x", "bad host"):
        with pytest.raises(ValidationError):
            Address.model_validate(bad)


# -- topic rules: mosquitto.conf(5)'s table, row by row -------------------------------------------------------

VALID_ROWS = [  # pattern, local prefix, remote prefix, full local topic, full remote topic
    ("pattern", "L/", "R/", "L/pattern", "R/pattern"),
    ("pattern", "L/", "", "L/pattern", "pattern"),
    ("pattern", "", "R/", "pattern", "R/pattern"),
    ("pattern", "", "", "pattern", "pattern"),
    ("", "local", "remote", "local", "remote"),
]
INVALID_ROWS = [("", "local", ""), ("", "", "remote"), ("", "", "")]


@pytest.mark.parametrize(("pattern", "local", "remote", "full_local", "full_remote"), VALID_ROWS)
def test_valid_rows_of_the_table(pattern: str, local: str, remote: str, full_local: str, full_remote: str) -> None:
    rule = TopicRule(pattern=pattern, direction="both", local_prefix=local, remote_prefix=remote)
    assert (rule.local_filter, rule.remote_filter) == (full_local, full_remote)
    assert rule.to_remote(full_local) == full_remote
    assert rule.to_local(full_remote) == full_local
    assert rule.to_remote("other") is None and rule.to_local("other") is None


@pytest.mark.parametrize(("pattern", "local", "remote"), INVALID_ROWS)
def test_invalid_rows_of_the_table(pattern: str, local: str, remote: str) -> None:
    with pytest.raises(ValidationError, match="needs both a local and a remote prefix"):
        TopicRule(pattern=pattern, direction="both", local_prefix=local, remote_prefix=remote)


def test_the_man_pages_example_rule() -> None:
    # topic clients/total in 0 test/mosquitto/org/ $SYS/broker/
    rule = TopicRule(pattern="clients/total", direction="in", local_prefix="test/mosquitto/org/",
                     remote_prefix="$SYS/broker/")
    assert rule.remote_filter == "$SYS/broker/clients/total"
    assert rule.to_local("$SYS/broker/clients/total") == "test/mosquitto/org/clients/total"
    assert rule.to_remote("test/mosquitto/org/clients/total") is None  # an in rule sends nothing out
    assert (rule.incoming, rule.outgoing) == (True, False)
    assert rule.line == "topic clients/total in 0 test/mosquitto/org/ $SYS/broker/"


def test_a_whole_tree_remapped() -> None:
    rule = TopicRule(pattern="#", direction="both", qos=2, local_prefix="local/topic/", remote_prefix="remote/topic/")
    assert rule.to_remote("local/topic/a/b") == "remote/topic/a/b"
    assert rule.to_local("remote/topic/a") == "local/topic/a"
    assert rule.to_remote("remote/topic/a") is None and rule.to_local("local/topic/a") is None
    # `local/topic/#` also matches `local/topic`, which does not start with the prefix: Mosquitto then keeps it
    # whole after the remote prefix (checked against a real Mosquitto in test_mosquitto_conf).
    assert rule.to_remote("local/topic") == "remote/topic/local/topic"


def test_wildcards_and_dollar_topics() -> None:
    rule = TopicRule(pattern="+/temp", direction="out", local_prefix="site/")
    assert rule.to_remote("site/room1/temp") == "room1/temp"
    assert rule.to_remote("site/room1/hum") is None
    assert rule.to_local("room1/temp") is None  # out only
    everything = TopicRule(pattern="#", direction="both")
    assert everything.to_remote("$SYS/broker/uptime") is None  # a leading wildcard skips $ topics (MQTT)
    assert TopicRule(pattern="#", local_prefix="L/").to_remote("L/") is None  # would be an empty topic


@pytest.mark.parametrize(("fields", "message"), [
    ({"pattern": "a/#", "local_prefix": "x/+/"}, "is not a topic name"),
    ({"pattern": "a/#", "remote_prefix": "#"}, "is not a topic name"),
    ({"pattern": "a#"}, "not a valid topic filter"),
    ({"pattern": "#", "local_prefix": "L"}, "not a valid topic filter"),  # "L#"
    ({"pattern": "a", "qos": 3}, "less than or equal to 2"),
    ({"pattern": "a", "direction": "sideways"}, "'out', 'in' or 'both'"),
])
def test_bad_rules(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        TopicRule(**fields)


def test_routing_over_every_rule_is_mosquittos() -> None:
    b = bridge(topics=[{"pattern": "#", "direction": "both"}, {"pattern": "a/#", "direction": "both",
                                                               "local_prefix": "L/", "remote_prefix": "R/"},
                       {"pattern": "in/#", "direction": "in", "local_prefix": "from/"}])
    assert b.remote_topic("L/a/1") == "R/a/1"  # the first rule with a prefix that matches wins
    assert b.remote_topic("plain") == "plain"  # taken by a rule without prefixes only: unchanged
    assert b.remote_topic("$SYS/x") is None
    assert b.local_topic("R/a/1") == "L/a/1" and b.local_topic("in/x") == "from/in/x"
    only_in = bridge(topics=[{"pattern": "in/#", "direction": "in"}])
    assert only_in.remote_topic("in/x") is None and only_in.local_topic("in/x") == "in/x"


# -- validation and refusals --------------------------------------------------------------------------------

@pytest.mark.parametrize(("fields", "message"), [
    ({"name": "my bridge"}, "may hold only letters"),
    ({"addresses": []}, "addresses: List should have at least 1 item"),
    ({"topics": []}, "topics: List should have at least 1 item"),
    ({"keepalive_interval": 4}, "keepalive_interval: Input should be greater than or equal to 5"),
    ({"restart_timeout": (30, 10)}, "restart_timeout: the cap 10 is lower than the base 30"),
    ({"restart_timeout": 0}, "must be above 0"),
    ({"remote_password": "p"}, "remote_password needs remote_username"),
    ({"local_password": "p"}, "local_password needs local_username"),
    ({"bridge_cafile": "ca", "bridge_certfile": "c"}, "bridge_certfile and bridge_keyfile go together"),
    ({"bridge_certfile": "c", "bridge_keyfile": "k"}, "without bridge_cafile or bridge_capath"),
    ({"bridge_tls_version": "tlsv1.1"}, "tlsv1.2 or tlsv1.3"),
    ({"bridge_session_expiry_interval": 60}, "needs bridge_protocol_version mqttv50"),
    ({"notification_topic": "state/+"}, "notification_topic: 'state/+' is not a topic name"),
    ({"remote_clientid": ""}, "remote_clientid: empty"),
    ({"max_inflight": 0}, "max_inflight: Input should be greater than or equal to 1"),
    ({"bridge_alpm": "mqtt"}, "bridge_alpm: Extra inputs are not permitted"),
    ({"topics": [{"pattern": "", "local_prefix": "L"}]}, "topics[0]: `topic \"\" out 0 L \"\"`: an empty pattern"),
])
def test_errors_name_the_bridge_and_the_option(fields: dict[str, Any], message: str) -> None:
    text = refused(**{"name": "edge-1", **fields}) if "name" not in fields else refused(**fields)
    assert message in text
    if "name" not in fields:
        assert "bridge 'edge-1'" in text


@pytest.mark.parametrize(("fields", "message"), [
    ({"start_type": "lazy"}, "start_type lazy is not supported"),
    ({"threshold": 10}, "threshold: threshold only configures start_type lazy"),
    ({"idle_timeout": 60}, "idle_timeout: idle_timeout only configures start_type lazy"),
    ({"bridge_identity": "id"}, "bridge_identity: TLS-PSK"),
    ({"bridge_psk": "0123abcd"}, "bridge_psk: TLS-PSK"),
    ({"bridge_require_ocsp": True}, "bridge_require_ocsp true is not supported"),
])
def test_what_mosquitto_supports_and_tidewire_refuses(fields: dict[str, Any], message: str) -> None:
    text = refused(**fields)
    assert message in text and "bridge 'b1'" in text


def test_ocsp_not_required_is_no_refusal() -> None:
    assert bridge(bridge_require_ocsp=False).name == "b1"


def test_structured_errors_keep_pydantics_locations() -> None:
    with pytest.raises(ValidationError) as info:
        BridgeSettings.model_validate({"name": "b", "addresses": ["h"], "topics": [{"qos": 5, "pattern": "a"}],
                                       "keepalive_interval": 1}, context={"structured": True})
    assert {e["loc"] for e in info.value.errors()} == {("topics", 0, "qos"), ("keepalive_interval",)}


def test_check_unique() -> None:
    check_unique([bridge(name="a"), bridge(name="b")], "h")
    with pytest.raises(ConfigError, match="two bridges are named 'a'"):
        check_unique([bridge(name="a"), bridge(name="a")], "h")
    with pytest.raises(ConfigError, match=r"same local client id 'local\.h\.a'"):
        check_unique([bridge(name="a"), bridge(name="b", remote_clientid="h.a")], "h")


def test_sent_as_is_the_inverse_of_the_out_mapping() -> None:
    b = bridge(topics=[TopicRule(pattern="alerts/#", direction="out", qos=1, local_prefix="site/",
                                 remote_prefix="plant1/"),
                       TopicRule(pattern="", direction="out", local_prefix="local/one", remote_prefix="remote/one"),
                       TopicRule(pattern="cmd/#", direction="in", local_prefix="dev/", remote_prefix="plant1/")])
    assert b.sent_as("plant1/alerts/x/y") == "site/alerts/x/y"
    assert b.remote_topic("site/alerts/x/y") == "plant1/alerts/x/y"
    assert b.sent_as("remote/one") == "local/one"
    assert b.sent_as("plant1/cmd/x") is None  # an in topic: nothing goes out as it
    assert b.sent_as("elsewhere/alerts/x") is None
