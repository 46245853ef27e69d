"""Prometheus metrics (`admin.metrics`) against real nodes and real clients (paho, a raw MQTT socket, pika): the
counters move by exactly what was sent (messages and bytes in per protocol, messages and bytes out per
subscriber, deliveries), retries and drops by reason are counted, the store histograms count batches, auth
answers are counted by source (a wrong password as a failure of "file"), top topics are the ones published,
metrics off keeps nothing extra, and `promtool check metrics` accepts the scraped text.

Nodes run in this process (the collector read directly) and as a real gateway process with its admin port
(`/metrics` over HTTP, no token)."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pika
import pytest
from paho.mqtt.packettypes import PacketTypes
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.conftest import Gateway, PahoClient, v5_props, write_password_file
from tests.integration.rawmqtt import RawClient
from tests.waiting import until, wait_until
from tidewire.admin.metrics import NodeCollector, node_registry, top_topics, version
from tidewire.gateway.config import Settings
from tidewire.gateway.node import Node
from tidewire.gateway.protocols.mqtt.codec import Puback, Publish, Suback, Subscribe, SubscriptionRequest
from tidewire.gateway.security import Security
from tidewire.gateway.server import open_listeners
from tidewire.lookup.base import InProcessLookup
from tidewire.notify.base import LocalNotifier
from tidewire.store.embedded.engine import EmbeddedStore

PROMTOOL = Path("/usr/bin/promtool")
TOPIC = "m/t"
PAYLOAD = b"0123456789"
# A QoS 1 PUBLISH of TOPIC with PAYLOAD to an MQTT 5 client: fixed header 2, topic 2+3, packet id 2, properties 1
PUBLISH_BYTES_V5 = 2 + 2 + len(TOPIC) + 2 + 1 + len(PAYLOAD)
USERS = {"alice": "right-horse-battery"}
RETRY_INTERVAL = 1.0  # s before an unacknowledged 3.1.1 QoS 1 delivery is sent again

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def promtool_check(text: str) -> None:
    if not PROMTOOL.exists():
        pytest.skip(f"needs {PROMTOOL} (Debian package prometheus)")
    done = subprocess.run([str(PROMTOOL), "check", "metrics"], input=text.encode(), capture_output=True, timeout=20)
    assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()


@contextlib.asynccontextmanager
async def running_node(tmp_path: Path, **options: Any) -> AsyncIterator[tuple[Node, int]]:
    """A node on a real embedded store (fsync per batch), MQTT on a free port."""
    settings = Settings(data_dir=tmp_path, port=0, node_id="m1", sys_events=False, sys_interval=3600, **options)
    store = EmbeddedStore(tmp_path / "data", fsync="batch")
    await store.open()
    security = Security.build(settings)
    lookup = InProcessLookup()
    gw = Node(settings, store, lookup, LocalNotifier(lookup), security.authorizer, security.enhanced, security.chain)
    await gw.start()
    servers = await open_listeners(gw, None)
    try:
        yield gw, servers[0].sockets[0].getsockname()[1]  # type: ignore[attr-defined]
    finally:
        for server in servers:
            server.close()
        await gw.stop()
        await security.close()
        await store.close()


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[tuple[Node, int]]:
    """A node whose clients authenticate with a password file."""
    async with running_node(tmp_path, password_file=write_password_file(tmp_path / "passwd", USERS)) as found:
        yield found


def _traffic(port: int, subscribers: int, messages: int) -> list[PahoClient]:
    """`subscribers` MQTT 5 clients on TOPIC (QoS 1), one 3.1.1 publisher sending `messages` QoS 1 messages;
    returns every client once each subscriber got them all."""
    subs = []
    for i in range(subscribers):
        sub = PahoClient(port, f"sub{i}", version=5, username="alice", password=USERS["alice"])
        sub.connect()
        sub.subscribe(TOPIC, 1)
        subs.append(sub)
    pub = PahoClient(port, "pub", version=4, username="alice", password=USERS["alice"])
    pub.connect()
    for _ in range(messages):
        pub.publish(TOPIC, PAYLOAD, qos=1)
    for sub in subs:
        sub.expect(messages)
    return [*subs, pub]


def _bad_password(port: int) -> None:
    bad = PahoClient(port, "intruder", version=5, username="alice", password="wrong")
    try:
        assert bad.connect(check=False).reason_code == 0x86  # bad user name or password
    finally:
        bad.disconnect()


def _deltas(before: Samples, after: Samples, subscribers: int, messages: int) -> None:
    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("tidewire_messages_received_total", protocol="mqtt") == messages
    assert delta("tidewire_bytes_received_total", protocol="mqtt") == messages * len(PAYLOAD)
    assert delta("tidewire_messages_sent_total", protocol="mqtt") == messages * subscribers
    assert delta("tidewire_bytes_sent_total", protocol="mqtt") == messages * subscribers * PUBLISH_BYTES_V5
    assert delta("tidewire_deliveries_total") == messages * subscribers
    assert delta("tidewire_retries_total") == 0
    assert delta("tidewire_messages_received_total", protocol="amqp") == 0
    assert delta("tidewire_auth_total", source="file", result="success") == subscribers + 1
    assert delta("tidewire_auth_total", source="file", result="failure") == 1
    assert delta("tidewire_store_append_seconds_count") >= 1
    assert delta("tidewire_store_fsync_seconds_count") >= 1
    assert value(after, "tidewire_store_append_seconds_bucket", le="+Inf") == value(
        after, "tidewire_store_append_seconds_count")
    assert value(after, "tidewire_sessions_online") == subscribers + 1
    assert value(after, "tidewire_connections", listener="mqtt", protocol="mqtt") == subscribers + 1
    assert value(after, "tidewire_subscriptions") == subscribers
    assert value(after, "tidewire_inflight") == 0  # every delivery acknowledged
    assert value(after, "tidewire_draining") == 0


async def test_collector_counts_exactly_what_was_sent(node: tuple[Node, int]) -> None:
    gw, port = node
    registry = node_registry(NodeCollector(gw))
    before = parse(generate_latest(registry).decode())
    clients = await asyncio.to_thread(_traffic, port, 3, 5)
    await asyncio.to_thread(_bad_password, port)
    await until(lambda: not any(c.session is not None and c.session.inflight for c in gw.connections.values()),
                timeout=2.0, what="the subscribers' last PUBACKs")
    text = generate_latest(registry).decode()
    after = parse(text)
    try:
        _deltas(before, after, 3, 5)
        assert value(after, "tidewire_info", node_id="m1", version=version()) == 1
        assert value(after, "tidewire_cache_hits_total") > 0  # every subscriber pull answered from the cache
        assert value(after, "tidewire_notify_events_total", kind="sent") >= 1
        assert value(after, "tidewire_cluster_members") == 1
        assert value(after, "process_resident_memory_bytes") > 0
        assert top_topics(gw, 10)[0] == (TOPIC, 5)
        await asyncio.to_thread(promtool_check, text)
    finally:
        for client in clients:
            await asyncio.to_thread(client.disconnect)


async def test_metrics_off_keeps_nothing_extra(node: tuple[Node, int]) -> None:
    gw, port = node
    gw.counters.enabled = gw.cache.metrics = False  # what TIDEWIRE_METRICS=false sets at start
    # (what the node read at its start, before the flag went off here: its delayed publishes' group)
    started = value(parse(generate_latest(node_registry(NodeCollector(gw))).decode()), "tidewire_cache_hits_total")
    clients = await asyncio.to_thread(_traffic, port, 2, 3)
    try:
        samples = parse(generate_latest(node_registry(NodeCollector(gw))).decode())
        assert value(samples, "tidewire_store_append_seconds_count") == 0
        assert value(samples, "tidewire_cache_hits_total") == started
        assert top_topics(gw, 10) == []
        # what `$SYS` stats show is kept whatever the setting
        assert value(samples, "tidewire_messages_received_total", protocol="mqtt") == 3
        assert value(samples, "tidewire_messages_sent_total", protocol="mqtt") == 6
    finally:
        for client in clients:
            await asyncio.to_thread(client.disconnect)


def _retries_and_drops(port: int) -> None:
    """A 3.1.1 subscriber that acknowledges late gets its QoS 1 message again (retry timer); an MQTT 5 one
    away past a message's expiry and one whose Maximum Packet Size is too small get nothing (dropped)."""
    raw = RawClient(port, level=4)
    tiny = PahoClient(port, "tiny", version=5)
    away = PahoClient(port, "away", version=5, clean=False)
    pub = PahoClient(port, "pub", version=5)
    try:
        raw.connect("stubborn")
        raw.send(Subscribe(packet_id=1, subscriptions=[SubscriptionRequest("r/t", 1)]))
        raw.expect(Suback)
        tiny.connect(properties=v5_props(PacketTypes.CONNECT, MaximumPacketSize=64))
        tiny.subscribe("big/t", 1)
        away.connect(session_expiry=60)
        away.subscribe("e/t", 1)
        away.disconnect()
        pub.connect()
        pub.publish("e/t", PAYLOAD, qos=1, properties=v5_props(PacketTypes.PUBLISH, MessageExpiryInterval=1))
        expired_at = time.monotonic() + 1.05
        pub.publish("big/t", b"x" * 100, qos=1)
        pub.publish("r/t", PAYLOAD, qos=1)
        first = raw.expect(Publish)
        again = raw.expect(Publish, timeout=RETRY_INTERVAL + 2)
        raw.send(Puback(again.packet_id))  # now acknowledged: no third send
        assert not first.dup and again.dup and again.packet_id == first.packet_id
        time.sleep(max(0.0, expired_at - time.monotonic()))  # the behaviour under test: past the message's expiry
        away.connect(clean_start=False, session_expiry=60)
        away.assert_nothing(0.3)
        tiny.assert_nothing(0.0)
    finally:
        raw.close()
        for client in (tiny, away, pub):
            client.disconnect()


