"""A real Mosquitto 2.0.11 bridging INTO Tidewire (`topic t/# both 1`), checked with paho clients on both brokers:
each message crosses once each way at QoS 1, none echoes back, retained messages stay retained on the other side,
and what the bridge publishes is stored as protocol `bridge` (the admin API, the metrics, the log itself).

Variants: Mosquitto's default `try_private true` (MQTT 3.1.1, level 0x84, and 3.1, 0x83), an MQTT 5 bridge (no
level bit: Mosquitto sends no marker, so Tidewire sees a client, but its own subscription options stop the echo),
`try_private false` (a plain client: Mosquitto's subscribers get what they publish twice and retained flags are
lost on the way back, as with any broker that does not know it is being bridged), and `accept_bridges false`
(CONNACK 1, then Mosquitto connects again as a plain client). With `TIDEWIRE_TEST_TARGET=mosquitto` the broker
bridged into is a Mosquitto too: the reference for everything but the Tidewire-only checks.

The bridge keeps Mosquitto's other defaults: a persistent session (`cleansession false`) and notifications (a will
and a retained "1" on `$SYS/broker/connection/<its client id>/state`, the one `$SYS` topic a client may write).
"""

from __future__ import annotations

import asyncio
import itertools
import queue
from collections import Counter
from dataclasses import dataclass, field

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.conftest import STORE, TARGET, Gateway, GatewayFactory, PahoClient, PahoFactory, Received
from tests.integration.rawconnect import raw_connect
from tests.waiting import wait_until
from tidewire.store.embedded.engine import EmbeddedStore
from tidewire.store.log_reader import LogReader

BRIDGE_ID = "mosq-bridge"  # the bridge's client id on Tidewire


@dataclass(frozen=True)
class Variant:
    version: str  # bridge_protocol_version
    try_private: bool = True
    accept_bridges: bool = True
    marked: bool = True  # Tidewire takes the connection for a bridge
    echo: bool = False  # what Mosquitto sends comes back to it once (Tidewire does not know to hold it back)

    def __str__(self) -> str:
        return f"{self.version}-private-{self.try_private}-accept-{self.accept_bridges}".lower()


# Mosquitto's default in `make test`; the other variants in `make test-slow` (two brokers each: seconds apiece).
VARIANTS = [
    Variant("mqttv311"),
    pytest.param(Variant("mqttv31"), marks=pytest.mark.slow),
    pytest.param(Variant("mqttv50", marked=False), marks=pytest.mark.slow),
    pytest.param(Variant("mqttv311", try_private=False, marked=False, echo=True), marks=pytest.mark.slow),
    pytest.param(Variant("mqttv311", accept_bridges=False, marked=False, echo=True),
                 marks=[pytest.mark.tidewire_only, pytest.mark.slow]),  # a Mosquitto has no such setting
]


def bridge_conf(port: int, variant: Variant) -> list[str]:
    """Mosquitto's `connection` block to the broker on `port`. `restart_timeout 1 1`: a second between attempts
    (one number alone leaves 2.0.11's backoff, from 5 s, in place)."""
    return ["connection tidewire", f"address 127.0.0.1:{port}", f"remote_clientid {BRIDGE_ID}",
            f"bridge_protocol_version {variant.version}", f"try_private {str(variant.try_private).lower()}",
            "restart_timeout 1 1", "topic t/# both 1"]


@dataclass
class Side:
    """A broker's subscriber of `t/#` (QoS 1) and its publisher."""

    broker: Gateway
    sub: PahoClient
    pub: PahoClient
    got: list[Received] = field(default_factory=list)

    def pump(self) -> list[Received]:
        while True:
            try:
                self.got.append(self.sub.messages.get_nowait())
            except queue.Empty:
                return self.got

    def has(self, topic: str) -> bool:
        return any(m.topic == topic for m in self.pump())

    def counts(self) -> Counter[str]:
        """Each message topic received, without the probes and markers."""
        return Counter(m.topic for m in self.pump() if not m.topic.startswith(("t/probe/", "t/marker/")))


def side(broker: Gateway, paho_factory: PahoFactory, name: str) -> Side:
    sub = paho_factory(broker.port, f"{name}-sub", version=5)
    sub.connect()
    assert sub.subscribe("t/#", 1) == [1]
    pub = paho_factory(broker.port, f"{name}-pub", version=4)
    pub.connect()
    return Side(broker, sub, pub)


def cross(source: Side, target: Side, topic: str) -> None:
    """Publish `topic` (QoS 1) at `source` and wait until `target`'s subscriber has it."""
    source.pub.publish(topic, b"marker", qos=1)
    wait_until(lambda: target.has(topic), timeout=5, what=f"{topic} across the bridge")


def linked(a: Side, b: Side) -> None:
    """Until a probe crosses each way: the bridge is connected and subscribed on both brokers (one probe a poll;
    the bridge may still be connecting, and what it is not subscribed to yet is not queued for it)."""
    probes = itertools.count()
    for source, target in ((a, b), (b, a)):
        sent: list[str] = []

        def probe_crossed(source: Side = source, target: Side = target, sent: list[str] = sent) -> bool:
            sent.append(f"t/probe/{next(probes)}")
            source.pub.publish(sent[-1], b"", qos=0, wait=False)
            return any(target.has(topic) for topic in sent)

        wait_until(probe_crossed, timeout=8, what="a probe across the bridge", interval=0.1)


