"""Plugins in a real Tidewire process: the test distribution (`plugin_pkg/`, made discoverable through a `.dist-info`
on the gateway's PYTHONPATH) is chosen by name in the config. paho clients are authenticated by the plugin (accepted
and refused, mixed with the password file), publishes are rewritten (a subscriber gets them on the new topic) and
denied (PUBACK 0x87 to MQTT 5), an authorizer plugin narrows the ACL, a client's publishes keep their order through
a hook that answers late, and plugins that raise, hang or answer nonsense cost a counted error
(`tidewire_plugin_errors_total`) and their default while the node keeps serving. The admin API's publishes, AMQP's
and a bridge's incoming messages (from a real Mosquitto) go through the hooks too (RocketMQ's:
tests/gateway/protocols/rocketmq/test_produce.py). An unknown name stops the start with the installed names."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pika
import pika.exceptions
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.extensions.plugin_dist import lay_out, pythonpath
from tests.integration.conftest import Gateway, PahoClient, write_password_file
from tests.waiting import wait_until

NOT_AUTHORIZED = 0x87
BAD_CREDENTIALS = 0x86
TIMEOUT_S = 0.3  # every plugin's timeout here: a hanging plugin costs this much
FILE_USERS = {"raiser": "from-the-file", "hanger": "from-the-file", "bob": "builder"}
CONFIG = f"""
[security]
auth_chain = ["testauth", "file"]

[plugins]
authorizers = ["acl", "testauthz"]
publish_hooks = ["testhook", "stricthook"]
plugin_timeout = {TIMEOUT_S}

[plugins.defaults]
stricthook = "deny"

[plugins.options.testauth]
users = {{ alice = "wonderland" }}

