"""The reader of Mosquitto's `connection` blocks: Mosquitto 2.0's syntax, line for line, and the same files given to
a real Mosquitto 2.0.11, which must accept what the reader accepts (and log the bridges the reader read), reject
what it rejects at the same line, and map topics across a real bridge as `TopicRule` says."""

from __future__ import annotations

import re
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadtest.ports import free_port
from tests.integration.certs import TestPKI
from tests.integration.conftest import MOSQUITTO, Gateway
from tests.integration.paho import PahoClient, Received
from tests.waiting import wait_until
from tidewire.bridges.mqtt.mosquitto_conf import (
    BRIDGE_OPTIONS,
    MOSQUITTO_OPTIONS,
    MosquittoBridges,
    read_bridge_file,
    read_bridges,
)
from tidewire.bridges.mqtt.settings import REFUSED, Address, BridgeSettings, TopicRule
from tidewire.errors import ConfigError

HOST = "node7"

MAN_PAGE_EXAMPLE = """\
connection test-mosquitto-org
address test.mosquitto.org
cleansession true
topic clients/total in 0 test/mosquitto/org/ $SYS/broker/
"""


def read(text: str) -> MosquittoBridges:
    return read_bridges(text, source="m.conf", hostname=HOST)


def one(text: str) -> BridgeSettings:
    (bridge,) = read(text).bridges
    return bridge


def error(text: str) -> str:
    with pytest.raises(ConfigError) as info:
        read(text)
    return str(info.value)


def block(*lines: str) -> str:
    """A valid block named `b` with `lines` after its address and first topic."""
    return "\n".join(["connection b", "address 127.0.0.1", "topic x/#", *lines]) + "\n"


# -- the man page's example and a whole mosquitto.conf ---------------------------------------------------------

def test_the_man_pages_example() -> None:
    b = one(MAN_PAGE_EXAMPLE)
    assert b.name == "test-mosquitto-org" and b.addresses == [Address(host="test.mosquitto.org", port=1883)]
    assert b.cleansession and b.local_clean
    assert b.topics == [TopicRule(pattern="clients/total", direction="in", qos=0, local_prefix="test/mosquitto/org/",
                                  remote_prefix="$SYS/broker/")]
    assert b.topics[0].to_local("$SYS/broker/clients/total") == "test/mosquitto/org/clients/total"
    r = b.resolved(HOST)
    assert (r.client_id, r.local_client_id) == ("node7.test-mosquitto-org", "local.node7.test-mosquitto-org")
    assert b.remote_clientid is None  # the reader keeps what the file says


FULL_CONF = """\
# mosquitto.conf of a site broker
per_listener_settings false
listener 1883 0.0.0.0
listener 8883
certfile /etc/mosquitto/certs/server.crt
keyfile /etc/mosquitto/certs/server.key
persistence true
persistence_location /var/lib/mosquitto/
log_dest file /var/log/mosquitto/mosquitto.log
log_type error
auth_plugin /usr/lib/plugin.so
auth_opt_backend files

# to the cloud
connection cloud
addresses cloud.example.com:8883 [2001:db8::5]:8883 ::1:1884 backup.example.com
round_robin true
remote_clientid site-42
remote_username site42
remote_password s3cret # everything up to the end of the line
bridge_protocol_version mqttv50
bridge_session_expiry_interval 3600
bridge_cafile /etc/mosquitto/ca.crt
bridge_certfile /etc/mosquitto/site.crt
bridge_keyfile /etc/mosquitto/site.key
bridge_insecure false
bridge_tls_version tlsv1.3
bridge_alpn mqtt
bridge_bind_address 192.168.1.10
keepalive_interval 30
restart_timeout 10 60
start_type automatic
cleansession false
local_cleansession true
notifications true
notifications_local_only true
notification_topic site/42/bridge
try_private false
bridge_attempt_unsubscribe false
bridge_outgoing_retain false
bridge_max_packet_size 262144
topic sensors/# out 1 site/ site/42/
topic commands/# in 2 site/ site/42/
topic # both 2 local/topic/ remote/topic/

listener 1884 127.0.0.1
max_queued_messages 1000

connection lab
address 10.0.0.9
clientid lab-bridge
username old-style
password old
local_clientid lab-local
local_username bridge
local_password local-secret
start_type once
restart_timeout 20
topic "" out 0 lab/alarm remote/lab/alarm
topic plain both
"""