async def test_retries_and_drops_by_reason(tmp_path: Path) -> None:
    async with running_node(tmp_path, retry_interval=RETRY_INTERVAL) as (gw, port):
        await asyncio.to_thread(_retries_and_drops, port)
        samples = parse(generate_latest(node_registry(NodeCollector(gw))).decode())
    assert value(samples, "tidewire_retries_total") == 1
    assert value(samples, "tidewire_deliveries_total") == 1  # the first send; the other messages were dropped
    assert value(samples, "tidewire_messages_sent_total", protocol="mqtt") == 2
    assert value(samples, "tidewire_dropped_total", reason="expired") == 1
    assert value(samples, "tidewire_dropped_total", reason="too_large") == 1
    assert value(samples, "tidewire_dropped_total", reason="store_unavailable") == 0


def _scrape(gw: Gateway) -> tuple[str, str]:
    answer = httpx.get(f"http://127.0.0.1:{gw.admin_port}/metrics", timeout=5.0)
    assert answer.status_code == 200, answer.text
    return answer.text, answer.headers["content-type"]


def _settled(gw: Gateway) -> str:
    """The scrape once every delivery is acknowledged (the subscribers' last PUBACKs are on their way)."""
    last = [""]

    def acknowledged() -> bool:
        last[0] = _scrape(gw)[0]
        return value(parse(last[0]), "tidewire_inflight") == 0

    wait_until(acknowledged, timeout=3.0, what="every delivery acknowledged (tidewire_inflight 0)")
    return last[0]


