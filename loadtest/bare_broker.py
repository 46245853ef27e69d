"""The floor under Tidewire's connects: a bare uvloop server that answers every CONNECT with CONNACK and nothing more.

`python -m loadtest.bare_broker --port P`. One `asyncio.Protocol` per connection, as Tidewire's, with no MQTT
beyond reading a packet's length: CONNECT → CONNACK (accepted), PINGREQ → PINGRESP, DISCONNECT → close. What a
connect costs here is uvloop's accept, transport and close, and the kernel's; what Tidewire spends above it is
its own. `loadtest.conn_bench --targets bare,...` measures it beside the brokers (connect and idle modes).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from collections.abc import Sequence

import uvloop

CONNACK = b"\x20\x02\x00\x00"
CONNACK_5 = b"\x20\x03\x00\x00\x00"
PINGRESP = b"\xd0\x00"


class BareProtocol(asyncio.Protocol):
    __slots__ = ("buffer", "transport")

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        buf = self.buffer + data if self.buffer else data
        while len(buf) >= 2:
            length, shift, i = 0, 0, 1
            while True:  # the remaining length (variable byte integer)
                if i >= len(buf):
                    self.buffer = buf
                    return
                byte = buf[i]
                length |= (byte & 0x7F) << shift
                shift += 7
                i += 1
                if not byte & 0x80:
                    break
            end = i + length
            if len(buf) < end:
                break
            kind = buf[0] >> 4
            assert self.transport is not None
            if kind == 1:  # CONNECT: protocol level at offset 6 of the variable header (after "MQTT")
                self.transport.write(CONNACK_5 if buf[i + 6] >= 5 else CONNACK)
            elif kind == 12:
                self.transport.write(PINGRESP)
            elif kind == 14:
                self.transport.close()
                return
            buf = buf[end:]
        self.buffer = buf


async def serve(host: str, port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(BareProtocol, host, port, backlog=4096)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m loadtest.bare_broker", description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    args = ap.parse_args(argv)
    uvloop.run(serve(args.host, args.port))


if __name__ == "__main__":
    main()