def test_a_whole_mosquitto_conf_with_listeners_and_two_connections() -> None:
    result = read(FULL_CONF)
    cloud, lab = result.bridges
    assert [number for number, _ in result.ignored] == [2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 46, 47]
    assert [option for _, option in result.ignored][:4] == ["per_listener_settings", "listener", "listener",
                                                            "certfile"]
    assert (12, "auth_opt_backend") in result.ignored
    assert result.notices == [(22, "bridge_session_expiry_interval is a Mosquitto 2.1 option: Mosquitto 2.0 "
                                   "refuses it")]
    assert cloud.addresses == [Address(host="cloud.example.com", port=8883), Address(host="2001:db8::5", port=8883),
                               Address(host="::1", port=1884), Address(host="backup.example.com", port=1883)]
    assert cloud.model_dump(exclude={"addresses", "topics"}) == {
        "name": "cloud", "bridge_protocol_version": "mqttv50", "cleansession": False, "local_cleansession": True,
        "remote_clientid": "site-42", "local_clientid": None, "local_username": None, "local_password": None,
        "remote_username": "site42", "remote_password": "s3cret # everything up to the end of the line",
        "keepalive_interval": 30, "restart_timeout": (10.0, 60.0), "round_robin": True, "start_type": "automatic",
        "notifications": True, "notifications_local_only": True, "notification_topic": "site/42/bridge",
        "try_private": False, "bridge_attempt_unsubscribe": False, "bridge_outgoing_retain": False,
        "bridge_max_packet_size": 262144, "bridge_bind_address": "192.168.1.10",
        "bridge_cafile": Path("/etc/mosquitto/ca.crt"), "bridge_capath": None,
        "bridge_certfile": Path("/etc/mosquitto/site.crt"), "bridge_keyfile": Path("/etc/mosquitto/site.key"),
        "bridge_insecure": False, "bridge_tls_version": "tlsv1.3", "bridge_alpn": "mqtt",
        "bridge_session_expiry_interval": 3600, "max_inflight": 100}
    assert [t.line for t in cloud.topics] == ["topic sensors/# out 1 site/ site/42/",
                                              "topic commands/# in 2 site/ site/42/",
                                              "topic # both 2 local/topic/ remote/topic/"]
    assert cloud.tls and cloud.protocol_level == 5 and cloud.state_topic == "site/42/bridge"
    assert (lab.remote_clientid, lab.remote_username, lab.remote_password) == ("lab-bridge", "old-style", "old")
    assert (lab.local_client_id, lab.local_username, lab.local_password) == ("lab-local", "bridge", "local-secret")
    assert (lab.start_type, lab.restart_timeout, lab.tls) == ("once", (20.0, 20.0), False)
    assert [t.line for t in lab.topics] == ['topic "" out 0 lab/alarm remote/lab/alarm', "topic plain both 0"]
    assert lab.topics[0].to_remote("lab/alarm") == "remote/lab/alarm"


def test_the_bridge_options_are_mosquittos() -> None:
    only_later = BRIDGE_OPTIONS - MOSQUITTO_OPTIONS
    assert only_later == {"bridge_session_expiry_interval"}  # a Mosquitto 2.1 option


def test_a_file_without_bridges() -> None:
    result = read("listener 1883\n\nallow_anonymous true\n")
    assert result.bridges == [] and result.ignored == [(1, "listener"), (3, "allow_anonymous")]


# -- the syntax, as Mosquitto 2.0 reads it ----------------------------------------------------------------------

def test_comments_blank_lines_and_line_ends() -> None:
    text = "# top\r\n\r\n\nconnection b\r\n#address nowhere\r\naddress h:1884\r\ntopic a/#\r\n   \n"
    b = one(text)
    assert b.addresses == [Address(host="h", port=1884)] and b.topics[0].pattern == "a/#"


def test_a_comment_must_start_the_line() -> None:
    assert error(block("  # indented")) == "m.conf:4: connection b: unknown option '#' (Mosquitto refuses it too)"


def test_words_are_separated_by_spaces_only() -> None:
    assert "unknown option 'topic\\ty'" in error(block("topic\ty"))
    assert one(block("topic    y/#     in    1")).topics[1] == TopicRule(pattern="y/#", direction="in", qos=1)


def test_options_after_other_options_still_belong_to_the_block() -> None:
    b = one("connection b\nlistener 1884\naddress h\nlog_type all\ntopic a\n")
    assert b.addresses == [Address(host="h")] and b.topics[0].pattern == "a"