def retained_seen(at: Side, paho_factory: PahoFactory, prefix: str) -> list[Received]:
    """What a new subscriber of `<prefix>#` at `at` is sent, up to a marker published there after its SUBACK."""
    late = paho_factory(at.broker.port, f"late-{prefix.replace('/', '-')}", version=5)
    late.connect()
    late.subscribe(f"{prefix}#", 1)
    at.pub.publish(f"{prefix}end", b"", qos=1)
    seen = [late.get(5)]
    while seen[-1].topic != f"{prefix}end":
        seen.append(late.get(5))
    late.disconnect()
    return seen[:-1]


def metrics(broker: Gateway) -> dict[tuple[str, str], float]:
    text = httpx.get(f"http://127.0.0.1:{broker.admin_port}/metrics", timeout=5.0).text
    return {(s.name, s.labels.get("protocol", "")): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


async def stored_protocols(broker: Gateway) -> Counter[tuple[str, str]]:
    """(publisher, protocol) of every message in a stopped Tidewire's log, through the lake's reader."""
    store = EmbeddedStore(broker.data_dir)
    await store.open()
    try:
        found: Counter[tuple[str, str]] = Counter()
        for partition in range(store.log_partitions()):
            reader = LogReader(store, partition, 0)
            while True:
                before = reader.position
                batch = await reader.read(1000)
                if not batch and reader.position == before:
                    break
                found.update((record.client_id, record.protocol) for record in batch)
        return found
    finally:
        await store.close()


@pytest.mark.parametrize("variant", VARIANTS, ids=str)
def test_mosquitto_bridges_into_tidewire(variant: Variant, gateway_factory: GatewayFactory,
                                         paho_factory: PahoFactory) -> None:
    tidewire = TARGET == "tidewire"
    tw = gateway_factory(admin=tidewire, env={"TIDEWIRE_ACCEPT_BRIDGES": str(variant.accept_bridges).lower()})
    mosq = gateway_factory(target="mosquitto", conf_lines=bridge_conf(tw.port, variant))
    far, near = side(tw, paho_factory, "tw"), side(mosq, paho_factory, "mosq")
    linked(near, far)

    for s, name in ((near, "m"), (far, "w")):
        assert s.pub.publish(f"t/{name}/1", b"one", qos=1) == 0
        assert s.pub.publish(f"t/{name}/retained", b"kept", qos=1, retain=True) == 0
    # Whatever Tidewire sends the bridge back comes before a marker that crosses after it each way.
    cross(near, far, "t/marker/1")
    cross(far, near, "t/marker/2")
    cross(near, far, "t/marker/3")

    sent = Counter(["t/m/1", "t/m/retained", "t/w/1", "t/w/retained"])
    assert far.counts() == sent
    assert near.counts() == sent + (Counter(["t/m/1", "t/m/retained"]) if variant.echo else Counter())
    assert {m.qos for m in far.got + near.got if not m.topic.startswith("t/probe/")} == {1}  # QoS 0 probes
    # Mosquitto's bridge keeps retain flags on what it forwards (its own subscription is retain-as-published)...
    assert [(m.topic, m.retain) for m in retained_seen(far, paho_factory, "t/m/")] == [("t/m/retained", True)]
    # ... Tidewire too for a bridge it knows (or one that asked, MQTT 5); a plain client is sent a live message
    # without the flag, so Mosquitto does not keep it.
    kept = [(m.topic, m.retain) for m in retained_seen(near, paho_factory, "t/w/")]
    assert kept == ([] if variant.echo else [("t/w/retained", True)])
    cross(near, far, "t/marker/4")  # the last the bridge publishes: after it, Tidewire's counts stay as they are

    if not tidewire:
        return
    token = {"Authorization": f"Bearer {tw.api_token}"}
    client = httpx.get(f"http://127.0.0.1:{tw.admin_port}/api/v1/clients/{BRIDGE_ID}", headers=token, timeout=5.0)
    assert client.status_code == 200, client.text
    view = client.json()
    assert view["bridge"] is variant.marked
    assert view["proto_ver"] == (5 if variant.version == "mqttv50" else 4)
    [sub] = view["subscriptions_list"]
    assert (sub["topic"], sub["qos"], sub["no_local"], sub["retain_as_published"]) == (
        "t/#", 1, not variant.echo, not variant.echo)
    counted = metrics(tw)
    received_as_bridge = counted.get(("tidewire_messages_received_total", "bridge"), 0.0)

    tw.stop()
    if STORE != "embedded":
        return
    stored = asyncio.run(stored_protocols(tw))
    protocol = "bridge" if variant.marked else "mqtt"
    # t/m/1, t/m/retained, t/w/end, markers 1, 3 and 4, a probe at least; nobody else's is "bridge"
    assert stored[(BRIDGE_ID, protocol)] >= 7
    assert stored[(BRIDGE_ID, "mqtt" if variant.marked else "bridge")] == 0
    assert {proto for (publisher, proto) in stored if publisher != BRIDGE_ID} == {"mqtt"}
    # Its will ("0" on its notification topic) is published as Tidewire stops, after the metrics were read.
    assert stored[(BRIDGE_ID, "bridge")] == (received_as_bridge + 1 if variant.marked else 0)


@pytest.mark.parametrize("accept", [True, pytest.param(False, marks=pytest.mark.tidewire_only)])
def test_a_raw_bridge_connect_gets_connack_0_or_1(accept: bool, gateway_factory: GatewayFactory) -> None:
    tw = gateway_factory(env={"TIDEWIRE_ACCEPT_BRIDGES": str(accept).lower()})
    answer = raw_connect(tw.port, 0x84, "raw-bridge")
    assert (answer.code, answer.closed) == ((0, False) if accept else (1, True))
    assert raw_connect(tw.port, 4, "raw-client").code == 0
