"""EMQX's conveniences end to end with paho and mosquitto clients: topic rewrite before the ACL, auto-subscribe,
exclusive subscriptions, and delayed publish (refusals, the admin API's listing and cancel; its timing, restart
and cancel-never-arrives are slow tests)."""

from __future__ import annotations

import json
import subprocess
import time

import httpx
import pytest

from tests.integration.conftest import Gateway, GatewayFactory, PahoFactory
from tests.integration.rawmqtt import RawClient
from tests.waiting import wait_until
from tidewire.gateway.protocols.mqtt.codec import (
    Suback,
    Subscribe,
    SubscriptionRequest,
    Unsuback,
    Unsubscribe,
    encode,
)

pytestmark = pytest.mark.tidewire_only
MOSQUITTO_PUB = "/usr/bin/mosquitto_pub"

# Anonymous clients may write and read only `dest/...` and their own `inbox/<client id>/...`.
ACL = """\
topic readwrite dest/#
pattern readwrite inbox/%c/#
topic readwrite later/#
"""
RULES = [
    {"action": "all", "source_topic": "src/#", "re": "^src/(.+)$", "dest_topic": "dest/$1"},
    {"action": "publish", "source_topic": "broken/#", "re": "^broken/(.+)$", "dest_topic": "dest/#/$1"},
    {"action": "subscribe", "source_topic": "mine/+", "re": "^mine/(.+)$", "dest_topic": "inbox/${clientid}/$1"},
]


def api(gw: Gateway) -> httpx.Client:
    return httpx.Client(base_url=f"http://127.0.0.1:{gw.admin_port}/api/v1",
                        headers={"Authorization": f"Bearer {gw.api_token}"}, timeout=10.0)


def test_rewrite_comes_before_the_acl(gateway_factory: GatewayFactory, paho_factory: PahoFactory) -> None:
    """The ACL allows only `dest/#`: a publish to `src/a` is taken (rewritten to `dest/a`) and delivered there;
    a subscription to `src/#` is one to `dest/#`; a rule whose result is no topic leaves the topic as it was (so
    the ACL refuses it); `%c`-like `${clientid}` in a subscribe rule. (Exclusive subscriptions are off here.)"""
    gw = gateway_factory(acl_text=ACL, env={"TIDEWIRE_TOPIC_REWRITE": json.dumps(RULES),
                                            "TIDEWIRE_EXCLUSIVE_SUBSCRIPTIONS": "false"})
    sub = paho_factory(gw.port, "sub")
    sub.connect()
    assert sub.subscribe("src/#", 1) == [1]  # granted: it is `dest/#`, which the ACL allows
    assert sub.subscribe("mine/x", 1) == [1]  # inbox/sub/x
    assert sub.subscribe("$exclusive/dest/x", 1) == [0x8F]  # exclusive subscriptions off: as EMQX, invalid
    pub = paho_factory(gw.port, "pub")
    pub.connect()
    assert pub.publish("src/a", b"one", qos=1) == 0
    got = sub.get()
    assert (got.topic, got.payload) == ("dest/a", b"one")
    assert pub.publish("other/a", b"x", qos=1) == 0x87  # no rule, not allowed
    assert pub.publish("broken/a", b"x", qos=1) == 0x87  # `dest/#/a` is no topic: kept as `broken/a`, refused
    assert pub.publish("inbox/sub/x", b"two", qos=1) == 0x87  # another client's inbox
    own = paho_factory(gw.port, "own")
    own.connect()
    assert own.publish("inbox/own/x", b"mine", qos=1) == 0
    sub.assert_nothing(0.2)
    # Unsubscribing the source filter removes the rewritten subscription.
    assert sub.unsubscribe("src/#") == [0]
    assert pub.publish("src/b", b"three", qos=1) == 0
    sub.assert_nothing(0.3)
    assert "rewrite.invalid_result" in gw.stderr