def test_bridge_options_before_any_connection() -> None:
    assert error("address h\nconnection b\n") == (
        "m.conf:1: address before any `connection <name>` line: bridge options belong to the block a `connection` "
        "line opens (Mosquitto: Invalid bridge configuration)")


def test_strings_take_the_rest_of_the_line_once() -> None:
    b = one(block("remote_username   user name # not a comment  ", "remote_password p"))
    assert b.remote_username == "user name # not a comment"
    assert error(block("remote_username a", "username b")) == (
        "m.conf:5: connection b: username given twice in one block (first at line 4; Mosquitto refuses it too)")
    assert error(block("local_clientid ")) == "m.conf:4: connection b: local_clientid without a value"
    assert error(block("local_clientid")) == "m.conf:4: connection b: local_clientid without a value"


def test_the_old_names() -> None:
    b = one(block("clientid c", "username u", "password p"))
    assert (b.remote_clientid, b.remote_username, b.remote_password) == ("c", "u", "p")


@pytest.mark.parametrize(("word", "value"), [("true", True), ("1", True), ("false", False), ("0", False)])
def test_booleans(word: str, value: bool) -> None:
    assert one(block(f"round_robin {word} # a comment after one word")).round_robin is value


def test_a_bad_boolean() -> None:
    assert error(block("cleansession yes")) == "m.conf:4: connection b: cleansession 'yes' is not true, false, 1 or 0"
    assert error(block("cleansession True")) == (
        "m.conf:4: connection b: cleansession 'True' is not true, false, 1 or 0")


def test_the_last_boolean_number_or_keyword_wins() -> None:
    b = one(block("cleansession true", "keepalive_interval 20", "start_type once", "cleansession false",
                  "keepalive_interval 40", "start_type automatic", "bridge_protocol_version mqttv31",
                  "bridge_protocol_version mqttv50"))
    assert (b.cleansession, b.keepalive_interval, b.start_type, b.bridge_protocol_version) == (False, 40, "automatic",
                                                                                              "mqttv50")


def test_addresses() -> None:
    b = one("connection b\naddresses h1 h2:1884   10.1.2.3:1885 # backup ones later\ntopic a\n")
    assert [str(a) for a in b.addresses] == ["h1:1883", "h2:1884", "10.1.2.3:1885"]
    assert error("connection b\naddress h1\naddress h2\n") == (
        "m.conf:3: connection b: address given twice in one block (first at line 2): put every host[:port] on one "
        "line (Mosquitto: Invalid bridge configuration)")
    assert error("connection b\naddress h:0\n") == (
        "m.conf:2: connection b: address 'h:0': the port 0 is not between 1 and 65535")
    assert error("connection b\naddress\n") == "m.conf:2: connection b: address without a host"
    assert "IPv6 address needs its port" in error("connection b\naddress ::1\ntopic a\n")


def test_topics_accumulate_in_order() -> None:
    b = one(block("topic y in", "topic z both 2"))
    assert [(t.pattern, t.direction, t.qos) for t in b.topics] == [("x/#", "out", 0), ("y", "in", 0), ("z", "both", 2)]


@pytest.mark.parametrize(("line", "rule"), [
    ("topic a", TopicRule(pattern="a")),
    ("topic a IN", TopicRule(pattern="a", direction="in")),  # Mosquitto compares without case
    ("topic a both 1", TopicRule(pattern="a", direction="both", qos=1)),
    ("topic a in 0 L/ R/", TopicRule(pattern="a", direction="in", local_prefix="L/", remote_prefix="R/")),
    ('topic a out 0 L/ ""', TopicRule(pattern="a", local_prefix="L/")),
    ('topic a out 0 "" R/', TopicRule(pattern="a", remote_prefix="R/")),
    ('topic a out 0 "" ""', TopicRule(pattern="a")),
    ('topic "" out 2 local remote', TopicRule(pattern="", qos=2, local_prefix="local", remote_prefix="remote")),
    ("topic a out 0 L/", TopicRule(pattern="a", local_prefix="L/")),  # Mosquitto takes a missing remote as ""
    ("topic a out # a comment", TopicRule(pattern="a")),
    ("topic a out 1 # a comment", TopicRule(pattern="a", qos=1)),
    ("topic a out 1 L/ # a comment", TopicRule(pattern="a", qos=1, local_prefix="L/")),
    ("topic a out 1 L/ R/ extra words", TopicRule(pattern="a", qos=1, local_prefix="L/", remote_prefix="R/")),
])
def test_topic_lines(line: str, rule: TopicRule) -> None:
    assert one(f"connection b\naddress h\n{line}\n").topics == [rule]