[plugins.options.stricthook]
prefix = "strict/"
"""


@pytest.fixture(scope="module")
def plugin_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return lay_out(tmp_path_factory.mktemp("plugins"))


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, plugin_dir: Path) -> Iterator[Gateway]:
    work = tmp_path_factory.mktemp("gw")
    config = work / "tidewire.toml"
    config.write_text(CONFIG)
    passwords = write_password_file(work / "passwords", FILE_USERS)
    with Gateway(work, env={"PYTHONPATH": pythonpath(plugin_dir)}, password_file=passwords, admin=True, amqp=True,
                 extra_args=["--config", str(config)], target="tidewire") as gateway:
        yield gateway


@pytest.fixture
def clients() -> Iterator[list[PahoClient]]:
    made: list[PahoClient] = []
    yield made
    for client in made:
        client.close()


def client(gw: Gateway, clients: list[PahoClient], user: str = "alice", password: str = "wonderland",
           version: int = 5, check: bool = True) -> tuple[PahoClient, int]:
    made = PahoClient(gw.port, version=version, username=user, password=password)
    clients.append(made)
    return made, made.connect(check=check).reason_code


def errors(gw: Gateway) -> dict[tuple[str, str], float]:
    """`tidewire_plugin_errors_total` by (plugin, kind), scraped from the admin port."""
    text = httpx.get(f"http://127.0.0.1:{gw.admin_port}/metrics", timeout=5.0).text
    return {(s.labels["plugin"], s.labels["kind"]): s.value for family in text_string_to_metric_families(text)
            for s in family.samples if s.name == "tidewire_plugin_errors_total"}


def dropped(gw: Gateway, reason: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{gw.admin_port}/metrics", timeout=5.0).text
    return sum(s.value for family in text_string_to_metric_families(text) for s in family.samples
               if s.name == "tidewire_dropped_total" and s.labels.get("reason") == reason)


def test_the_plugin_authenticates_mixed_with_the_password_file(gw: Gateway, clients: list[PahoClient]) -> None:
    assert client(gw, clients)[1] == 0  # the plugin accepts
    assert client(gw, clients, password="wrong", check=False)[1] == BAD_CREDENTIALS  # the plugin refuses
    assert client(gw, clients, user="mallory", password="x", check=False)[1] == NOT_AUTHORIZED
    assert client(gw, clients, user="bob", password="builder")[1] == 0  # ignored by the plugin: the file accepts
    assert client(gw, clients, user="zed", password="x", check=False)[1] == BAD_CREDENTIALS  # nobody accepts


def test_an_auth_plugin_that_raises_or_hangs_costs_an_error_and_its_default(gw: Gateway,
                                                                          clients: list[PahoClient]) -> None:
    before = errors(gw)
    # Default "ignore": the next source (the password file) decides.
    assert client(gw, clients, user="raiser", password="from-the-file")[1] == 0
    assert client(gw, clients, user="hanger", password="from-the-file")[1] == 0  # after the plugin's timeout
    assert client(gw, clients, user="raiser", password="wrong", check=False)[1] == BAD_CREDENTIALS
    after = errors(gw)
    assert after[("testauth", "error")] - before.get(("testauth", "error"), 0) == 2
    assert after[("testauth", "timeout")] - before.get(("testauth", "timeout"), 0) == 1
    assert gw.alive
    assert client(gw, clients)[1] == 0  # the node keeps serving


def test_a_publish_is_rewritten_to_another_topic(gw: Gateway, clients: list[PahoClient]) -> None:
    sub, _ = client(gw, clients)
    sub.subscribe("rewritten/#", qos=1)
    sub.subscribe("rewrite/#", qos=1)
    pub, _ = client(gw, clients)
    assert pub.publish("rewrite/a", b"hello", qos=1) == 0
    got = sub.get()
    assert (got.topic, got.payload) == ("rewritten/a", b"R:hello")
    pub.publish("rewrite/b", b"zero", qos=0)
    got = sub.get()
    assert (got.topic, got.payload) == ("rewritten/b", b"R:zero")
    sub.assert_nothing(0.2)  # nothing under the original topic


def test_a_denied_publish_gets_puback_0x87_and_is_not_delivered(gw: Gateway, clients: list[PahoClient]) -> None:
    sub, _ = client(gw, clients)
    sub.subscribe("#", qos=1)
    before = dropped(gw, "hook_denied")
    pub, _ = client(gw, clients)
    assert pub.publish("deny/a", b"x", qos=1) == NOT_AUTHORIZED
    # QoS 2: PUBREC 0x87 ends the flow; paho sends its PUBREL all the same and reports the PUBCOMP's 0x92
    # (packet identifier not found), as it does after an ACL denial.
    assert pub.publish("deny/b", b"x", qos=2) >= 0x80
    old, _ = client(gw, clients, version=4)
    assert old.publish("deny/c", b"x", qos=1) == 0  # 3.1.1 has no code for it: acknowledged and dropped
    # A rewrite the ACL refuses: `$SYS` is the broker's own.
    assert pub.publish("sys/a", b"x", qos=1) == NOT_AUTHORIZED
    assert pub.publish("after/a", b"ok", qos=1) == 0
    got = sub.get()
    assert got.topic == "after/a"  # none of the refused ones came before it
    assert dropped(gw, "hook_denied") - before == 3


def test_an_authorizer_plugin_narrows_the_acl(gw: Gateway, clients: list[PahoClient]) -> None:
    pub, _ = client(gw, clients)
    assert pub.publish("blocked/a", b"x", qos=1) == NOT_AUTHORIZED
    assert pub.subscribe("secret/#", qos=1) == [NOT_AUTHORIZED]
    before = errors(gw)
    assert pub.publish("authzraise/a", b"x", qos=1) == NOT_AUTHORIZED  # it raised: default deny
    assert errors(gw)[("testauthz", "error")] - before.get(("testauthz", "error"), 0) == 1
    assert pub.publish("open/a", b"x", qos=1) == 0


def test_hooks_that_raise_hang_or_answer_nonsense_cost_an_error_and_their_default(
        gw: Gateway, clients: list[PahoClient]) -> None:
    sub, _ = client(gw, clients)
    sub.subscribe("#", qos=1)
    pub, _ = client(gw, clients)
    before = errors(gw)
    # testhook's default is allow: each is stored as published.
    for topic in ("raise/a", "hang/a", "invalid/a", "badtopic/a"):
        assert pub.publish(topic, b"x", qos=1) == 0, topic
    assert [m.topic for m in sub.expect(4)] == ["raise/a", "hang/a", "invalid/a", "badtopic/a"]
    # stricthook's is deny.
    assert pub.publish("strict/raise/a", b"x", qos=1) == NOT_AUTHORIZED
    assert pub.publish("strict/hang/a", b"x", qos=1) == NOT_AUTHORIZED
    after = errors(gw)

    def more(plugin: str, kind: str) -> float:
        return after.get((plugin, kind), 0) - before.get((plugin, kind), 0)

    assert (more("testhook", "error"), more("testhook", "timeout"), more("testhook", "invalid")) == (1, 1, 2)
    assert (more("stricthook", "error"), more("stricthook", "timeout")) == (1, 1)
    assert gw.alive
    assert pub.publish("still/serving", b"x", qos=1) == 0
    assert sub.get().topic == "still/serving"
    assert "plugin.failed" in gw.stderr


def test_a_clients_publishes_keep_their_order_through_a_late_hook(gw: Gateway, clients: list[PahoClient]) -> None:
    sub, _ = client(gw, clients)
    sub.subscribe("slow/#", qos=1)
    pub, _ = client(gw, clients)
    count = 120
    mids = [pub.publish("slow/o", str(i).encode(), qos=i % 3 and 1, wait=False) for i in range(count)]
    got = sub.expect(count, timeout=8.0)
    assert [int(m.payload) for m in got] == list(range(count))
    wait_until(lambda: all(mid in pub.acks_snapshot() for mid in mids[-1:]), what="the last PUBACK")


def test_the_admin_api_publishes_through_the_hooks(gw: Gateway, clients: list[PahoClient]) -> None:
    sub, _ = client(gw, clients)
    sub.subscribe("rewritten/#", qos=1)
    api = httpx.Client(base_url=f"http://127.0.0.1:{gw.admin_port}",
                       headers={"authorization": f"Bearer {gw.api_token}"}, timeout=5.0)
    with api:
        refused = api.post("/api/v1/publish", json={"topic": "deny/api", "payload": "x", "qos": 1})
        assert refused.status_code == 403 and "test hook" in refused.text
        assert api.post("/api/v1/publish", json={"topic": "rewrite/api", "payload": "x", "qos": 1}).status_code == 200
    got = sub.get()
    assert (got.topic, got.payload) == ("rewritten/api", b"R:x")


def test_amqp_publishes_go_through_the_hooks(gw: Gateway, clients: list[PahoClient]) -> None:
    sub, _ = client(gw, clients)
    sub.subscribe("rewritten/#", qos=1)
    params = pika.ConnectionParameters("127.0.0.1", gw.amqp_port, credentials=pika.PlainCredentials("alice",
                                                                                                     "wonderland"))
    with pika.BlockingConnection(params) as conn:
        channel = conn.channel()
        channel.confirm_delivery()
        channel.basic_publish("amq.topic", "rewrite.amqp", b"y")
        got = sub.get()
        assert (got.topic, got.payload) == ("rewritten/amqp", b"R:y")
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
            channel.basic_publish("amq.topic", "deny.amqp", b"y")
        assert closed.value.reply_code == 403  # ACCESS_REFUSED, as the ACL's refusal


def test_an_unknown_plugin_name_stops_the_start_naming_the_installed_ones(tmp_path: Path, plugin_dir: Path) -> None:
    env = {"PYTHONPATH": pythonpath(plugin_dir), "PATH": "/usr/bin:/bin", "TIDEWIRE_PURE_PYTHON": "1"}
    done = subprocess.run([sys.executable, "-m", "tidewire", "serve", "--port", "0", "--data-dir", str(tmp_path),
                           "--amqp-port", "off", "--rocketmq-port", "off", "--admin-port", "off",
                           "--auth-chain", '["file", "nope"]'], env=env, capture_output=True, timeout=30, text=True)
    assert done.returncode == 2
    assert "no authentication source named 'nope'" in done.stderr
    assert "installed: file, jwt, http, dynsec, testauth" in done.stderr


def test_a_bridges_incoming_messages_go_through_the_hooks(tmp_path: Path, plugin_dir: Path,
                                                          clients: list[PahoClient]) -> None:
    remote = Gateway(tmp_path / "remote", target="mosquitto")
    conf = tmp_path / "bridges.conf"
    with remote:
        conf.write_text(f"connection b1\naddress 127.0.0.1:{remote.port}\nrestart_timeout 1\n"
                        "topic # in 1 from-remote/ \n")
        local = Gateway(tmp_path / "local", target="tidewire", extra_args=["--mosquitto-bridge", str(conf)],
                        env={"PYTHONPATH": pythonpath(plugin_dir), "TIDEWIRE_PUBLISH_HOOKS": '["testhook"]',
                             "TIDEWIRE_PLUGIN_OPTIONS": '{"testhook": {"prefix": "from-remote/"}}'})
        with local:
            sub = PahoClient(local.port, "local-sub")
            clients.append(sub)
            sub.connect()
            sub.subscribe("from-remote/#", qos=1)
            sub.subscribe("rewritten/#", qos=1)
            pub = PahoClient(remote.port, "remote-pub", version=4)
            clients.append(pub)
            pub.connect()

            def through() -> bool:  # until the bridge is up: the remote keeps nothing for it before
                pub.publish("plain", b"up?", qos=1)
                try:
                    return sub.get(timeout=0.2).topic == "from-remote/plain"
                except AssertionError:
                    return False

            wait_until(through, timeout=15, interval=0.0, what="the bridge carrying a message in")
            pub.publish("deny/a", b"no", qos=1)
            pub.publish("rewrite/a", b"yes", qos=1)
            got = sub.get(timeout=5)
            while got.topic == "from-remote/plain":  # the probes sent while the bridge came up
                got = sub.get(timeout=5)
            assert (got.topic, got.payload) == ("rewritten/a", b"R:yes")  # the hook sees the local topic
            sub.assert_nothing(0.3)  # deny/a was dropped