def test_auto_subscribe_with_client_id_and_acl(gateway_factory: GatewayFactory, paho_factory: PahoFactory) -> None:
    """Every client is subscribed to `cmd/%c` at connect (its retained message sent) without sending SUBSCRIBE;
    an entry the ACL refuses (`secret/#`) is not subscribed; a client id holding a wildcard gets no `%c` entry
    (`cmd/+` would read every device's commands)."""
    auto = [{"topic": "cmd/%c", "qos": 1}, {"topic": "secret/#", "qos": 0}]
    gw = gateway_factory(acl_text=ACL + "topic readwrite cmd/#\n", env={"TIDEWIRE_AUTO_SUBSCRIBE": json.dumps(auto)})
    pub = paho_factory(gw.port, "pub")
    pub.connect()
    assert pub.publish("cmd/dev1", b"retained", qos=1, retain=True) == 0
    dev = paho_factory(gw.port, "dev1")
    dev.connect()
    got = dev.get()
    assert (got.topic, got.payload, got.retain) == ("cmd/dev1", b"retained", True)
    wild = paho_factory(gw.port, "+")
    wild.connect()
    subprocess.run([MOSQUITTO_PUB, "-p", str(gw.port), "-i", "tool", "-t", "cmd/dev1", "-m", "go", "-q", "1"],
                   check=True, timeout=10)
    got = dev.get()
    assert (got.topic, got.payload, got.retain) == ("cmd/dev1", b"go", False)
    assert pub.publish("cmd/dev2", b"not yours", qos=1) == 0
    dev.assert_nothing(0.2)
    wild.assert_nothing(0.0)  # the same wait covered both
    assert "client.auto_subscribe_refused" in gw.stderr and "secret/#" in gw.stderr


def test_exclusive_one_subscriber_at_a_time(gateway_factory: GatewayFactory, paho_factory: PahoFactory) -> None:
    """The second subscriber of `$exclusive/jobs/#` is refused 0x97 (3.1.1: 0x80) until the first unsubscribes,
    then until the holder's clean session ends; the holder receives on `jobs/...`; with the feature off the
    filter is invalid (0x8F)."""
    gw = gateway_factory(acl_text="topic readwrite jobs/#\ntopic readwrite order/#\ntopic readwrite other\n")
    first = paho_factory(gw.port, "first")
    first.connect()
    second = paho_factory(gw.port, "second")
    second.connect()
    old = paho_factory(gw.port, "old", version=4)
    old.connect()
    assert first.subscribe("$exclusive/jobs/#", 1) == [1]
    assert first.subscribe("$exclusive/jobs/#", 1) == [1]  # the holder again: still its
    assert second.subscribe([("$exclusive/jobs/#", 1), ("other", 0)]) == [0x97, 0]
    assert old.subscribe("$exclusive/jobs/#", 1) == [0x80]
    second.publish("jobs/1", b"work", qos=1)
    got = first.get()
    assert (got.topic, got.payload) == ("jobs/1", b"work")
    assert first.unsubscribe("$exclusive/jobs/#") == [0]
    wait_until(lambda: second.subscribe("$exclusive/jobs/#", 1) == [1], what="lock free after unsubscribe")
    assert first.subscribe("$exclusive/jobs/#", 1) == [0x97]
    second.disconnect()  # a clean session's end releases it
    second_again = paho_factory(gw.port, "second")
    wait_until(lambda: first.subscribe("$exclusive/jobs/#", 1) == [1], what="lock free after disconnect")
    second_again.connect()
    assert first.subscribe("$TIDEWIRE_DELAYED/#", 0) == [0x8F]  # the delayed messages' topic is nobody's
    assert first.subscribe("$exclusive/secret", 0) == [0x87]  # the ACL first: a denied client takes no lock
    # An UNSUBSCRIBE in the same TCP segment as the SUBSCRIBE (no client library sends that: a raw client) waits
    # for the lock (else it would find nothing to remove and the lock would stay taken): packets keep their order.
    raw = RawClient(gw.port, level=5)
    raw.connect("raw")
    raw.send_raw(encode(Subscribe(1, [SubscriptionRequest("$exclusive/order/t", 1)]), 5)
                 + encode(Unsubscribe(2, ["$exclusive/order/t"]), 5))
    assert raw.expect(Suback).reason_codes == [1]
    assert raw.expect(Unsuback).reason_codes == [0]  # 0: it removed the subscription
    wait_until(lambda: second_again.subscribe("$exclusive/order/t", 1) == [1], what="the lock free again")
    raw.close()


