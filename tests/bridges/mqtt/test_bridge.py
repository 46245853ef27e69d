"""Tidewire's MQTT bridge against a real Mosquitto (and another Tidewire): configured with Mosquitto's own bridge
syntax (`--mosquitto-bridge FILE`), out and in with prefixes, MQTT 5, mutual TLS, what is published while the
remote is down, the link cut during the resend and the node killed, no loop between two bridged Tidewires, and
the bridge's status in the admin API, `$SYS` and /metrics. Clients on both sides are paho-mqtt and mosquitto_pub."""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from paho.mqtt.packettypes import PacketTypes

from tests.integration.certs import TestPKI
from tests.integration.conftest import Gateway, TlsOptions
from tests.integration.paho import PahoClient, v5_props
from tests.waiting import wait_until

MOSQUITTO_PUB = "/usr/bin/mosquitto_pub"
STATE = "$SYS/broker/connection/+/state"


class Pair:
    """A Tidewire node with bridges configured in a Mosquitto file, a remote broker, and their clients."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.gateways: list[Gateway] = []
        self.clients: list[PahoClient] = []

    def remote(self, name: str = "remote", *, target: str = "mosquitto", **kw: Any) -> Gateway:
        gw = Gateway(self.tmp / name, target=target, **kw)
        self.gateways.append(gw)
        gw.start()
        return gw

    def local(self, bridge_text: str, name: str = "local", *, start: bool = True, **kw: Any) -> Gateway:
        conf = self.tmp / f"{name}-bridges.conf"
        conf.write_text(bridge_text)
        gw = Gateway(self.tmp / name, target="tidewire", admin=True,
                     extra_args=["--mosquitto-bridge", str(conf), *kw.pop("extra_args", ())], **kw)
        self.gateways.append(gw)
        if start:
            gw.start()
        return gw

    def client(self, port: int, client_id: str = "", version: int = 4, clean: bool = True,
               **kw: Any) -> PahoClient:
        client = PahoClient(port, client_id, version=version, clean=clean, **kw)
        self.clients.append(client)
        client.connect()
        return client

    def close(self) -> None:
        for client in self.clients:
            client.close()
        for gw in self.gateways:
            gw.close()


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[Pair]:
    made = Pair(tmp_path)
    yield made
    made.close()


def block(remote_port: int, *lines: str, name: str = "b1") -> str:
    return "\n".join([f"connection {name}", f"address 127.0.0.1:{remote_port}", "restart_timeout 1", *lines]) + "\n"


def bridges(gw: Gateway) -> list[dict[str, Any]]:
    answer = httpx.get(f"http://127.0.0.1:{gw.admin_port}/api/v1/bridges",
                       headers={"Authorization": f"Bearer {gw.api_token}"}, timeout=5).json()
    data: list[dict[str, Any]] = answer["data"]
    return data


def wait_connected(gw: Gateway, name: str = "b1", timeout: float = 15.0) -> dict[str, Any]:
    found: dict[str, Any] = {}

    def connected() -> bool:
        for status in bridges(gw):
            if status["name"] == name and status["state"] == "connected":
                found.update(status)
                return True
        return False

    wait_until(connected, timeout=timeout, what=f"bridge {name} connected")
    return found


def publish_lines(port: int, topic: str, lines: list[str], qos: int = 1) -> None:
    """mosquitto_pub -l: one message per line, over one connection (returns once every PUBACK came)."""
    subprocess.run([MOSQUITTO_PUB, "-h", "127.0.0.1", "-p", str(port), "-t", topic, "-q", str(qos), "-l"],
                   input="\n".join(lines) + "\n", text=True, check=True, timeout=120)


def collect(client: PahoClient, want: set[bytes], timeout: float) -> Counter[bytes]:
    """Messages until every payload of `want` came (each counted: duplicates show above 1)."""
    got: Counter[bytes] = Counter()

    def complete() -> bool:
        while True:
            try:
                got[client.get(timeout=0.05).payload] += 1
            except Exception:
                break
        return want <= set(got)

    wait_until(complete, timeout=timeout, interval=0.0,
               what=lambda: f"{len(want - set(got))} of {len(want)} messages still missing")
    return got


def test_out_and_in_with_prefixes(pair: Pair) -> None:
    remote = pair.remote()
    local = pair.local(block(remote.port, "topic sensors/# out 1 site/ remote/site1/",
                             "topic # in 1 dev/cmd/ remote/cmd/"))
    remote_sub = pair.client(remote.port, "remote-sub")
    remote_sub.subscribe([("remote/site1/#", 1), (STATE, 1)])
    assert remote_sub.get(timeout=15).payload == b"1"  # the bridge's notification: it is up
    status = wait_connected(local)
    assert status["remote_client_id"].endswith(".b1")  # Mosquitto 2.0's default: <hostname>.<name>
    local_sub = pair.client(local.port, "local-sub")
    local_sub.subscribe([("dev/#", 1), ("site/#", 1)])
    local_pub = pair.client(local.port, "local-pub")
    local_pub.publish("site/sensors/t1", b"21.5", qos=1)
    local_pub.publish("elsewhere/t1", b"not bridged", qos=1)
    got = remote_sub.get(timeout=5)
    assert (got.topic, got.payload, got.qos) == ("remote/site1/sensors/t1", b"21.5", 1)
    remote_pub = pair.client(remote.port, "remote-pub")
    remote_pub.publish("remote/cmd/lamp", b"on", qos=1)
    remote_pub.publish("remote/other", b"not bridged in", qos=1)
    seen = [local_sub.get(timeout=5) for _ in range(2)]  # its own publish, then the command from the remote
    assert sorted((m.topic, m.payload) for m in seen) == [("dev/cmd/lamp", b"on"), ("site/sensors/t1", b"21.5")]
    # Markers after everything: what was not bridged, or would have come back, would have come before them.
    local_pub.publish("site/sensors/end", b"end", qos=1)
    assert remote_sub.get(timeout=5).payload == b"end"
    remote_pub.publish("remote/cmd/end", b"end", qos=1)
    assert [m.payload for m in (local_sub.get(timeout=5), local_sub.get(timeout=5))] == [b"end", b"end"]
    local_sub.assert_nothing(0.3)
    remote_sub.assert_nothing(0.3)
    status = next(s for s in bridges(local) if s["name"] == "b1")
    assert (status["sent"], status["acked"], status["received"], status["stored"]) == (2, 2, 2, 2)


def test_mqtt5_bridge_keeps_properties_and_never_echoes(pair: Pair) -> None:
    remote = pair.remote()
    local = pair.local(block(remote.port, "bridge_protocol_version mqttv50", "topic # both 1 a/ b/"))
    wait_connected(local)
    remote_sub = pair.client(remote.port, "remote-sub", version=5)
    remote_sub.subscribe("b/#", 1)
    local_sub = pair.client(local.port, "local-sub", version=5)
    local_sub.subscribe("a/#", 1)
    local_pub = pair.client(local.port, "local-pub", version=5)
    local_pub.publish("a/x", b"from local", qos=1, properties=v5_props(PacketTypes.PUBLISH, UserProperty=[("k", "v")]))
    got = remote_sub.get(timeout=5)
    assert (got.topic, got.payload) == ("b/x", b"from local")
    assert ["k", "v"] in [list(p) for p in got.properties.get("UserProperty", [])]
    assert local_sub.get(timeout=5).payload == b"from local"
    remote_pub = pair.client(remote.port, "remote-pub", version=5)
    remote_pub.publish("b/y", b"from remote", qos=1)
    assert remote_sub.get(timeout=5).payload == b"from remote"
    assert local_sub.get(timeout=5).payload == b"from remote"
    local_pub.publish("a/end", b"end", qos=1)  # nothing above came back over the bridge: the markers come next
    assert remote_sub.get(timeout=5).payload == b"end"
    assert local_sub.get(timeout=5).payload == b"end"
    remote_sub.assert_nothing(0.3)
    local_sub.assert_nothing(0.3)


def test_mutual_tls(pair: Pair) -> None:
    pki = TestPKI(pair.tmp / "pki")
    client_cert = pki.issue_client("bridge-1")
    remote = pair.remote(tls=TlsOptions(pki.server.certfile, pki.server.keyfile, pki.cafile,
                                        require_certificate=True))
    assert remote.tls_port is not None
    text = block(remote.tls_port, f"bridge_cafile {pki.cafile}", f"bridge_certfile {client_cert.certfile}",
                 f"bridge_keyfile {client_cert.keyfile}", "topic t/# out 1")
    local = pair.local(text)
    wait_connected(local)
    remote_sub = pair.client(remote.port, "remote-sub")
    remote_sub.subscribe("t/#", 1)
    pair.client(local.port, "local-pub").publish("t/1", b"over tls", qos=1)
    assert remote_sub.get(timeout=5).payload == b"over tls"


@pytest.mark.slow
def test_without_the_client_certificate_the_bridge_stays_down(pair: Pair) -> None:
    pki = TestPKI(pair.tmp / "pki")
    remote = pair.remote(tls=TlsOptions(pki.server.certfile, pki.server.keyfile, pki.cafile,
                                        require_certificate=True))
    assert remote.tls_port is not None
    local = pair.local(block(remote.tls_port, f"bridge_cafile {pki.cafile}", "topic t/# out 1"))
    wait_until(lambda: bridges(local)[0]["failures"] >= 2, timeout=15, what="two failed attempts")
    assert bridges(local)[0]["state"] in ("waiting", "connecting")


def test_mosquitto_documentation_block_works_unchanged(pair: Pair) -> None:
    # mosquitto.conf(5), "Example Bridge Topic Remapping", with only the address pointing at our remote.
    remote = pair.remote(conf_lines=["sys_interval 1"])
    text = "\n".join(["connection test-mosquitto-org", f"address 127.0.0.1:{remote.port}", "cleansession true",
                      "topic clients/total in 0 test/mosquitto/org/ $SYS/broker/"]) + "\n"
    local = pair.local(text)
    local_sub = pair.client(local.port, "local-sub")
    local_sub.subscribe("test/mosquitto/org/#", 0)
    got = local_sub.get(timeout=15)  # Mosquitto publishes $SYS/broker/clients/total every second
    assert got.topic == "test/mosquitto/org/clients/total" and got.payload.isdigit()


@pytest.mark.slow
def test_published_while_the_remote_is_down_all_arrive(pair: Pair) -> None:
    remote = pair.remote()
    local = pair.local(block(remote.port, "topic q/# out 1"))
    wait_connected(local)
    remote_sub = pair.client(remote.port, "remote-sub", clean=False)
    remote_sub.subscribe("q/#", 1)
    remote_sub.disconnect()
    remote.stop()  # SIGTERM: Mosquitto saves the subscriber's session
    payloads = [f"m{i}" for i in range(10_000)]
    publish_lines(local.port, "q/a", payloads)  # acknowledged by Tidewire while the remote is down
    waiting = bridges(local)[0]
    assert waiting["state"] != "connected" and waiting["sent"] == 0
    wait_until(lambda: bridges(local)[0]["lag_messages"] == 10_000, what="a lag of 10,000")  # measured each 1 s
    remote.start()
    remote_sub.connect(clean_start=False)
    got = collect(remote_sub, {p.encode() for p in payloads}, timeout=60)
    assert sum(got.values()) - len(got) == 0  # no duplicates without a failure
    wait_until(lambda: bridges(local)[0]["lag_messages"] == 0, what="lag back to 0")


@pytest.mark.slow
def test_link_cut_during_the_resend_then_the_node_killed(pair: Pair) -> None:
    """10,000 published while the remote is down; during the resend the remote stops (the link is cut), then the
    Tidewire node is killed (-9) and restarted: every message arrives, duplicates counted and bounded."""
    remote = pair.remote()
    local = pair.local(block(remote.port, "topic q/# out 1"))
    wait_connected(local)
    remote_sub = pair.client(remote.port, "remote-sub", clean=False)
    remote_sub.subscribe("q/#", 1)
    remote_sub.disconnect()
    remote.stop()
    payloads = [f"m{i}" for i in range(10_000)]
    publish_lines(local.port, "q/a", payloads)
    remote.start()
    wait_until(lambda: bridges(local)[0]["acked"] >= 2_000, timeout=30, what="a fifth acknowledged")
    remote.stop()  # the link is cut in the middle of the resend
    local.kill9()
    remote.start()
    local.start()
    remote_sub.connect(clean_start=False)
    got = collect(remote_sub, {p.encode() for p in payloads}, timeout=90)
    duplicates = sum(got.values()) - len(got)
    # At most one in-flight window (max_inflight, 100) per interruption: the cut and the kill.
    assert duplicates <= 200, f"{duplicates} duplicates"


def test_no_loop_between_two_tidewire_nodes_bridged_both_ways(pair: Pair) -> None:
    far = pair.remote("far", target="tidewire")
    near = pair.local(block(far.port, "topic # both 1"))
    wait_connected(near)
    near_sub = pair.client(near.port, "near-sub")
    near_sub.subscribe("t/#", 1)
    far_sub = pair.client(far.port, "far-sub")
    far_sub.subscribe("t/#", 1)
    pair.client(near.port, "near-pub").publish("t/near", b"n", qos=1)
    pair.client(far.port, "far-pub").publish("t/far", b"f", qos=1)
    want = {b"n", b"f"}
    near_got = collect(near_sub, want, timeout=10)
    far_got = collect(far_sub, want, timeout=10)
    pair.client(near.port, "near-end").publish("t/end", b"end", qos=1)
    collect(near_sub, {b"end"}, timeout=5)
    collect(far_sub, {b"end"}, timeout=5)
    near_sub.assert_nothing(0.5)
    far_sub.assert_nothing(0.5)
    assert near_got == Counter(want) and far_got == Counter(want)


def test_a_rule_sends_its_results_over_a_bridge(pair: Pair) -> None:
    remote = pair.remote()
    rules = [{"name": "hot", "sql": 'SELECT payload.temp AS t FROM "sensors/#" WHERE payload.temp > 30',
              "action": {"type": "bridge", "bridge": "b1", "topic": "remote/site1/alerts/${clientid}"}}]
    local = pair.local(block(remote.port, "topic alerts/# out 1 site/ remote/site1/"),
                       extra_args=["--rules", json.dumps(rules)])
    wait_connected(local)
    remote_sub = pair.client(remote.port, "remote-sub")
    remote_sub.subscribe("remote/site1/#", 1)
    local_pub = pair.client(local.port, "dev1")
    local_pub.publish("sensors/a", json.dumps({"temp": 20}), qos=1)
    local_pub.publish("sensors/a", json.dumps({"temp": 40}), qos=1)
    got = remote_sub.get(timeout=5)  # the rule published it here as site/alerts/dev1; the bridge sent it out
    assert (got.topic, json.loads(got.payload)) == ("remote/site1/alerts/dev1", {"t": 40})
    remote_sub.assert_nothing(0.3)
