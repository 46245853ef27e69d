"""The node's lake events through a real gateway (`--lake`, events only: no log bridge, no Spark), read with
pyarrow: an AMQP consumer's (pika) and a RocketMQ consumer's (rocketmq-python-client) deliveries and acks land
in `<lake>/events` beside an MQTT client's, under their own ids, queue and consumer tag; and a buffer too small
for a flood of deliveries loses events, every one of them counted (written + dropped = produced)."""

from __future__ import annotations

import contextlib
import re
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pika
import pyarrow.dataset as ds
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.gateway.protocols.rocketmq.conftest import Clients
from tests.integration.conftest import GatewayFactory, PahoFactory
from tests.waiting import wait_until
from tidewire.pipeline.lake.schema import EVENTS, EVENTS_SCHEMA

pytestmark = pytest.mark.slow  # a gateway process each, waits on its event flushes

N = 12  # messages published to a/...
FLOOD = 3000  # QoS 1 deliveries against a 100-event buffer
EXPORTER = {"TIDEWIRE_LAKE_BRIDGE": "false", "TIDEWIRE_LAKE_FLUSH_SECONDS": "0.2"}


@pytest.fixture
def clients() -> Any:
    made = Clients()
    yield made
    made.close()


def lake_events(lake: Path) -> list[dict[str, Any]]:
    path = lake / EVENTS
    if not any(path.rglob("*.parquet")):  # the directory exists before its first committed file
        return []
    return ds.dataset(path, schema=EVENTS_SCHEMA, format="parquet", partitioning="hive").to_table().to_pylist()


def lake_metrics(port: int) -> dict[str, float]:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5.0).text
    return {s.name + "".join(f"{{{v}}}" for v in s.labels.values()): s.value
            for family in text_string_to_metric_families(text) if family.name.startswith("tidewire_lake_events")
            for s in family.samples}


def test_amqp_and_rocketmq_deliveries_and_acks_beside_mqtt(gateway_factory: GatewayFactory,
                                                            paho_factory: PahoFactory, clients: Clients,
                                                            tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    gw = gateway_factory(amqp=True, rocketmq=True, env={"TIDEWIRE_LAKE_DIR": str(lake), **EXPORTER,
                                                        "TIDEWIRE_SYS_EVENTS": "false"})
    watcher = paho_factory(gw.port, "watcher")
    watcher.connect()
    watcher.subscribe("a/#", qos=1)
    amqp = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", gw.amqp_port, connection_attempts=1,
                                                             socket_timeout=5))
    channel = amqp.channel()
    channel.queue_declare("backend-q", durable=True)
    channel.queue_bind("backend-q", "amq.topic", "a.#")
    amqp_id = re.findall(r"event=amqp\.connected conn=(\S+)", gw.stderr)[-1]
    rmq = clients.consumer(gw, "rgroup", "a")

    device = paho_factory(gw.port, "device-1")
    device.connect()
    for i in range(N):
        device.publish(f"a/x/{i}", b"%d" % i, qos=1)
    assert len(watcher.expect(N, timeout=10)) == N
    got: list[bytes] = []

    def on_message(ch: Any, method: Any, _props: Any, body: bytes) -> None:
        ch.basic_ack(method.delivery_tag)
        got.append(body)

    channel.basic_consume("backend-q", on_message, consumer_tag="ctag-1")
    deadline = time.monotonic() + 10
    while len(got) < N and time.monotonic() < deadline:
        amqp.process_data_events(time_limit=0.2)
    channel.basic_cancel("ctag-1")
    rmq_got: list[Any] = []
    deadline = time.monotonic() + 15
    while len(rmq_got) < N and time.monotonic() < deadline:
        for m in rmq.receive(16, 30):
            rmq.ack(m)
            rmq_got.append(m)
    assert len(got) == N and len(rmq_got) == N

    def by(protocol: str, event: str) -> list[dict[str, Any]]:
        return [r for r in lake_events(lake) if r["protocol"] == protocol and r["event"] == event]

    def complete() -> bool:
        return all(len(by(p, e)) >= N for p in ("mqtt", "amqp", "rocketmq") for e in ("delivered", "acked"))

    with contextlib.suppress(AssertionError):  # what is missing is counted below
        wait_until(complete, timeout=10, what="every protocol's deliveries and acks in the lake")
    positions = {r["position"] for r in by("mqtt", "delivered") if r["client_id"] == "watcher"}
    assert len(positions) == N
    for protocol, client_id, group in (("mqtt", "watcher", None), ("amqp", amqp_id, "backend-q"),
                                       ("rocketmq", rmq.client_id, "rgroup")):
        for event in ("delivered", "acked"):
            rows = by(protocol, event)
            seen = Counter(r["position"] for r in rows)
            missing, twice = positions - set(seen), [p for p, n in seen.items() if n > 1]
            assert not missing and not twice and set(seen) == positions, (protocol, event, missing, twice)
            assert {(r["client_id"], r["consumer_group"]) for r in rows} == {(client_id, group)}, (protocol, event)
            assert {r["topic"] for r in rows} == ({"a"} if (protocol, event) == ("rocketmq", "acked")
                                                  else {f"a/x/{i}" for i in range(N)})
            assert not any(r["dup"] for r in rows)
    assert {r["consumer_tag"] for r in by("amqp", "delivered") + by("amqp", "acked")} == {"ctag-1"}
    assert {r["consumer_tag"] for r in by("rocketmq", "delivered")} == {None}
    amqp.close()