def test_delayed_refusals_listing_and_cancel(gateway_factory: GatewayFactory, paho_factory: PahoFactory) -> None:
    """A bad interval or a delay over the maximum is an invalid topic (0x90), the ACL is checked on the real
    topic (0x87), the internal topic is refused, and past `delayed_max_messages` a delayed publish gets 0x97;
    the admin API lists what waits (topic, due, publisher) and cancels one."""
    gw = gateway_factory(acl_text=ACL, admin=True,
                         env={"TIDEWIRE_DELAYED_MAX_SECONDS": "7200", "TIDEWIRE_DELAYED_MAX_MESSAGES": "2"})
    c = paho_factory(gw.port, "dev")
    c.connect()
    sub = paho_factory(gw.port, "watch")
    sub.connect()
    assert sub.subscribe("later/#", 1) == [1]
    assert c.publish("$delayed/abc/later/x", b"x", qos=1) == 0x90
    assert c.publish("$delayed/10", b"x", qos=1) == 0x90
    assert c.publish("$delayed/7201/later/x", b"x", qos=1) == 0x90
    assert c.publish("$delayed/60/secret/x", b"x", qos=1) == 0x87
    assert c.publish("$TIDEWIRE_DELAYED/1/n/later/x", b"x", qos=1) == 0x90
    before = time.time()
    assert c.publish("$delayed/3600/later/a", b"a", qos=1) == 0
    assert c.publish("$delayed/3600/later/b", b"b", qos=1, retain=True) == 0
    assert c.publish("$delayed/3600/later/c", b"c", qos=1) == 0x97  # two wait already
    with api(gw) as http:
        wait_until(lambda: len(http.get("/delayed").json()["data"]) == 2, what="both listed")
        entries = http.get("/delayed").json()["data"]
        assert [(e["topic"], e["publisher"], e["retain"]) for e in entries] == [
            ("later/a", "dev", False), ("later/b", "dev", True)]
        assert all(before + 3599 <= e["due"] <= time.time() + 3601 for e in entries)
        assert http.delete(f"/delayed/{entries[0]['id']}").status_code == 204
        assert http.delete(f"/delayed/{entries[0]['id']}").status_code == 404
        assert [e["topic"] for e in http.get("/delayed").json()["data"]] == ["later/b"]
        assert http.get("/delayed", params={"after": entries[1]["id"]}).json() == {"data": [], "next_after": None}
        assert http.delete("/delayed/not-a-number").status_code == 422
        assert httpx.get(f"http://127.0.0.1:{gw.admin_port}/api/v1/delayed", timeout=5.0).status_code == 401
    sub.assert_nothing(0.2)  # nothing came early


@pytest.mark.slow
def test_delayed_arrives_after_its_delay_and_survives_a_restart(gateway_factory: GatewayFactory,
                                                                 paho_factory: PahoFactory) -> None:
    """Three delayed messages: one arrives after its 2 s, not before, with its retain flag (on its topic, not the
    delayed one); one outlives a restart of the node in its 4 s and arrives then; one cancelled from the admin
    API never arrives."""
    gw = gateway_factory(admin=True)
    sub = paho_factory(gw.port, "watch", clean=False)
    sub.connect(session_expiry=600)
    assert sub.subscribe("later/#", 1) == [1]
    pub = paho_factory(gw.port, "dev")
    pub.connect()
    sent = time.monotonic()
    assert pub.publish("$delayed/2/later/soon", b"soon", qos=1, retain=True) == 0
    assert pub.publish("$delayed/4/later/cancelled", b"never", qos=1) == 0
    with api(gw) as http:
        wait_until(lambda: len(http.get("/delayed").json()["data"]) == 2, what="both waiting")
        doomed = [e for e in http.get("/delayed").json()["data"] if e["topic"] == "later/cancelled"]
        assert http.delete(f"/delayed/{doomed[0]['id']}").status_code == 204
    got = sub.get(timeout=10)
    assert time.monotonic() - sent >= 2 - 0.05, "published before its delay"
    assert (got.topic, got.payload) == ("later/soon", b"soon")
    late = paho_factory(gw.port, "late")
    late.connect()
    assert late.subscribe("later/soon", 1) == [1]
    kept = late.get()
    assert (kept.topic, kept.payload, kept.retain) == ("later/soon", b"soon", True)
    assert pub.publish("$delayed/4/later/restart", b"outlived", qos=1) == 0
    restarted_at = time.monotonic()
    gw.restart()
    sub.connect(clean_start=False, session_expiry=600)
    got = sub.get(timeout=15)
    assert time.monotonic() - restarted_at >= 4 - 0.05 - 1.0  # sent up to a second before the restart began
    assert (got.topic, got.payload) == ("later/restart", b"outlived")
    sub.assert_nothing(1.5)  # the cancelled one (due 4 s after the first) never came


@pytest.mark.slow
def test_exclusive_lock_outlives_a_disconnect_until_the_session_expires(gateway_factory: GatewayFactory,
                                                                        paho_factory: PahoFactory) -> None:
    """A persistent session keeps its exclusive subscription while its client is away; its expiry (3 s after the
    disconnect) releases it."""
    gw = gateway_factory()
    holder = paho_factory(gw.port, "holder", clean=False)
    holder.connect(session_expiry=3)
    assert holder.subscribe("$exclusive/jobs", 1) == [1]
    holder.disconnect()
    other = paho_factory(gw.port, "other")
    other.connect()
    assert other.subscribe("$exclusive/jobs", 1) == [0x97]  # the session (and its lock) lives on
    wait_until(lambda: other.subscribe("$exclusive/jobs", 1) == [1], timeout=10, what="released by the expiry")
