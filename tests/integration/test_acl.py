"""ACL file (Mosquitto syntax) end to end: denied SUBSCRIBE and PUBLISH, patterns with %c and %u.

A user name is an identity only once a password proved it, so alice logs in with her password (from a real
`mosquitto_passwd` file) while anonymous access stays on for the anonymous clients of these tests.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.conftest import Gateway, GatewayFactory, PahoFactory, write_password_file

# Mosquitto semantics: `topic` lines before any `user` line apply to anonymous clients, lines after
# `user X` to X only; `pattern` lines apply to everyone.
ACL = """\
# anonymous clients
topic read public/#
topic readwrite shared/#
topic deny shared/secret/#

pattern readwrite clients/%c/#
pattern read users/%u/#

user alice
topic readwrite alice/#
topic write inbox/#
"""

ALICE_PASSWORD = "alice-acl-secret"


def acl_gateway(gateway_factory: GatewayFactory, tmp_path: Path) -> Gateway:
    passwords = write_password_file(tmp_path / "passwd", {"alice": ALICE_PASSWORD})
    return gateway_factory(acl_text=ACL, password_file=passwords, allow_anonymous=True)


# Mosquitto's acl_file grants every SUBSCRIBE and filters at delivery instead; Tidewire refuses in SUBACK.
@pytest.mark.tidewire_only
@pytest.mark.parametrize("version", [4, 5])
def test_denied_subscribe_gets_failure_in_suback(gateway_factory: GatewayFactory, paho_factory: PahoFactory,
                                                 tmp_path: Path, version: int) -> None:
    gw = acl_gateway(gateway_factory, tmp_path)
    denied = 0x80 if version == 4 else 0x87
    c = paho_factory(gw.port, "dev1", version=version)
    c.connect()
    assert c.subscribe("public/#", 1) == [1]
    assert c.subscribe("secret/#", 1) == [denied]
    assert c.subscribe([("shared/a", 1), ("alice/x", 0)]) == [1, denied]
    assert c.subscribe([("clients/dev1/cmd", 1), ("clients/dev2/cmd", 1)]) == [1, denied]

    alice = paho_factory(gw.port, "alice-dev", version=version, username="alice", password=ALICE_PASSWORD)
    alice.connect()
    assert alice.subscribe("alice/#", 1) == [1]
    assert alice.subscribe("users/alice/feed", 1) == [1]
    assert alice.subscribe("users/bob/feed", 1) == [denied]
    assert alice.subscribe("inbox/alice", 1) == [denied]  # write-only
    assert alice.subscribe("public/#", 1) == [denied]  # anonymous rules do not apply to alice


def test_unreadable_topics_are_not_delivered(gateway_factory: GatewayFactory, paho_factory: PahoFactory,
                                            tmp_path: Path) -> None:
    gw = acl_gateway(gateway_factory, tmp_path)
    anon = paho_factory(gw.port, "anon-reader", version=4)
    anon.connect()
    anon.subscribe([("inbox/#", 1), ("shared/#", 1)])  # inbox: granted or refused, never delivered
    alice = paho_factory(gw.port, "alice-writer", version=4, username="alice", password=ALICE_PASSWORD)
    alice.connect()
    alice.publish("inbox/anon", b"hidden", qos=1)
    writer = paho_factory(gw.port, "anon-writer", version=4)
    writer.connect()
    writer.publish("shared/x", b"visible", qos=1)
    m = anon.get()
    assert (m.topic, m.payload) == ("shared/x", b"visible")
    anon.assert_nothing(0.5)


@pytest.mark.parametrize("version", [4, 5])
def test_denied_publish_is_dropped(gateway_factory: GatewayFactory, paho_factory: PahoFactory,
                                   version: int) -> None:
    gw = gateway_factory(acl_text=ACL)
    sub = paho_factory(gw.port, "acl-watch", version=version)
    sub.connect()
    sub.subscribe([("public/#", 1), ("shared/#", 1)])
    pub = paho_factory(gw.port, "acl-pub", version=version)
    pub.connect()
    rc = pub.publish("public/news", b"forged", qos=1)  # read-only for anonymous
    if version == 5:
        assert rc == 0x87
    pub.publish("shared/secret/x", b"denied", qos=1)
    pub.publish("shared/ok", b"allowed", qos=1)
    m = sub.get()
    assert (m.topic, m.payload) == ("shared/ok", b"allowed")
    sub.assert_nothing(0.5)
    assert pub.disconnects.empty(), "a denied publish must not close the connection"


def test_pattern_with_client_id(gateway_factory: GatewayFactory, paho_factory: PahoFactory) -> None:
    gw = gateway_factory(acl_text=ACL)
    dev = paho_factory(gw.port, "dev1", version=5)
    dev.connect()
    dev.subscribe("clients/#", 1)
    assert dev.publish("clients/dev1/cmd", b"self", qos=1) == 0
    assert dev.get().payload == b"self"
    assert dev.publish("clients/dev2/cmd", b"other", qos=1) == 0x87
    dev.assert_nothing(0.3)


def test_user_rules_and_pattern_with_username(gateway_factory: GatewayFactory, paho_factory: PahoFactory,
                                             tmp_path: Path) -> None:
    gw = acl_gateway(gateway_factory, tmp_path)
    alice = paho_factory(gw.port, "alice-dev", version=5, username="alice", password=ALICE_PASSWORD)
    alice.connect()
    alice.subscribe([("alice/#", 1), ("public/#", 1)])
    assert alice.publish("inbox/bob", b"hi", qos=1) in (0, 0x10)  # 0x10: no matching subscribers
    assert alice.publish("alice/t", b"mine", qos=1) == 0
    assert alice.get().payload == b"mine"
    assert alice.publish("shared/t", b"anon-only", qos=1) == 0x87  # anonymous rules do not apply to alice

    anon = paho_factory(gw.port, "anon", version=5)
    anon.connect()
    anon.subscribe("public/#", 1)
    assert anon.publish("alice/t", b"intruder", qos=1) == 0x87
    alice.assert_nothing(0.3)