@pytest.mark.parametrize(("line", "message"), [
    ("topic", "topic without a pattern"),
    ("topic a sideways", "topic: the direction 'sideways' is not out, in or both"),
    ("topic a out 3", "topic: the QoS '3' is not 0, 1 or 2"),
    ("topic a out -1", "topic: the QoS '-1' is not 0, 1 or 2"),
    ('topic "" out 0 L/', 'an empty pattern ("") needs both a local and a remote prefix'),
    ('topic "" out 0 "" R/', 'an empty pattern ("") needs both a local and a remote prefix'),
    ('topic ""', 'an empty pattern ("") needs both a local and a remote prefix'),
    ("topic a out 0 L/+/ R/", "local_prefix: 'L/+/' is not a topic name"),
    ("topic a out 0 L/ R/#", "remote_prefix: 'R/#' is not a topic name"),
    ("topic # out 0 L R", "the local filter 'L#' (prefix + pattern) is not a valid topic filter"),
])
def test_bad_topic_lines(line: str, message: str) -> None:
    text = error(f"connection b\naddress h\n{line}\n")
    assert text.startswith("m.conf:3: connection b: ") and message in text


def test_numbers_are_read_as_mosquitto_reads_them() -> None:
    result = read(block("keepalive_interval 2", "bridge_max_packet_size 1000bytes", "restart_timeout 0"))
    b = result.bridges[0]
    assert (b.keepalive_interval, b.bridge_max_packet_size, b.restart_timeout) == (5, 1000, (1.0, 1.0))
    assert result.notices == [(4, "keepalive_interval 2 is too low: 5 s, as Mosquitto"),
                              (5, "bridge_max_packet_size '1000bytes' read as 1000, as Mosquitto reads it"),
                              (6, "restart_timeout 0 is too low: 1 s, as Mosquitto")]
    assert error(block("keepalive_interval 65536")) == (
        "m.conf:4: connection b: keepalive_interval 65536 is above 65535 (Mosquitto refuses it too)")
    assert error(block("keepalive_interval")) == "m.conf:4: connection b: keepalive_interval without a value"


def test_restart_timeout() -> None:
    assert one(block("restart_timeout 20")).restart_timeout == (20.0, 20.0)
    assert one(block("restart_timeout 10 60")).restart_timeout == (10.0, 60.0)
    assert error(block("restart_timeout 60 10")) == (
        "m.conf:4: connection b: restart_timeout: the cap 10 is lower than the base 60 (Mosquitto refuses it too)")


def test_bridge_protocol_version_is_the_rest_of_the_line_untrimmed() -> None:
    assert error(block("bridge_protocol_version mqttv311 ")) == (
        "m.conf:4: connection b: bridge_protocol_version 'mqttv311 ' is not mqttv31, mqttv311 or mqttv50")


def test_start_types() -> None:
    assert one(block("start_type once")).start_type == "once"
    assert error(block("start_type manual")) == (
        "m.conf:4: connection b: start_type manual is not supported (Mosquitto refuses it too)")
    assert "start_type 'eager' is not automatic or once" in error(block("start_type eager"))


@pytest.mark.parametrize(("line", "reason"), [
    ("start_type lazy", REFUSED["start_type lazy"]),
    ("threshold 10", "threshold: " + REFUSED["threshold"]),
    ("idle_timeout 60", "idle_timeout: " + REFUSED["idle_timeout"]),
    ("bridge_identity bridge1", "bridge_identity: " + REFUSED["bridge_identity"]),
    ("bridge_psk 0123456789abcdef", "bridge_psk: " + REFUSED["bridge_psk"]),
    ("bridge_require_ocsp true", "bridge_require_ocsp: " + REFUSED["bridge_require_ocsp"]),
])
def test_what_tidewire_refuses(line: str, reason: str) -> None:
    assert error(block(line)) == f"m.conf:4: connection b: {reason}"


def test_ocsp_not_required_is_read() -> None:
    assert one(block("bridge_require_ocsp false")).name == "b"


def test_unknown_and_later_options() -> None:
    assert error(block("conection c")) == (
        "m.conf:4: connection b: unknown option 'conection' (Mosquitto refuses it too)")
    assert error("Listener 1883\n") == "m.conf:1: unknown option 'Listener' (Mosquitto refuses it too)"
    assert "bridge_receive_maximum is an option of later Mosquitto versions (2.1)" in error(
        block("bridge_receive_maximum 10"))


