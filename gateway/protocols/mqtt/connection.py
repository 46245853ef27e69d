"""One MQTT connection's asyncio side: moves bytes between the transport and its `MqttChannel` and arms the timers
the channel asks for. It holds no MQTT rule (as uvicorn's `h11_impl` over an `h11.Connection`); the rules are
the channel's (gateway/protocols/mqtt/channel.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from tidewire.gateway.protocols.mqtt.channel import MqttChannel
from tidewire.gateway.protocols.mqtt.lifecycle import Cancellable
from tidewire.gateway.transport.deadlines import Bucket
from tidewire.gateway.transport.listeners import Listener
from tidewire.gateway.transport.tls import CertUsername, certificate_name

if TYPE_CHECKING:
    from tidewire.gateway.node import Node


class MqttProtocol(asyncio.Protocol):
    """The `ChannelIo` of one channel, over an asyncio (uvloop) transport."""

    __slots__ = ("_bucket", "_peer", "channel", "listener", "node", "transport")

    def __init__(self, node: Node, listener: Listener, peer: tuple[str, int] | None = None) -> None:
        self.node = node
        self.listener = listener
        self._peer = f"{peer[0]}:{peer[1]}" if peer is not None else ""  # the real client behind a PROXY header
        self.transport: asyncio.Transport | None = None
        self.channel: MqttChannel | None = None
        self._bucket: Bucket | None = None  # where the channel's deadline is filed in the listener's wheel

    # --- asyncio.Protocol ---------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports aren't asyncio subclasses
        peer = self._peer
        if not peer:
            name = self.transport.get_extra_info("peername")
            peer = f"{name[0]}:{name[1]}" if isinstance(name, tuple) else str(name)
        self.transport.set_write_buffer_limits(high=self.node.settings.write_buffer_high)
        self.channel = MqttChannel(self.node, self.listener, self, peer, self.node.clock)

    def data_received(self, data: bytes) -> None:
        assert self.channel is not None
        self.channel.receive(data)

    def eof_received(self) -> bool | None:
        return None  # close our side too: a half-closed MQTT connection is of no use

    def connection_lost(self, exc: Exception | None) -> None:
        if self.channel is not None:
            self.channel.connection_lost("connection lost" if exc is None else str(exc))

    def pause_writing(self) -> None:
        if self.channel is not None:
            self.channel.pause_writing()

    def resume_writing(self) -> None:
        if self.channel is not None:
            self.channel.resume_writing()

    # --- ChannelIo ----------------------------------------------------------------------------------------
    def write(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)

    def writelines(self, chunks: list[bytes]) -> None:
        if self.transport is not None:
            self.transport.writelines(chunks)

    def pause_reading(self) -> None:
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None:
            self.transport.resume_reading()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def is_closing(self) -> bool:
        return self.transport is None or self.transport.is_closing()

    def end_output(self) -> bool:
        transport = self.transport
        if transport is None or transport.is_closing():
            return False
        if transport.can_write_eof():
            try:
                transport.write_eof()
            except OSError:  # the peer is already gone (ENOTCONN): nothing left to drain
                transport.close()
                return False
        return True

    def set_deadline(self, when: float | None) -> None:
        if self._bucket is not None:
            self._bucket.discard(self)
            self._bucket = None
        if when is not None:
            self._bucket = self.listener.deadlines.file(self, when)

    def deadline_due(self, now: float) -> None:
        """The listener's wheel: our deadline passed (the wheel has dropped us from its bucket)."""
        self._bucket = None
        if self.channel is not None:
            self.channel.deadline_due(now)

    def call_later(self, delay: float, callback: Callable[[], None]) -> Cancellable:
        return asyncio.get_running_loop().call_later(delay, callback)

    def certificate_name(self, kind: CertUsername) -> str | None:
        assert self.transport is not None
        return certificate_name(self.transport, kind)