def test_a_full_buffer_counts_every_event_it_drops(gateway_factory: GatewayFactory, paho_factory: PahoFactory,
                                                   tmp_path: Path) -> None:
    """A flood of QoS 1 deliveries (a delivered and an acked event each) against a 100-event buffer: the lake
    holds what was kept, tidewire_lake_events_dropped_total{reason="buffer_full"} counts the rest, exactly, and
    $SYS shows the same count."""
    lake = tmp_path / "lake"
    gw = gateway_factory(admin=True, env={"TIDEWIRE_LAKE_DIR": str(lake), "TIDEWIRE_LAKE_EVENTS_BUFFER": "100",
                                          "TIDEWIRE_SYS_INTERVAL": "0.2", **EXPORTER})
    sub = paho_factory(gw.port, "sub")
    sub.connect()
    sub.subscribe("f/#", qos=1)
    pub = paho_factory(gw.port, "pub")
    pub.connect()
    for i in range(FLOOD):
        pub.publish(f"f/{i % 10}", b"x" * 20, qos=1, wait=False)
    got = sub.expect(FLOOD, timeout=60)
    assert not any(m.dup for m in got)
    produced = 2 + 1 + 2 * FLOOD  # connected x2, subscribed, then delivered + acked per message

    def settled() -> bool:
        m = lake_metrics(gw.admin_port)
        return m.get("tidewire_lake_events_buffered", -1) == 0 and len(lake_events(lake)) == m[
            "tidewire_lake_events_recorded_total"] and m["tidewire_lake_events_recorded_total"] + m[
            "tidewire_lake_events_dropped_total{buffer_full}"] == produced

    wait_until(settled, timeout=15, what="every acked delivery's events recorded or dropped, and flushed")
    m = lake_metrics(gw.admin_port)
    written = len(lake_events(lake))
    dropped = m["tidewire_lake_events_dropped_total{buffer_full}"]
    print(f"flood of {FLOOD} QoS 1 deliveries, buffer 100: produced {produced}, written {written}, "
          f"dropped {dropped:.0f}")
    assert dropped > 0  # the flood outran the exporter's 50 ms polls
    assert written + dropped == produced and m["tidewire_lake_events_dropped_total{write_failed}"] == 0
    watcher = paho_factory(gw.port, "sys-watcher")  # (its own events come after the count: none dropped)
    watcher.connect()
    watcher.subscribe("$SYS/brokers/+/stats/lake/events/dropped/buffer_full")
    deadline = time.monotonic() + 5
    while (value := int(watcher.get(timeout=5).payload)) != dropped and time.monotonic() < deadline:
        pass
    assert value == dropped


def test_a_graceful_stop_writes_the_events_of_its_own_disconnects(gateway_factory: GatewayFactory,
                                                                   paho_factory: PahoFactory, tmp_path: Path) -> None:
    """A stopping node disconnects its MQTT clients after the backends stopped: their `disconnected` events
    (and the acks of the drain) still reach the lake. Counts: one disconnected per client, none missing."""
    lake = tmp_path / "lake"
    gw = gateway_factory(env={"TIDEWIRE_LAKE_DIR": str(lake), **EXPORTER, "TIDEWIRE_SYS_EVENTS": "false"})
    names = [f"stay-{i}" for i in range(3)]
    for name in names:
        paho_factory(gw.port, name).connect()
    gw.stop()
    rows = lake_events(lake)
    disconnected = Counter(r["client_id"] for r in rows if r["event"] == "disconnected")
    connected = Counter(r["client_id"] for r in rows if r["event"] == "connected")
    assert connected == Counter(names)
    assert disconnected == Counter(names), f"missing: {sorted(set(names) - set(disconnected))}"