def test_bridge_names() -> None:
    assert error(block("connection b")) == "m.conf:4: a second bridge named 'b' (the first: m.conf:1)"
    assert error("connection my/bridge\n") == (
        "m.conf:1: the bridge name 'my/bridge' may hold only letters, digits, '_', '.' and '-'")
    assert error("connection\n") == "m.conf:1: `connection` without a name"


def test_every_bridge_needs_an_address_and_a_topic() -> None:
    assert error("connection a\ntopic x\n") == (
        "m.conf:1: connection a: no `address` line (every bridge needs a remote broker)")
    assert error("connection a\naddress h\nconnection c\naddress h\ntopic x\n") == (
        "m.conf:1: connection a: no `topic` line (every bridge needs one)")


def test_two_bridges_with_one_local_client_id() -> None:
    assert error("connection a\naddress h\ntopic x\nconnection b\naddress h\ntopic x\nremote_clientid node7.a\n") == (
        "m.conf:4: connection b: the local client id 'local.node7.a' is also that of connection a (m.conf:1): set "
        "local_clientid on one of them (Mosquitto refuses it too)")
    assert len(read("connection a\naddress h\ntopic x\nconnection b\naddress h\ntopic x\n").bridges) == 2


def test_errors_between_options_name_their_line() -> None:
    assert error(block("remote_password p")) == (
        "m.conf:4: connection b: remote_password needs remote_username (MQTT sends no password without a user name)")
    assert error(block("bridge_cafile ca.pem", "bridge_keyfile k.pem")) == (
        "m.conf:5: connection b: bridge_certfile and bridge_keyfile go together (a client certificate and its key)")
    assert error(block("bridge_tls_version tlsv1.1")) == (
        "m.conf:4: connection b: bridge_tls_version: 'tlsv1.1': Tidewire offers tlsv1.2 or tlsv1.3 (TLS 1.1 and "
        "older are not supported)")


def test_include_dir(tmp_path: Path) -> None:
    conf_d = tmp_path / "conf.d"
    conf_d.mkdir()
    (conf_d / "b.conf").write_text("connection second\naddress h2\ntopic b/#\nlog_type all\n")
    (conf_d / "A.conf").write_text("# first, as Mosquitto sorts\nconnection first\naddress h1\ntopic a/#\n")
    (conf_d / "c.conf.off").write_text("connection never\n")
    (conf_d / "x.conf").write_text("include_dir /nowhere\n")  # followed in the main file only
    text = f"connection main\naddress h0\ninclude_dir {conf_d}\ntopic main/# out 0 # still the main block\n"
    result = read(text)
    assert [b.name for b in result.bridges] == ["main", "first", "second"]
    assert result.bridges[0].topics[0].pattern == "main/#"
    assert list(result.included) == [conf_d / "A.conf", conf_d / "b.conf", conf_d / "x.conf"]
    assert [b.name for b in result.included[conf_d / "b.conf"].bridges] == ["second"]
    assert result.included[conf_d / "b.conf"].ignored == [(4, "log_type")]
    assert result.included[conf_d / "x.conf"].ignored == [(1, "include_dir")]
    (conf_d / "y.conf").write_text("topic orphan\n")  # a block does not continue into an included file
    assert error(text) == (f"{conf_d}/y.conf:1: topic before any `connection <name>` line: bridge options belong to "
                           "the block a `connection` line opens (Mosquitto: Invalid bridge configuration)")
    assert "include_dir: cannot open the directory '/nowhere'" in error("include_dir /nowhere\n")


def test_read_bridge_file(tmp_path: Path) -> None:
    path = tmp_path / "bridge.conf"
    path.write_bytes(b"# caf\xe9 (latin-1 in a comment)\n" + MAN_PAGE_EXAMPLE.encode())
    assert read_bridge_file(path, hostname=HOST).bridges[0].name == "test-mosquitto-org"
    path.write_bytes(MAN_PAGE_EXAMPLE.encode() + b"remote_username caf\xe9\n")
    with pytest.raises(ConfigError, match=f"^{path}:5: connection test-mosquitto-org: remote_username: its value "
                                          "is not UTF-8$"):
        read_bridge_file(path, hostname=HOST)
    with pytest.raises(ConfigError, match="cannot read it"):
        read_bridge_file(tmp_path / "missing.conf", hostname=HOST)


# -- the same files given to a real Mosquitto 2.0.11 -----------------------------------------------------------

