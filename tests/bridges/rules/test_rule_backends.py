"""Rules whose action publishes to the backends, read by their own clients: an AMQP exchange (pika, a queue bound to
`amq.topic`) and a RocketMQ topic with a tag (the official RocketMQ 5 client, a SimpleConsumer filtering on it)."""
# ruff: noqa: F811 - the fixtures imported from the other suites are requested by name as parameters

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pika
import yaml

from tests.gateway.protocols.rocketmq.conftest import Clients, clients  # noqa: F401 - a fixture, by name
from tests.integration.conftest import (  # noqa: F401 - gateway_factory, paho_factory: fixtures, by name
    Gateway,
    GatewayFactory,
    PahoClient,
    gateway_factory,
    paho_factory,
)
from tests.waiting import wait_until

RULE_SQL = 'SELECT payload.temp AS temp, clientid FROM "sensors/#" WHERE payload.temp > 30'


def with_rules(gateway_factory: GatewayFactory, tmp_path: Path, rules: list[dict[str, Any]], **kw: Any) -> Gateway:
    config = tmp_path / "rules.yaml"
    config.write_text(yaml.safe_dump({"rules": rules}))
    return gateway_factory(extra_args=["--config", str(config)], **kw)


def publish_hot(gw: Gateway, paho_factory: Callable[..., PahoClient]) -> None:
    client = paho_factory(gw.port, "dev1", version=5)
    client.connect()
    client.publish("sensors/room1", json.dumps({"temp": 20}), qos=1)
    client.publish("sensors/room1", json.dumps({"temp": 35}), qos=1)


def test_a_rule_publishes_to_an_amqp_exchange(gateway_factory: GatewayFactory, paho_factory: Any,
                                              tmp_path: Path) -> None:
    gw = with_rules(gateway_factory, tmp_path, [{"name": "to-amqp", "sql": RULE_SQL, "action": {
        "type": "amqp", "exchange": "amq.topic", "routing_key": "alerts.${clientid}"}}], amqp=True)
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", gw.amqp_port))
    try:
        channel = connection.channel()
        queue = channel.queue_declare("", exclusive=True).method.queue
        channel.queue_bind(queue, "amq.topic", "alerts.#")
        publish_hot(gw, paho_factory)
        got: list[tuple[str, bytes]] = []

        def delivered() -> bool:
            method, _, body = channel.basic_get(queue, auto_ack=True)
            if method is not None:
                got.append((method.routing_key, body))
            return bool(got)

        wait_until(delivered, timeout=10, what="the rule's message on the AMQP queue")
        assert [(key, json.loads(body)) for key, body in got] == [("alerts.dev1", {"temp": 35, "clientid": "dev1"})]
    finally:
        connection.close()


def test_a_rule_publishes_to_a_rocketmq_topic_with_a_tag(gateway_factory: GatewayFactory,
                                                         paho_factory: Any, clients: Clients,
                                                         tmp_path: Path) -> None:
    from rocketmq import FilterExpression

    gw = with_rules(gateway_factory, tmp_path, [{"name": "to-rmq", "sql": RULE_SQL, "action": {
        "type": "rocketmq", "topic": "alerts", "second_topic": "${clientid}", "tag": "hot"}}], rocketmq=True)
    consumer = clients.consumer(gw, "ops", "alerts", FilterExpression("hot"))
    publish_hot(gw, paho_factory)
    got: list[Any] = []
    wait_until(lambda: got.extend(consumer.receive(16, 30)) or bool(got), timeout=15,
               what="the rule's message at the RocketMQ consumer")
    [message] = got
    assert json.loads(message.body) == {"temp": 35, "clientid": "dev1"} and message.tag == "hot"
    consumer.ack(message)
