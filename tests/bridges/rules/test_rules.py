"""Rules on a real Tidewire process: a statement over topic, client and JSON payload selects and shapes messages,
republished to a topic or POSTed to a webhook served by the test. A webhook that fails for a while gets everything
once it recovers; one that never recovers fills the dead-letter topic with exactly what it missed; requests are
HMAC-signed; rules are managed through the admin API (create, list with counts, disable, delete, try a
statement)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.bridges.rules.webhook_server import WebhookServer
from tests.extensions.plugin_dist import lay_out, pythonpath
from tests.integration.conftest import Gateway
from tests.integration.paho import PahoClient
from tests.waiting import wait_until


@pytest.fixture
def hook() -> Iterator[WebhookServer]:
    server = WebhookServer(secret="s3cret")
    yield server
    server.close()


class Node:
    def __init__(self, tmp: Path, rules: list[dict[str, Any]] | None = None) -> None:
        self.clients: list[PahoClient] = []
        args: list[str] = []
        if rules:
            tmp.mkdir(parents=True, exist_ok=True)
            config = tmp / "tidewire.yaml"
            config.write_text(yaml.safe_dump({"rules": rules}))
            args = ["--config", str(config)]
        self.gw = Gateway(tmp / "node", target="tidewire", admin=True, extra_args=args)
        self.gw.start()

    def client(self, client_id: str, version: int = 5) -> PahoClient:
        client = PahoClient(self.gw.port, client_id, version=version)
        self.clients.append(client)
        client.connect()
        return client

    def api(self, method: str, path: str, body: Any = None) -> httpx.Response:
        return httpx.request(method, f"http://127.0.0.1:{self.gw.admin_port}/api/v1{path}", json=body,
                             headers={"Authorization": f"Bearer {self.gw.api_token}"}, timeout=10)

    def counts(self, rule: str) -> dict[str, int]:
        answer = self.api("GET", f"/rules/{rule}")
        assert answer.status_code == 200, answer.text
        counts: dict[str, int] = answer.json()["counts"]
        return counts

    def close(self) -> None:
        for client in self.clients:
            client.close()
        self.gw.close()


@pytest.fixture
def node_factory(tmp_path: Path) -> Iterator[Any]:
    made: list[Node] = []

    def make(rules: list[dict[str, Any]] | None = None) -> Node:
        node = Node(tmp_path / f"n{len(made)}", rules)
        made.append(node)
        return node

    yield make
    for node in made:
        node.close()


def webhook_rule(name: str, url: str, **action: Any) -> dict[str, Any]:
    return {"name": name, "sql": 'SELECT payload.n AS n, payload.temp AS temp, clientid FROM "sensors/#" '
                                 "WHERE payload.temp > 30",
            "action": {"type": "webhook", "url": url, "secret": "s3cret", "retry_base": 0.05, "retry_cap": 0.2,
                       **action}}


def publish_readings(client: PahoClient, n: int, hot: bool = True) -> None:
    for i in range(n):
        client.publish("sensors/room1", json.dumps({"n": i, "temp": 31 if hot else 20}), qos=1)


def test_republish_selects_and_shapes(node_factory: Any) -> None:
    node = node_factory([{"name": "hot", "sql": 'SELECT payload.temp AS t, clientid FROM "sensors/#" '
                                               "WHERE payload.temp > 30 AND clientid <> 'test'",
                          "action": {"type": "republish", "topic": "alerts/${clientid}", "qos": 1}}])
    sub = node.client("sub")
    sub.subscribe("alerts/#", 1)
    dev = node.client("dev1")
    dev.publish("sensors/a", json.dumps({"temp": 20}), qos=1)
    dev.publish("sensors/a", b"not json", qos=1)
    node.client("test").publish("sensors/a", json.dumps({"temp": 40}), qos=1)
    dev.publish("sensors/a", json.dumps({"temp": 35.5}), qos=1)
    got = sub.get(timeout=5)
    assert (got.topic, json.loads(got.payload)) == ("alerts/dev1", {"t": 35.5, "clientid": "dev1"})
    dev.publish("sensors/a", json.dumps({"temp": 99}), qos=1)  # a marker: nothing else came before it
    assert json.loads(sub.get(timeout=5).payload)["t"] == 99
    sub.assert_nothing(0.3)
    assert node.counts("hot") == {"matched": 2, "sent": 2, "failed": 0, "dead_lettered": 0}


@pytest.mark.slow  # seconds long: `make test-slow` keeps `make test` under its 10 minutes
def test_a_webhook_down_for_a_while_gets_everything_once_it_recovers(node_factory: Any,
                                                                     hook: WebhookServer) -> None:
    hook.status = 503
    node = node_factory([webhook_rule("hook", hook.url, max_retries=100, batch_size=10)])
    dev = node.client("dev1")
    publish_readings(dev, 200)
    publish_readings(dev, 50, hot=False)  # not selected: never sent
    wait_until(lambda: len(hook.requests) >= 5, what="failed attempts")
    assert hook.delivered() == []
    hook.status = 200
    wait_until(lambda: {r["n"] for r in hook.delivered()} == set(range(200)), timeout=20,
               what=lambda: f"{len({r['n'] for r in hook.delivered()})} of 200 delivered")
    delivered = Counter(r["n"] for r in hook.delivered())
    assert sum(delivered.values()) == 200  # each once: a failed request delivered nothing
    assert all(r.signed for r in hook.requests)
    assert all(r["clientid"] == "dev1" and r["temp"] == 31 for r in hook.delivered())
    counts = node.counts("hook")
    assert counts["sent"] == 200 and counts["failed"] >= 5 and counts["dead_lettered"] == 0


@pytest.mark.slow  # seconds long: `make test-slow` keeps `make test` under its 10 minutes
def test_an_endpoint_that_never_recovers_fills_the_dead_letter_topic_with_what_it_missed(
        node_factory: Any, hook: WebhookServer) -> None:
    hook.status = 503
    node = node_factory([webhook_rule("lost", hook.url, max_retries=2)])
    dead = node.client("dead")
    dead.subscribe("$rules/lost/dead-letter", 1)
    dev = node.client("dev1")
    publish_readings(dev, 10)
    letters = [json.loads(dead.get(timeout=10).payload) for _ in range(10)]
    assert sorted(letter["result"]["n"] for letter in letters) == list(range(10))
    assert {(letter["rule"], letter["attempts"], letter["error"]) for letter in letters} == {
        ("lost", 3, "webhook: HTTP 503")}
    dead.assert_nothing(0.5)
    assert hook.delivered() == [] and len(hook.requests) == 30  # three attempts each, then given up
    assert node.counts("lost")["dead_lettered"] == 10


def test_a_permanent_refusal_is_dead_lettered_at_once(node_factory: Any, hook: WebhookServer) -> None:
    hook.status = 400
    node = node_factory([webhook_rule("bad", hook.url, max_retries=5)])
    dead = node.client("dead")
    dead.subscribe("$rules/bad/dead-letter", 1)
    publish_readings(node.client("dev1"), 1)
    letter = json.loads(dead.get(timeout=10).payload)
    assert (letter["attempts"], letter["error"]) == (1, "webhook: HTTP 400") and len(hook.requests) == 1


def test_rules_through_the_admin_api(node_factory: Any, hook: WebhookServer) -> None:
    node = node_factory()
    assert node.api("GET", "/rules").json()["data"] == []
    bad = webhook_rule("r1", hook.url) | {"sql": 'SELECT FROM "x"'}
    assert node.api("PUT", "/rules/r1", bad).status_code == 422
    assert node.api("PUT", "/rules/r1", webhook_rule("r1", hook.url)).status_code == 200
    [listed] = node.api("GET", "/rules").json()["data"]
    assert listed["name"] == "r1" and listed["enabled"] and "secret" not in listed["action"]
    publish_readings(node.client("dev1"), 3)
    wait_until(lambda: len(hook.delivered()) == 3, what="three delivered")
    assert node.api("PUT", "/rules/r1/enabled", {"enabled": False}).json()["running"] is False
    dev = node.client("dev2")
    publish_readings(dev, 2)  # while disabled: kept in the log for the rule
    assert node.api("PUT", "/rules/r1/enabled", {"enabled": True}).json()["running"] is True
    wait_until(lambda: len(hook.delivered()) == 5, what="the two published while disabled")
    tried = node.api("POST", "/rules/test", {"sql": listed["sql"], "message": {
        "topic": "sensors/x", "payload": '{"n": 7, "temp": 40}', "clientid": "c"}}).json()
    assert tried == {"selected": True, "result": {"n": 7, "temp": 40, "clientid": "c"}}
    assert node.api("DELETE", "/rules/r1").status_code == 204
    assert node.api("GET", "/rules/r1").status_code == 404


def test_a_rule_that_does_not_compile_stops_the_start(tmp_path: Path) -> None:
    gw = Gateway(tmp_path / "node", target="tidewire", extra_args=["--rules", json.dumps([
        {"name": "x", "sql": "SELECT * FROM", "action": {"type": "republish", "topic": "t"}}])])
    try:
        with pytest.raises(pytest.fail.Exception):  # Gateway.start fails the test when the process exits
            gw.start()
        assert "rule 'x'" in gw.stderr
    finally:
        gw.close()


def test_a_sink_plugin_gets_the_results_retried_while_down_and_refusals_dead_lettered(tmp_path: Path) -> None:
    plugin_dir = lay_out(tmp_path / "plugins")
    out = tmp_path / "sink.jsonl"
    down = Path(str(out) + ".down")
    down.touch()
    rules = [{"name": "to-sink", "sql": 'SELECT payload.n AS n, payload.refuse AS refuse FROM "sensors/#"',
              "action": {"type": "sink", "sink": "testsink", "options": {"path": str(out)}, "batch_size": 1,
                         "retry_base": 0.05, "retry_cap": 0.2, "max_retries": 100}}]
    config = tmp_path / "rules.yaml"
    config.write_text(yaml.safe_dump({"rules": rules}))
    gw = Gateway(tmp_path / "node", target="tidewire", admin=True, env={"PYTHONPATH": pythonpath(plugin_dir)},
                 extra_args=["--config", str(config)])
    clients: list[PahoClient] = []
    try:
        gw.start()
        dead = PahoClient(gw.port, "dead", version=5)
        clients.append(dead)
        dead.connect()
        dead.subscribe("$rules/to-sink/dead-letter", 1)
        dev = PahoClient(gw.port, "dev1", version=5)
        clients.append(dev)
        dev.connect()
        for i in range(20):
            dev.publish("sensors/a", json.dumps({"n": i}), qos=1)
        dev.publish("sensors/a", json.dumps({"n": 99, "refuse": True}), qos=1)
        wait_until(lambda: _counts(gw)["failed"] >= 3, what="failed writes while the sink is down")
        assert not out.exists()
        down.unlink()
        wait_until(lambda: out.exists() and len(out.read_text().splitlines()) == 20, timeout=10,
                   what="the 20 results once the sink is up")
        assert sorted(json.loads(line)["result"]["n"] for line in out.read_text().splitlines()) == list(range(20))
        letter = json.loads(dead.get(timeout=10).payload)  # the refused one, at once: not retried
        assert (letter["result"]["n"], letter["error"]) == (99, "refused by the test sink")
    finally:
        for client in clients:
            client.close()
        gw.close()


def _counts(gw: Gateway) -> dict[str, int]:
    answer = httpx.get(f"http://127.0.0.1:{gw.admin_port}/api/v1/rules/to-sink",
                       headers={"Authorization": f"Bearer {gw.api_token}"}, timeout=10)
    counts: dict[str, int] = answer.json()["counts"]
    return counts