needs_mosquitto = pytest.mark.skipif(not Path(MOSQUITTO).exists(), reason="needs Mosquitto at /usr/sbin/mosquitto")


@pytest.fixture
def brokers(tmp_path: Path) -> Iterator[list[Gateway]]:
    """Mosquittos started by a test, killed at its end."""
    made: list[Gateway] = []
    yield made
    for gateway in made:
        gateway.close()


@pytest.fixture
def clients() -> Iterator[list[PahoClient]]:
    made: list[PahoClient] = []
    yield made
    for client in made:
        client.close()


def start_mosquitto(brokers: list[Gateway], workdir: Path, conf_lines: list[str]) -> Gateway:
    broker = Gateway(workdir, target="mosquitto", conf_lines=conf_lines)
    brokers.append(broker)
    broker.start()
    return broker


def mosquitto_log(broker: Gateway) -> str:
    return broker.stderr


@needs_mosquitto
def test_mosquitto_accepts_the_file_and_runs_the_bridges_read(tmp_path: Path, brokers: list[Gateway]) -> None:
    pki = TestPKI(tmp_path / "pki")
    client = pki.issue_client("bridge")
    closed = [free_port() for _ in range(4)]  # nothing listens there: every bridge tries and fails
    lines = ["", "# bridges (a comment starts its line)", *MAN_PAGE_EXAMPLE.replace(
        "address test.mosquitto.org", f"address 127.0.0.1:{closed[0]}").splitlines(), "",
        "connection edge.2",
        f"addresses 127.0.0.1:{closed[1]} localhost:{closed[2]}",
        "round_robin true",
        "clientid edge-two",
        "username bridge-user",
        "password secret # up to the end of the line",
        "local_clientid edge-two-local",
        "keepalive_interval 30",
        "restart_timeout 10 60",
        "start_type once",
        "bridge_protocol_version mqttv50",
        "notification_topic bridges/edge2/state",
        "notifications_local_only true",
        "try_private false",
        "bridge_attempt_unsubscribe false",
        "bridge_outgoing_retain 0",
        "bridge_max_packet_size 65536",
        "cleansession false",
        "cleansession true",
        "local_cleansession false",
        "topic # both 2 local/topic/ remote/topic/",
        'topic "" out 1 one/local one/remote',
        'topic sensors/+ out 0 "" up/',
        'topic cmd/# in 1 down/ ""',
        "topic plain/# OUT # a comment where the QoS would be",
        f"listener {free_port()} 127.0.0.1",
        "topic after/listener both 0",
        "",
        "connection secure",
        f"address 127.0.0.1:{closed[3]}",
        f"bridge_cafile {pki.cafile}",
        f"bridge_certfile {client.certfile}",
        f"bridge_keyfile {client.keyfile}",
        "bridge_insecure false",
        "bridge_tls_version tlsv1.2",
        "bridge_alpn mqtt",
        "bridge_bind_address 127.0.0.1",
        "bridge_require_ocsp false",
        "topic secure/# out 1"]
    broker = start_mosquitto(brokers, tmp_path / "mosquitto", lines)
    conf = broker.workdir / "mosquitto.conf"
    result = read_bridge_file(conf, hostname=socket.gethostname())
    org, edge, secure = result.bridges
    assert [b.name for b in result.bridges] == ["test-mosquitto-org", "edge.2", "secure"]
    assert {option for _, option in result.ignored} >= {"listener", "allow_anonymous", "persistence", "log_type"}
    assert (edge.remote_clientid, edge.remote_password, edge.cleansession, edge.local_clean) == (
        "edge-two", "secret # up to the end of the line", True, False)
    assert edge.topics[-1].pattern == "after/listener" and len(edge.topics) == 6 and secure.tls

    # Mosquitto says what it read: each bridge's first address, and its local client id and the local filter of
    # every out rule; the state topic gets its retained 0 (the remote client id of the defaults, too).
    expected = []
    for b in result.bridges:
        first = b.addresses[0]
        expected.append(rf"Connecting bridge (\(step 1\) )?{re.escape(b.name)} \({re.escape(first.host)}:"
                        rf"{first.port}\)")
        expected += [rf"Bridge {re.escape(b.local_client_id)} doing local SUBSCRIBE on topic "
                     rf"{re.escape(rule.local_filter)}$" for rule in b.topics if rule.outgoing]
    wait_until(lambda: all(re.search(p, mosquitto_log(broker), re.M) for p in expected), timeout=5,
               what=lambda: f"{[p for p in expected if not re.search(p, mosquitto_log(broker), re.M)]} in\n"
                            f"{mosquitto_log(broker)}")
    assert not re.search(r"doing local SUBSCRIBE on topic .*clients/total", mosquitto_log(broker))  # an in rule
    states = subprocess.run(["mosquitto_sub", "-p", str(broker.port), "-v", "-C", "3", "-W", "5",
                             *[arg for b in result.bridges for arg in ("-t", b.state_topic)]],
                            capture_output=True, text=True, timeout=10)
    assert sorted(states.stdout.splitlines()) == sorted(f"{b.state_topic} 0" for b in result.bridges)
    assert org.state_topic == f"$SYS/broker/connection/{socket.gethostname()}.test-mosquitto-org/state"
    assert broker.alive
    broker.stop()


