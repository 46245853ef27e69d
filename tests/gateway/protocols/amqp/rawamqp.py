"""A raw-socket AMQP 0.9.1 client for tests that must send what no real client sends (pamqp marshals)."""

from __future__ import annotations

import socket
import time

from pamqp import commands, frame
from pamqp.frame import FrameTypes
from pamqp.header import ProtocolHeader


class RawAmqp:
    def __init__(self, port: int, timeout: float = 5.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buffer = b""

    def close(self) -> None:
        self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_frame(self, channel: int, value: FrameTypes) -> None:
        self.send(frame.marshal(value, channel))

    def read_frame(self, timeout: float = 5.0) -> tuple[int, FrameTypes]:
        deadline = time.monotonic() + timeout
        while True:
            if len(self.buffer) >= 8:
                try:
                    used, channel, value = frame.unmarshal(self.buffer)
                except Exception:  # not complete yet
                    pass
                else:
                    self.buffer = self.buffer[used:]
                    return channel, value
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError("no frame in time")
            self.sock.settimeout(left)
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("closed by the server")
            self.buffer += data

    def read_method(self, timeout: float = 5.0) -> tuple[int, FrameTypes]:
        """The next frame that is not a heartbeat."""
        while True:
            channel, value = self.read_frame(timeout)
            if value.name != "Heartbeat":
                return channel, value

    def handshake(self, username: str = "guest", password: str = "guest", heartbeat: int = 0) -> None:
        self.send(ProtocolHeader().marshal())
        _, start = self.read_method()
        assert isinstance(start, commands.Connection.Start), start
        self.send_frame(0, commands.Connection.StartOk(
            client_properties={"product": "raw", "capabilities": {"connection.blocked": True}},
            mechanism="PLAIN", response=f"\0{username}\0{password}", locale="en_US"))
        _, tune = self.read_method()
        assert isinstance(tune, commands.Connection.Tune), tune
        self.send_frame(0, commands.Connection.TuneOk(tune.channel_max, tune.frame_max, heartbeat))
        self.send_frame(0, commands.Connection.Open("/"))
        _, ok = self.read_method()
        assert isinstance(ok, commands.Connection.OpenOk), ok

    def wait_closed(self, timeout: float = 5.0) -> None:
        """Read (and drop) until the server closes the socket."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError("the server did not close the connection")
            self.sock.settimeout(left)
            try:
                if not self.sock.recv(65536):
                    return
            except ConnectionResetError:
                return
