"""Locust device fleet: each user is a device that publishes telemetry at QoS 1 and listens for commands.

Run (broker on 127.0.0.1:1883, or set MQTT_HOST / MQTT_PORT):
    locust -f loadtest/locustfile.py --headless -u 1000 -r 100 -t 60s
A device publishes `devices/<id>/telemetry` every few seconds and subscribes to `devices/<id>/cmd`;
`CommanderUser` (weight 1 per 100 devices) sends commands to random known devices.
"""

from __future__ import annotations

import json
import os
import random
import time
from typing import Any

from locust import between, events, task
from locust.contrib.mqtt import MqttClient, MqttUser

MQTT_HOST = os.environ.get("MQTT_HOST", "127.0.0.1")
MQTT_PORT = int(os.environ.get("MQTT_PORT", "1883"))
TELEMETRY_QOS = 1


def device_id(n: int) -> str:
    return f"dev{n:07d}"


class FleetClient(MqttClient):
    """Names stats by topic pattern (`devices/{id}/cmd`), not one row per device."""

    def _generate_event_name(self, event_type: str, qos: int, topic: str) -> str:
        parts = topic.split("/")
        if len(parts) == 3 and parts[0] == "devices":
            topic = f"devices/{{id}}/{parts[2]}"
        return f"{event_type}:{qos}:{topic}"


class DeviceUser(MqttUser):
    """One IoT device; locust's MqttClient reports connect/publish/subscribe times as request events."""

    host = MQTT_HOST
    port = MQTT_PORT
    client_cls = FleetClient
    wait_time = between(2.0, 5.0)
    use_loop_selectors = True  # paho's select() loop breaks beyond ~340 sockets per process
    weight = 100
    client_id: str | None = None  # type: ignore[assignment]  # locust types the base as None
    _counter = 0  # per class: numbers devices in spawn order within this process

    def __init__(self, environment: Any) -> None:
        DeviceUser._counter += 1
        self.device = device_id(DeviceUser._counter)
        self.client_id = f"{self.device}-{os.getpid()}"
        super().__init__(environment)
        self.commands = 0
        self.client.on_message = self._on_command

    def on_start(self) -> None:
        deadline = time.monotonic() + 10
        while not self.client.is_connected() and time.monotonic() < deadline:
            time.sleep(0.05)
        self.client.subscribe(f"devices/{self.device}/cmd", qos=1)

    def on_stop(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()

    def _on_command(self, client: Any, userdata: Any, msg: Any) -> None:
        self.commands += 1
        sent = json.loads(msg.payload).get("ts", time.time())
        events.request.fire(request_type="MQTT", name="command:recv", response_time=(time.time() - sent) * 1000,
                            response_length=len(msg.payload), exception=None, context={})

    @task
    def telemetry(self) -> None:
        payload = json.dumps({"ts": time.time(), "temp": round(random.uniform(15, 30), 2),
                              "battery": random.randint(1, 100), "commands": self.commands})
        self.client.publish(f"devices/{self.device}/telemetry", payload, qos=TELEMETRY_QOS)


class CommanderUser(MqttUser):
    """A backend service pushing commands to devices (the reverse direction of the gateway)."""

    host = MQTT_HOST
    port = MQTT_PORT
    client_cls = FleetClient
    wait_time = between(0.5, 1.0)
    weight = 1

    @task
    def command(self) -> None:
        if not self.client.is_connected() or DeviceUser._counter == 0:
            return
        target = device_id(random.randint(1, DeviceUser._counter))
        payload = json.dumps({"ts": time.time(), "cmd": "reboot"})
        self.client.publish(f"devices/{target}/cmd", payload, qos=1)