def _amqp_publish(port: int, routing_key: str, body: bytes) -> None:
    """One durable publish with pika, confirmed (so stored) before this returns."""
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, credentials=pika.PlainCredentials(
        "alice", USERS["alice"])))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.basic_publish("amq.topic", routing_key, body, pika.BasicProperties(delivery_mode=2))
    finally:
        connection.close()


def _amqp_round_trip(port: int, routing_key: str, body: bytes) -> bytes | None:
    """A queue bound to `routing_key`, one confirmed publish to it, and the consumer's delivery (acked)."""
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, credentials=pika.PlainCredentials(
        "alice", USERS["alice"])))
    try:
        channel = connection.channel()
        channel.queue_declare("metrics-q", durable=True)
        channel.queue_bind("metrics-q", "amq.topic", routing_key)
        channel.confirm_delivery()
        channel.basic_publish("amq.topic", routing_key, body, pika.BasicProperties(delivery_mode=2))
        for method, _props, got in channel.consume("metrics-q", inactivity_timeout=5):
            if method is not None:
                channel.basic_ack(method.delivery_tag)
            return got
        return None
    finally:
        connection.close()


def test_gateway_metrics_endpoint(tmp_path: Path) -> None:
    gw = Gateway(tmp_path, admin=True, amqp=True, password_file=write_password_file(tmp_path / "passwd", USERS),
                 env={"TIDEWIRE_SYS_INTERVAL": "3600"})
    gw.start()
    clients: list[PahoClient] = []
    try:
        before, content_type = _scrape(gw)
        assert content_type == CONTENT_TYPE_LATEST
        clients = _traffic(gw.port, 2, 4)
        _bad_password(gw.port)
        text = _settled(gw)
        _deltas(parse(before), parse(text), 2, 4)
        samples = parse(text)
        assert value(samples, "tidewire_cluster_members") == 1
        assert value(samples, "tidewire_connections", listener="amqp", protocol="amqp") == 0
        assert any(name == "process_cpu_seconds_total" for name, _ in samples)
        _amqp_publish(gw.amqp_port, "elsewhere.t", b"from-amqp")
        after = parse(_scrape(gw)[0])
        assert value(after, "tidewire_messages_received_total", protocol="amqp") == 1
        assert value(after, "tidewire_bytes_received_total", protocol="amqp") == len(b"from-amqp")
        assert value(after, "tidewire_auth_total", source="file", result="success") == value(
            samples, "tidewire_auth_total", source="file", result="success") + 1  # SASL PLAIN, same chain
        assert value(after, "tidewire_messages_received_total", protocol="mqtt") == value(
            samples, "tidewire_messages_received_total", protocol="mqtt")
        assert _amqp_round_trip(gw.amqp_port, "consumed.t", b"to-amqp") == b"to-amqp"
        consumed = parse(_scrape(gw)[0])
        assert value(consumed, "tidewire_messages_sent_total", protocol="amqp") == 1
        assert value(consumed, "tidewire_bytes_sent_total", protocol="amqp") == len(b"to-amqp")
        promtool_check(text)
    finally:
        for client in clients:
            client.disconnect()
        gw.close()