REJECTED = [  # (lines after `connection b`, what our error says); Mosquitto refuses each at the same line
    (["address 127.0.0.1", "topic x", "remote_username a", "remote_username b"], "given twice"),
    (["address 127.0.0.1", "address 127.0.0.2", "topic x"], "address given twice"),
    (["address 127.0.0.1", 'topic "" out 0 L/'], "needs both a local and a remote prefix"),
    (["address 127.0.0.1", "topic x", "   # an indented comment"], "unknown option '#'"),
    (["address 127.0.0.1", "topic\tx"], "unknown option 'topic\\tx'"),
    (["address 127.0.0.1", "topic x", "keepalive_interval 70000"], "above 65535"),
    (["address 127.0.0.1", "topic x", "restart_timeout 30 10"], "lower than the base"),
    (["address 127.0.0.1", "topic x", "bridge_protocol_version mqttv311 "], "is not mqttv31, mqttv311 or mqttv50"),
    (["address 127.0.0.1", "topic x", "connection b"], "a second bridge named 'b'"),
    (["address 127.0.0.1", "topic x", "cleansession yes"], "is not true, false, 1 or 0"),
    (["address 127.0.0.1", "topic x sideways"], "is not out, in or both"),
    (["address 127.0.0.1", "topic x out 3"], "is not 0, 1 or 2"),
    (["address 127.0.0.1", "topic x", "start_type manual"], "start_type manual"),
    (["address 127.0.0.1", "topic x out 0 L/+/ R/"], "is not a topic name"),
    (["address 127.0.0.1:0", "topic x"], "not between 1 and 65535"),
    (["address 127.0.0.1", "topic x", "conection c"], "unknown option 'conection'"),
    (["address 127.0.0.1", "topic x", "bridge_receive_maximum 10"], "later Mosquitto versions"),
    (["address 127.0.0.1", "topic x", "local_username"], "without a value"),
]


