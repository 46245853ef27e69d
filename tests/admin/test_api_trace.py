"""Tracing, slow subscribers and per-client counters over the admin API (admin/api_trace.py), with a real node
and real paho clients: a client trace records CONNECT … PINGREQ with timings and stays bounded, a topic trace sees
only matching publishes, the ranking names the client that acks late, the counters count what went through."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes

from tests.admin.conftest import http
from tests.integration.conftest import Gateway, PahoClient, v5_props
from tests.waiting import wait_until

LATE_ACK_S = 0.25  # how long the late subscriber holds each PUBACK (the behaviour under test)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    env = {"TIDEWIRE_SLOW_SUBSCRIBERS_THRESHOLD_MS": "100", "TIDEWIRE_TRACE_MAX_TRACES": "3"}
    with Gateway(tmp_path_factory.mktemp("trace"), admin=True, env=env) as gw:
        yield gw


@pytest.fixture
def api(node: Gateway) -> Iterator[httpx.Client]:
    with http(node) as client:
        yield client


@pytest.fixture
def clients(node: Gateway) -> Iterator[list[PahoClient]]:
    made: list[PahoClient] = []
    yield made
    for client in made:
        client.close()


def _connect(node: Gateway, made: list[PahoClient], client_id: str) -> PahoClient:
    client = PahoClient(node.port, client_id, 5)
    made.append(client)
    client.connect()
    return client


def _lines(api: httpx.Client, name: str) -> list[dict[str, Any]]:
    answer = api.get(f"/api/v1/traces/{name}/download")
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("application/x-ndjson")
    return [json.loads(line) for line in answer.text.splitlines()]


def _kinds(lines: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(line["dir"], line["type"]) for line in lines]


def test_a_client_trace_records_its_packets_with_timings(node: Gateway, api: httpx.Client,
                                                         clients: list[PahoClient]) -> None:
    started = api.post("/api/v1/traces", json={"name": "one", "client_id": "traced", "duration": 60,
                                                "payload_bytes": 4})
    assert started.status_code == 201, started.text
    assert started.json()["status"] == "running"
    other = _connect(node, clients, "untraced")
    traced = _connect(node, clients, "traced")
    traced.subscribe("tr/echo", 1)
    assert traced.publish("tr/echo", b"payload-1", qos=1) == 0
    assert traced.get().payload == b"payload-1"
    other.publish("tr/echo", b"from-other", qos=0)
    assert traced.get().payload == b"from-other"
    traced.client._send_pingreq()  # paho's own PINGREQ, at once rather than after a keepalive
    wanted = [("in", "CONNECT"), ("out", "CONNACK"), ("in", "SUBSCRIBE"), ("out", "SUBACK"), ("in", "PUBLISH"),
              ("out", "PUBACK"), ("out", "PUBLISH"), ("in", "PUBACK"), ("out", "PUBLISH"), ("in", "PINGREQ"),
              ("out", "PINGRESP")]

    def complete() -> bool:
        kinds = _kinds(_lines(api, "one"))
        return all(kinds.count(k) >= wanted.count(k) for k in wanted)

    wait_until(complete, 5, what="the traced client's packets in the trace")
    lines = _lines(api, "one")
    assert {line["client"] for line in lines} == {"traced"}  # nothing of the untraced client
    kinds = _kinds(lines)
    assert kinds[:4] == wanted[:4]
    publish_in = next(line for line in lines if line["type"] == "PUBLISH" and line["dir"] == "in")
    assert publish_in["topic"] == "tr/echo" and publish_in["qos"] == 1 and publish_in["size"] == 9
    assert publish_in["payload"] == "payl" and publish_in["payload_truncated"] is True
    puback_out = next(line for line in lines if line["type"] == "PUBACK" and line["dir"] == "out")
    assert puback_out["packet_id"] == publish_in["packet_id"] and puback_out["reason_code"] == 0
    times = [line["t"] for line in lines]
    assert times == sorted(times) and 0 <= times[0] < 30
    assert all(abs(line["ts"] - (lines[0]["ts"] + line["t"] - lines[0]["t"])) < 1.0 for line in lines)
    listed = {t["name"]: t for t in api.get("/api/v1/traces").json()["data"]}
    assert listed["one"]["recorded"] == len(lines) and listed["one"]["dropped"] == 0
    stopped = api.post("/api/v1/traces/one/stop").json()
    assert stopped["status"] == "stopped"
    traced.client._send_pingreq()
    assert traced.publish("tr/echo", b"after", qos=1) == 0
    assert traced.get().payload == b"after"
    assert len(_lines(api, "one")) == len(lines)  # a stopped trace records nothing more
    assert api.delete("/api/v1/traces/one").status_code == 204
    assert api.get("/api/v1/traces/one").status_code == 404


def test_a_flood_keeps_the_newest_packets_and_counts_the_dropped(node: Gateway, api: httpx.Client,
                                                                 clients: list[PahoClient]) -> None:
    publisher = _connect(node, clients, "flooder")  # traced from the middle of its connection
    assert api.post("/api/v1/traces", json={"name": "flood", "client_id": "flooder", "duration": 60,
                                            "max_packets": 20}).status_code == 201
    for i in range(200):
        publisher.publish("tr/flood", f"m{i}".encode(), qos=0)
    assert publisher.publish("tr/flood", b"last", qos=1) == 0
    wait_until(lambda: _kinds(_lines(api, "flood"))[-1:] == [("out", "PUBACK")], 5, what="the last PUBACK traced")
    lines = _lines(api, "flood")
    assert len(lines) == 20
    assert lines[-2]["type"] == "PUBLISH" and lines[-2]["qos"] == 1 and lines[-2]["dir"] == "in"
    summary = api.get("/api/v1/traces/flood").json()
    assert summary["recorded"] == 202 and summary["dropped"] == 182 and summary["packets"] == 20
    api.delete("/api/v1/traces/flood")


def test_a_topic_trace_sees_only_matching_publishes(node: Gateway, api: httpx.Client,
                                                    clients: list[PahoClient]) -> None:
    assert api.post("/api/v1/traces", json={"name": "topic", "topic": "tr/watch/+",
                                            "duration": 60}).status_code == 201
    listener = _connect(node, clients, "topic-listener")
    listener.subscribe("tr/#", 0)
    sender = _connect(node, clients, "topic-sender")
    sender.publish("tr/other", b"x", qos=0)
    sender.publish("tr/watch/a", b"yy", qos=0)
    sender.publish("tr/watch/a/deeper", b"z", qos=0)
    assert sorted(m.topic for m in listener.expect(3)) == ["tr/other", "tr/watch/a", "tr/watch/a/deeper"]
    wait_until(lambda: len(_lines(api, "topic")) >= 2, 5, what="the matching publish traced in and out")
    lines = _lines(api, "topic")
    assert sorted((line["dir"], line["client"], line["topic"]) for line in lines) == [
        ("in", "topic-sender", "tr/watch/a"), ("out", "topic-listener", "tr/watch/a")]
    api.delete("/api/v1/traces/topic")


def test_a_topic_trace_follows_topic_aliases_both_ways(node: Gateway, api: httpx.Client,
                                                      clients: list[PahoClient]) -> None:
    assert api.post("/api/v1/traces", json={"name": "alias", "topic": "tr/alias/#", "duration": 60}).status_code == 201
    listener = PahoClient(node.port, "alias-listener", 5)  # takes topic aliases from the node
    clients.append(listener)
    listener.connect(properties=v5_props(PacketTypes.CONNECT, TopicAliasMaximum=4))
    listener.subscribe("tr/alias/#", 0)
    sender = _connect(node, clients, "alias-sender")
    for topic in ("tr/alias/x", ""):  # the topic with alias 1, then alias 1 alone
        sender.publish(topic, b"p", qos=0, properties=v5_props(PacketTypes.PUBLISH, TopicAlias=1))
    # The node sent the second as alias 1 alone (paho hands it over with an empty topic: it does not resolve aliases).
    assert [m.topic for m in listener.expect(2)] == ["tr/alias/x", ""]
    wait_until(lambda: len(_lines(api, "alias")) == 4, 5, what="both publishes traced in and out")
    lines = _lines(api, "alias")
    assert {(line["dir"], line["topic"]) for line in lines} == {("in", "tr/alias/x"), ("out", "tr/alias/x")}
    assert [line.get("topic_alias") for line in lines if line["dir"] == "in"] == [1, 1]
    assert all("topic_alias" in line for line in lines if line["dir"] == "out")  # the node used its aliases too
    api.delete("/api/v1/traces/alias")


def test_a_trace_stops_itself_after_its_duration(api: httpx.Client) -> None:
    assert api.post("/api/v1/traces", json={"name": "brief", "client_id": "c", "duration": 0.2}).status_code == 201
    wait_until(lambda: api.get("/api/v1/traces/brief").json()["status"] == "stopped", 5, what="the trace's end")
    assert api.get("/api/v1/traces/brief").json()["stop_reason"] == "duration reached"
    api.delete("/api/v1/traces/brief")


def test_trace_requests_are_checked(api: httpx.Client) -> None:
    assert api.post("/api/v1/traces", json={"name": "x", "duration": 5}).status_code == 422  # no target
    assert api.post("/api/v1/traces", json={"name": "x", "client_id": "c", "topic": "t"}).status_code == 422
    assert api.post("/api/v1/traces", json={"name": "bad name", "client_id": "c"}).status_code == 422
    assert api.post("/api/v1/traces", json={"name": "x", "topic": "a/#/b"}).status_code == 400
    assert api.post("/api/v1/traces", json={"name": "x", "client_id": "c", "duration": 10**6}).status_code == 400
    assert api.post("/api/v1/traces", json={"name": "x", "client_id": "c", "max_packets": 10**7}).status_code == 400
    for i in range(3):
        assert api.post("/api/v1/traces", json={"name": f"n{i}", "client_id": "c"}).status_code == 201
    assert api.post("/api/v1/traces", json={"name": "n0", "client_id": "c"}).status_code == 409
    assert api.post("/api/v1/traces", json={"name": "n3", "client_id": "c"}).status_code == 409  # 3 running
    api.post("/api/v1/traces/n1/stop")
    assert api.post("/api/v1/traces", json={"name": "n3", "client_id": "c"}).status_code == 201  # n1 made room
    assert sorted(t["name"] for t in api.get("/api/v1/traces").json()["data"]) == ["n0", "n2", "n3"]
    for name in ("n0", "n2", "n3"):
        assert api.delete(f"/api/v1/traces/{name}").status_code == 204
    assert httpx.get(f"{api.base_url}/api/v1/traces").status_code == 401


def _manual_ack_subscriber(node: Gateway, client_id: str, delay: float) -> tuple[paho.Client, list[int]]:
    """A paho client with `manual_ack=True` that acknowledges each message `delay` s after it arrived."""
    client = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=paho.MQTTv5, manual_ack=True)
    got: list[int] = []
    subscribed = threading.Event()

    def on_message(c: paho.Client, userdata: Any, message: paho.MQTTMessage) -> None:
        got.append(message.mid)
        if delay:
            threading.Timer(delay, c.ack, (message.mid, message.qos)).start()
        else:
            c.ack(message.mid, message.qos)

    client.on_message = on_message
    client.on_subscribe = lambda *args: subscribed.set()
    client.on_connect = lambda c, *args: c.subscribe("tr/slow", 1)
    client.connect("127.0.0.1", node.port)
    client.loop_start()
    assert subscribed.wait(5), "no SUBACK"
    return client, got


def test_the_ranking_names_the_late_acker_and_the_counters_count(node: Gateway, api: httpx.Client,
                                                                 clients: list[PahoClient]) -> None:
    late, late_got = _manual_ack_subscriber(node, "late-acker", LATE_ACK_S)
    prompt, prompt_got = _manual_ack_subscriber(node, "prompt-acker", 0)
    try:
        publisher = _connect(node, clients, "stats-publisher")
        for i in range(4):
            assert publisher.publish("tr/slow", b"x" * (10 + i), qos=1) == 0
        wait_until(lambda: len(late_got) == 4 and len(prompt_got) == 4, 5, what="both subscribers got all four")

        def acked(client_id: str) -> bool:
            return api.get(f"/api/v1/clients/{client_id}/stats").json()["acks"] == 4

        wait_until(lambda: acked("late-acker") and acked("prompt-acker"), 5, what="every PUBACK read")
        ranking = api.get("/api/v1/slow-subscribers").json()
        assert [row["client_id"] for row in ranking["data"]] == ["late-acker"]  # the prompt one is under 100 ms
        row = ranking["data"][0]
        assert LATE_ACK_S * 1000 <= row["ack_ewma_ms"] < 5000 and row["acks"] == 4
        assert row["ack_max_ms"] >= LATE_ACK_S * 1000 and ranking["threshold_ms"] == 100
        prompt_stats = api.get("/api/v1/clients/prompt-acker/stats").json()
        assert prompt_stats["ack_max_ms"] < LATE_ACK_S * 1000
        assert prompt_stats["messages_out"] == 4 and prompt_stats["messages_in"] == 0
        assert prompt_stats["retries"] == 0 and prompt_stats["drops"] == 0
        pub_stats = api.get("/api/v1/clients/stats-publisher/stats").json()
        assert (pub_stats["messages_in"], pub_stats["bytes_in"], pub_stats["messages_out"]) == (4, 46, 0)
        listed = {row["client_id"]: row for row in api.get("/api/v1/client-stats?client_id=acker").json()["data"]}
        assert set(listed) == {"late-acker", "prompt-acker"} and listed["late-acker"]["bytes_out"] > 46
        assert api.get("/api/v1/clients/nobody/stats").status_code == 404
        late.disconnect()
        late.loop_stop()
        wait_until(lambda: api.get("/api/v1/clients/late-acker/stats").status_code == 404, 5, what="late-acker gone")
        ranked = api.get("/api/v1/slow-subscribers").json()["data"]
        assert [(r["client_id"], r["online"]) for r in ranked] == [("late-acker", False)]  # still ranked, as it was
    finally:
        for client in (late, prompt):
            client.disconnect()
            client.loop_stop()


def test_drops_and_resends_are_counted_per_client(node: Gateway, api: httpx.Client,
                                                  clients: list[PahoClient]) -> None:
    small = PahoClient(node.port, "small-packets", 5)  # takes packets of 64 bytes at most
    clients.append(small)
    small.connect(properties=v5_props(PacketTypes.CONNECT, MaximumPacketSize=64))
    small.subscribe("tr/drops", 0)
    publisher = _connect(node, clients, "drops-publisher")
    publisher.publish("tr/drops", b"x" * 200, qos=0)  # too large for it: skipped, for it alone
    publisher.publish("tr/drops", b"fits", qos=0)
    assert small.get().payload == b"fits"
    small_stats = api.get("/api/v1/clients/small-packets/stats").json()
    assert (small_stats["drops"], small_stats["messages_out"]) == (1, 1)
    # A 3.1.1 persistent session that never acknowledges: its next connection gets both again, as DUP.
    silent = paho.Client(CallbackAPIVersion.VERSION2, client_id="never-acks", protocol=paho.MQTTv311,
                         clean_session=False, manual_ack=True)
    got: list[bool] = []
    silent.on_message = lambda c, u, message: got.append(bool(message.dup))
    subscribed = threading.Event()
    silent.on_subscribe = lambda *args: subscribed.set()
    silent.connect("127.0.0.1", node.port)
    silent.loop_start()
    try:
        silent.subscribe("tr/resend", 1)
        assert subscribed.wait(5), "no SUBACK"
        for i in range(2):
            assert publisher.publish("tr/resend", f"r{i}".encode(), qos=1) == 0
        wait_until(lambda: len(got) == 2, 5, what="both messages at the silent client")
        silent.disconnect()
        silent.loop_stop()
        wait_until(lambda: api.get("/api/v1/clients/never-acks/stats").status_code == 404, 5, what="it left")
        silent.reconnect()
        silent.loop_start()
        wait_until(lambda: len(got) == 4, 5, what="both messages again")
        assert got == [False, False, True, True]
        again = api.get("/api/v1/clients/never-acks/stats").json()
        assert (again["retries"], again["messages_out"], again["acks"]) == (2, 2, 0)
    finally:
        silent.disconnect()
        silent.loop_stop()
