"""Graceful close end to end: when the server ends a connection (Receive Maximum exceeded, protocol error,
refused CONNECT, malformed input) the client reads the server's last packet before EOF and never gets a reset,
even while it is still sending; the drain is bounded by CLOSE_DRAIN_TIMEOUT; other clients are undisturbed.

Without the drain, closing a socket with unread input makes the kernel send RST, which can destroy the
DISCONNECT or CONNACK still on its way to the client: these tests send far more than the server reads.
"""

from __future__ import annotations

import random
import select
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.integration.conftest import TARGET, GatewayFactory, PahoFactory, write_password_file
from tests.integration.rawmqtt import RawClient
from tests.integration.test_limits import RoundTrips
from tests.waiting import wait_until
from tidewire.gateway.protocols.mqtt.codec import (
    Connack,
    Connect,
    Disconnect,
    Packet,
    PropertyId,
    Puback,
    Publish,
    encode,
)


@dataclass(slots=True)
class Ending:
    packets: list[Packet]
    how: str  # "eof", "reset" (ECONNRESET), or "open" (still open at the timeout)


def read_to_end(raw: RawClient, timeout: float) -> Ending:
    """Every packet the server sends until it closes, and how it closed (a reset is told apart from EOF)."""
    packets: list[Packet] = list(raw.pending)
    raw.pending.clear()
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return Ending(packets, "open")
        raw.sock.settimeout(left)
        try:
            data = raw.sock.recv(65536)
        except TimeoutError:
            continue
        except ConnectionResetError:
            return Ending(packets, "reset")
        if not data:
            return Ending(packets, "eof")
        packets.extend(raw.parser.feed(data))


def send_all(raw: RawClient, data: bytes) -> str | None:
    """Write everything; the error if the server reset the connection or stopped reading without closing."""
    try:
        raw.sock.settimeout(5.0)
        raw.sock.sendall(data)
    except (ConnectionResetError, BrokenPipeError, TimeoutError) as exc:
        return repr(exc)
    return None


def publishes(level: int, count: int, qos: int = 0, topic: str = "noise/t", size: int = 100) -> bytes:
    return b"".join(encode(Publish(topic=topic, payload=b"n" * size, qos=qos, packet_id=i + 1 if qos else 0), level)
                    for i in range(count))


def assert_last_disconnect(end: Ending, reason: int) -> None:
    assert end.packets and isinstance(end.packets[-1], Disconnect), f"no DISCONNECT last: {end.packets[-5:]}"
    got = end.packets[-1].reason_code
    assert got == reason, f"DISCONNECT {got:#x}, expected {reason:#x}"


@pytest.mark.tidewire_only  # Mosquitto acknowledges QoS 1 at once, so its Receive Maximum is never exceeded
def test_receive_maximum_exceeded_disconnect_is_read(gateway_factory: GatewayFactory) -> None:
    gw = gateway_factory(env={"TIDEWIRE_MAX_INBOUND_QOS2": "10"})
    raw = RawClient(gw.port, level=5, timeout=5.0)
    connack = raw.connect("flooder")
    assert connack.properties.get(PropertyId.RECEIVE_MAXIMUM) == 10
    error = send_all(raw, publishes(5, 2000, qos=1, topic="flood/t"))
    assert error is None, f"the server reset the connection while the client was still sending: {error}"
    end = read_to_end(raw, 5.0)
    assert end.how == "eof", f"connection ended by {end.how}; packets {end.packets[-5:]}"
    assert_last_disconnect(end, 0x93)
    assert all(isinstance(p, (Puback, Disconnect)) for p in end.packets), end.packets[:5]
    raw.close()


@pytest.mark.tidewire_only  # Mosquitto 2.0.11 closes at once: the client gets ECONNRESET
@pytest.mark.parametrize("level", [4, 5])
def test_protocol_error_close_while_client_sends(gateway_factory: GatewayFactory, level: int) -> None:
    gw = gateway_factory()
    raw = RawClient(gw.port, level=level, timeout=5.0)
    raw.connect(f"second-connect-{level}")
    noise = publishes(level, 100)  # ~11 KB of QoS 0
    again = encode(Connect(client_id="again", protocol_level=level), level)
    error = send_all(raw, noise + again + noise)
    # a client that has not noticed yet goes on sending for a while
    until = time.monotonic() + 0.3
    while error is None and time.monotonic() < until:
        error = send_all(raw, noise)
        time.sleep(0.01)  # the behaviour under test: the client goes on sending for 0.3 s
    assert error is None, f"the server reset the connection while the client was still sending: {error}"
    end = read_to_end(raw, 5.0)
    assert end.how == "eof", f"connection ended by {end.how}; packets {end.packets[-5:]}"
    if level == 5:
        assert_last_disconnect(end, 0x82)
    else:
        assert not [p for p in end.packets if isinstance(p, Disconnect)], "3.1.1 servers never send DISCONNECT"
    raw.close()