def mosquitto_check(conf: Path) -> tuple[int, str]:
    """Mosquitto run on `conf`: its exit code and log. A file it refuses ends it at once; one it accepts is stopped
    when its listener answers (it then runs)."""
    proc = subprocess.Popen([MOSQUITTO, "-c", str(conf), "-v"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        out, _ = proc.communicate(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        return 0, out
    return proc.returncode, out


@needs_mosquitto
@pytest.mark.parametrize(("lines", "message"), REJECTED)
def test_mosquitto_rejects_what_the_reader_rejects_at_the_same_line(tmp_path: Path, lines: list[str],
                                                                     message: str) -> None:
    conf = tmp_path / "mosquitto.conf"
    conf.write_text("\n".join([f"listener {free_port()} 127.0.0.1", "log_dest stderr", "user root", "",
                               "connection b", *lines]) + "\n")
    with pytest.raises(ConfigError) as info:
        read_bridge_file(conf, hostname=socket.gethostname())
    ours = str(info.value)
    assert message in ours
    code, log = mosquitto_check(conf)
    assert code != 0, log
    found = re.search(rf"Error found at {re.escape(str(conf))}:(\d+)\.", log)
    assert found is not None, log
    assert ours.startswith(f"{conf}:{found.group(1)}: "), (ours, log)


@needs_mosquitto
@pytest.mark.parametrize("text", ["connection b\naddress 127.0.0.1\n",
                                  "connection a\naddress 127.0.0.1\ntopic x\nconnection b\naddress 127.0.0.1\n"
                                  "topic x\nremote_clientid {host}.a\n"])
def test_mosquitto_rejects_what_the_reader_rejects_after_reading(tmp_path: Path, text: str) -> None:
    # No topic, or two local client ids alike: found once every line is read (Mosquitto names no line).
    conf = tmp_path / "mosquitto.conf"
    conf.write_text(f"listener {free_port()} 127.0.0.1\nlog_dest stderr\nuser root\n"
                    + text.format(host=socket.gethostname()))
    with pytest.raises(ConfigError):
        read_bridge_file(conf, hostname=socket.gethostname())
    code, log = mosquitto_check(conf)
    assert code != 0 and "Error: " in log, log


def drain(client: PahoClient, into: list[Received]) -> list[Received]:
    while not client.messages.empty():
        into.append(client.messages.get_nowait())
    return into


@needs_mosquitto
def test_topics_cross_a_real_mosquitto_bridge_as_the_rules_map_them(tmp_path: Path, brokers: list[Gateway],
                                                                    clients: list[PahoClient]) -> None:
    remote = start_mosquitto(brokers, tmp_path / "remote", ["sys_interval 1"])
    block_lines = [
        "connection mapping", f"address 127.0.0.1:{remote.port}", "remote_username mapper", "cleansession true",
        "keepalive_interval 20",
        # mosquitto.conf(5)'s valid rows, then its example, then a tree whose prefix topic itself matches `#`
        "topic t1 both 0 L/ R/", 'topic t2 both 0 L/ ""', 'topic t3 both 0 "" R/', 'topic t4 both 0 "" ""',
        'topic "" both 0 local5 remote5', "topic clients/total in 0 test/mosquitto/org/ $SYS/broker/",
        "topic # out 1 lx/ rx/"]
    local = start_mosquitto(brokers, tmp_path / "local", block_lines)
    (bridge,) = read_bridge_file(local.workdir / "mosquitto.conf", hostname=socket.gethostname()).bridges

    # The remote sees the client id, clean session, keepalive and user name read, and every remote filter.
    connected = rf"New bridge connected from .* as {re.escape(bridge.client_id)} \(p2, c1, k20, u'mapper'\)"
    subscribed = [rf"^{re.escape(bridge.client_id)} 0 {re.escape(r.remote_filter)}$" for r in bridge.topics
                  if r.incoming]
    wait_until(lambda: all(re.search(p, remote.stderr, re.M) for p in [connected, *subscribed]), timeout=8,
               what=lambda: f"the bridge's CONNECT and SUBSCRIBEs in\n{remote.stderr}")

    local_watch, remote_watch = PahoClient(local.port, version=4), PahoClient(remote.port, version=4)
    clients += [local_watch, remote_watch]
    for watch in (local_watch, remote_watch):
        watch.connect()
        watch.subscribe("#", qos=1)

    # out: what the remote receives for each local topic is `to_remote`, and the bridge's `remote_topic`
    sent_out = ["L/t1", "L/t2", "t3", "t4", "local5", "lx/a/b", "lx"]
    for topic in sent_out:
        local_watch.publish(topic, f"out {topic}", qos=1)
    got_remote: list[Received] = []
    wait_until(lambda: len([m for m in drain(remote_watch, got_remote) if m.payload.startswith(b"out ")])
               >= len(sent_out), timeout=5, what=lambda: f"{len(sent_out)} messages out, got {got_remote}")
    arrived = {m.payload.decode()[4:]: m.topic for m in got_remote if m.payload.startswith(b"out ")}
    assert arrived == {topic: bridge.remote_topic(topic) for topic in sent_out}
    assert arrived["lx"] == "rx/lx"  # Mosquitto's own reading of a prefix matched by `#`
    assert all(arrived[t] == next(r for r in bridge.topics if r.to_remote(t)).to_remote(t) for t in sent_out)

    # in: what the local side receives for each remote topic is `to_local`; and the man page's example
    sent_in = ["R/t1", "t2", "R/t3", "t4", "remote5"]
    for topic in sent_in:
        remote_watch.publish(topic, f"in {topic}", qos=1)
    got_local: list[Received] = []
    wait_until(lambda: len([m for m in drain(local_watch, got_local) if m.payload.startswith(b"in ")])
               >= len(sent_in) and any(m.topic == "test/mosquitto/org/clients/total" for m in got_local),
               timeout=5, what=lambda: f"{len(sent_in)} messages in and $SYS/broker/clients/total, got {got_local}")
    arrived = {m.payload.decode()[3:]: m.topic for m in got_local if m.payload.startswith(b"in ")}
    assert arrived == {topic: bridge.local_topic(topic) for topic in sent_in}
    assert bridge.local_topic("$SYS/broker/clients/total") == "test/mosquitto/org/clients/total"
