"""The connection side of a sans-IO MQTT channel (`ChannelIo`), recorded: what the channel wrote, decoded as a
client reads it; its deadline; the timers it asked for, run by hand at a `FakeClock`'s time."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.gateway.fakeclock import FakeClock
from tidewire.gateway.node import Node
from tidewire.gateway.protocols.mqtt.channel import MqttChannel
from tidewire.gateway.protocols.mqtt.codec import Parser
from tidewire.gateway.transport.listeners import Listener


@dataclass
class Timer:
    at: float
    callback: Callable[[], None]
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True


@dataclass
class FakeIo:
    """What the channel asked of its connection, recorded; the server's packets decoded as a client reads them."""

    clock: FakeClock
    out: bytearray = field(default_factory=bytearray)
    reading: bool = True
    closed: bool = False
    ended: bool = False  # a graceful close began (FIN sent)
    deadline: float | None = None
    timers: list[Timer] = field(default_factory=list)
    cert: str | None = None

    def write(self, data: bytes) -> None:
        assert not self.closed
        self.out += data

    def writelines(self, chunks: list[bytes]) -> None:
        for chunk in chunks:
            self.write(chunk)

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed or self.ended  # as if the client closed as soon as it read our last packet

    def end_output(self) -> bool:
        if self.closed or self.ended:
            return False
        self.ended = True
        return True

    def set_deadline(self, when: float | None) -> None:
        self.deadline = when

    def call_later(self, delay: float, callback: Callable[[], None]) -> Timer:
        timer = Timer(self.clock.mono + delay, callback)
        self.timers.append(timer)
        return timer

    def certificate_name(self, kind: str | None) -> str | None:
        return self.cert

    def packets(self, level: int = 5) -> list[Any]:
        """What the server wrote since the last call, decoded as a client of `level` reads it."""
        data, self.out = bytes(self.out), bytearray()
        return Parser(protocol_level=level).feed(data)

    def fire_timers(self) -> None:
        """Run the timers that are due at the clock's time (in order)."""
        for timer in sorted(self.timers, key=lambda t: t.at):
            if not timer.cancelled and timer.at <= self.clock.mono:
                self.timers.remove(timer)
                timer.callback()


def channel(node: Node, clock: FakeClock, peer: str = "10.0.0.7:50000") -> tuple[MqttChannel, FakeIo]:
    """A channel on `node` (listener `mqtt`, no limits of its own) reading `clock`, with its recorder."""
    io = FakeIo(clock)
    return MqttChannel(node, Listener("mqtt", max_connections=100, rate=None, proxy_protocol=False), io, peer,
                       clock), io


async def until(predicate: Callable[[], bool], what: str, turns: int = 2000) -> None:
    """Let the node's own tasks (store calls, the append tick) run until `predicate` holds; no wall-clock wait."""
    for _ in range(turns):
        if predicate():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"{what}: not reached")
