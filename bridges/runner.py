"""The node's bridges as one backend: each configured bridge (the `bridges` setting and the Mosquitto bridge file)
runs in a task of its own from start to stop; their status feeds $SYS, /metrics, the admin API and `tidewire ctl`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from pathlib import Path
from typing import Any

from tidewire.bridges.host import NodeHost
from tidewire.bridges.mqtt.bridge import MqttBridge
from tidewire.bridges.mqtt.mosquitto_conf import read_bridge_file
from tidewire.bridges.mqtt.settings import BridgeSettings, check_unique
from tidewire.store.base import Message

log = logging.getLogger("tidewire.bridge")

LAG_FRESH_S = 1.0  # a lag measured this recently is shown as it is
STOP_TIMEOUT_S = 5.0  # a stopping bridge gives back what it has in flight within this
# What $SYS shows of a bridge (lag_messages as lag/messages, lag_seconds as lag/seconds).
SYS_KEYS = ("state", "lag_messages", "lag_seconds", "sent", "acked", "redelivered", "refused_by_remote", "received",
            "stored", "denied", "connects", "failures")


def configured_bridges(bridges: list[BridgeSettings], mosquitto_file: Path | None,
                       hostname: str) -> list[BridgeSettings]:
    """The bridges of the settings, then those of the Mosquitto file (what it holds besides is logged); two
    with one name or one local client id are refused (ConfigError)."""
    found = list(bridges)
    if mosquitto_file is not None:
        read = read_bridge_file(mosquitto_file, hostname=hostname)
        for where, part in [(mosquitto_file, read), *read.included.items()]:
            for line, option in part.ignored:
                log.info("bridge.option_ignored", extra={"file": str(where), "line": line, "option": option})
            for line, what in part.notices:
                log.warning("bridge.option_read_as", extra={"file": str(where), "line": line, "what": what})
        found += read.bridges
    check_unique(found, hostname)
    return found


class BridgeRunner:
    """Runs the bridges of one node (a `gateway.server.Backend`)."""

    def __init__(self, host: NodeHost, bridges: list[BridgeSettings], hostname: str | None = None) -> None:
        self.host = host
        self.hostname = hostname or socket.gethostname()
        self.bridges = [MqttBridge(settings, host, hostname=self.hostname) for settings in bridges]
        self._tasks: list[asyncio.Task[None]] = []
        self._sys: asyncio.Task[None] | None = None
        self._lag_measured = float("-inf")

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._run(bridge), name=f"bridge-{bridge.settings.name}")
                       for bridge in self.bridges]
        self._sys = loop.create_task(self._sys_loop(), name="bridge-sys")

    async def _sys_loop(self) -> None:
        """Every `sys_interval`: each bridge's lag is measured (for /metrics) and, with `sys_events`, its status
        published under `$SYS/brokers/<node>/bridges/<name>/`, retained as the node's own statistics are."""
        host = self.host
        prefix = f"$SYS/brokers/{host.node_id}/bridges"
        while True:
            await asyncio.sleep(host.settings.sys_interval)
            now_ms = int(host.clock.time() * 1000)
            for status in await self.statuses():
                if not host.settings.sys_events:
                    continue
                for key in SYS_KEYS:
                    value = status.get(key)
                    if value is not None:
                        name = key.replace("_", "/", 1) if key.startswith("lag_") else key
                        host.publish(Message(f"{prefix}/{status['name']}/{name}", str(value).encode(), 0, True, b"",
                                             now_ms))

    @staticmethod
    async def _run(bridge: MqttBridge) -> None:
        try:
            await bridge.run()
        except asyncio.CancelledError:
            raise
        except Exception:  # a bridge's bug must not stop the node: it is logged and the bridge shows stopped
            log.exception("bridge.failed", extra={"bridge": bridge.settings.name})

    async def stop(self) -> None:
        if self._sys is not None:
            self._sys.cancel()
        for bridge in self.bridges:
            await bridge.stop()
        if self._tasks:
            _, pending = await asyncio.wait(self._tasks, timeout=STOP_TIMEOUT_S)
            for task in pending:
                task.cancel()
            for task in pending:
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    def get(self, name: str) -> MqttBridge | None:
        for bridge in self.bridges:
            if bridge.settings.name == name:
                return bridge
        return None

    async def statuses(self) -> list[dict[str, Any]]:
        """Every bridge's status, its lag measured now unless it was within `LAG_FRESH_S` (the dashboard polls
        every few seconds, maybe from several browsers: each measure reads the store)."""
        now = self.host.clock.monotonic()
        if now - self._lag_measured >= LAG_FRESH_S:
            self._lag_measured = now
            for bridge in self.bridges:
                await bridge.measure_lag()
        return [bridge.status() for bridge in self.bridges]