@pytest.mark.tidewire_only  # Mosquitto 2.0.11 sends the CONNACK (5 / 0x87) but closes at once: ECONNRESET
@pytest.mark.parametrize("level", [4, 5])
def test_refused_connack_is_read_despite_early_publishes(gateway_factory: GatewayFactory, tmp_path: Path,
                                                         level: int) -> None:
    passwords = write_password_file(tmp_path / "passwords", {"alice": "right"})
    gw = gateway_factory(password_file=passwords, allow_anonymous=False)
    raw = RawClient(gw.port, level=level, timeout=5.0)
    connect = encode(Connect(client_id=f"refused-{level}", protocol_level=level, username="alice",
                             password=b"wrong"), level)
    # MQTT lets a client send before the CONNACK comes; ~165 KB is more than the server reads before refusing
    error = send_all(raw, connect + publishes(level, 1500))
    assert error is None, f"the server reset the connection while the client was still sending: {error}"
    end = read_to_end(raw, 5.0)
    assert end.how == "eof", f"connection ended by {end.how}; packets {end.packets}"
    assert len(end.packets) == 1 and isinstance(end.packets[0], Connack), end.packets
    refused = {0x86, 0x87} if level == 5 else {4, 5}
    assert end.packets[0].reason_code in refused, f"CONNACK {end.packets[0].reason_code:#x}"
    raw.close()


@pytest.mark.tidewire_only  # Mosquitto has no drain, so nothing to bound
def test_drain_is_bounded_for_a_client_that_never_closes(gateway_factory: GatewayFactory) -> None:
    drain = 1.5
    gw = gateway_factory(env={"TIDEWIRE_CLOSE_DRAIN_TIMEOUT": str(drain)})
    raw = RawClient(gw.port, level=5)
    raw.connect("lingerer")
    raw.send(Connect(client_id="again", protocol_level=5))
    start = time.monotonic()
    packets: list[Packet] = []
    closed_at: float | None = None
    # Trickle a PINGREQ every 100 ms and never close: while the server drains, the bytes are swallowed; once
    # it has really closed, the kernel answers them with RST, which the next send or recv reports.
    while closed_at is None and time.monotonic() - start < drain + 3.0:
        try:
            raw.sock.sendall(b"\xc0\x00")
            readable, _, _ = select.select([raw.sock], [], [], 0.1)
            if readable:
                data = raw.sock.recv(65536)
                packets.extend(raw.parser.feed(data))
        except (ConnectionResetError, BrokenPipeError):
            closed_at = time.monotonic() - start
    raw.close()
    assert closed_at is not None, f"still open {drain + 3.0:.1f}s after the close began (drain {drain}s)"
    assert closed_at <= drain + 1.0, f"closed after {closed_at:.2f}s; the drain is bounded by {drain}s"
    assert closed_at >= 0.5 * drain, f"closed after {closed_at:.2f}s, without draining for {drain}s"
    assert_last_disconnect(Ending(packets, "eof"), 0x82)


@pytest.mark.parametrize("level", [4, 5])
def test_garbage_after_connect_hurts_nobody(gateway_factory: GatewayFactory, paho_factory: PahoFactory,
                                            level: int) -> None:
    gw = gateway_factory()
    bystander = paho_factory(gw.port, "bystander")
    bystander.connect()
    with RoundTrips(bystander, "bystander/rt") as rtts:
        wait_until(lambda: len(rtts.samples) >= 2 or rtts.error is not None, what="round trips before the garbage")
        raw = RawClient(gw.port, level=level, timeout=5.0)
        raw.connect(f"garbage-{level}")
        # packet type 0 (reserved) with an empty body, then 64 KB of noise
        send_all(raw, b"\x00\x00" + random.Random(level).randbytes(64 * 1024))
        end = read_to_end(raw, 3.0)
        raw.close()
        during = len(rtts.samples)
        wait_until(lambda: len(rtts.samples) >= max(5, during + 2) or rtts.error is not None,
                   what="round trips after the garbage")
    assert end.how in ("eof", "reset"), "the server kept a connection sending garbage open"
    if TARGET != "mosquitto":  # Mosquitto 2.0.11 closes without a drain: the client may get ECONNRESET
        assert end.how == "eof", f"connection ended by {end.how}"
        if level == 5:
            last = end.packets[-1] if end.packets else None
            assert isinstance(last, Disconnect) and last.reason_code >= 0x80, f"no DISCONNECT: {end.packets}"
    rtts.check(min_samples=5)
    assert bystander.disconnects.empty(), "an innocent client was disconnected"
    assert gw.alive
