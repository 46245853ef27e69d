"""The lake benchmark's MQTT clients: JSON telemetry publishers and a subscriber that measures their latency."""

from __future__ import annotations

import asyncio
import time

from loadtest.client import (
    _PID_BYTES,
    Counters,
    Endpoint,
    MqttConn,
    Publisher,
    connect_packet,
    encode_str,
    encode_varint,
    packet_at,
)

MAX_LATENCY_SAMPLES = 2_000_000


class JsonPublisher(Publisher):
    """One device's telemetry: `{"ts":<time_us>,"seq":N,"temperature":T,"humidity":H}` (valid JSON, numeric
    fields for the lake's `json_numbers`); `ts` lets a subscriber measure latency."""

    __slots__ = ("_var",)

    def __init__(self, counters: Counters, topic: str, qos: int, pub_id: int, window: int) -> None:
        super().__init__(counters, topic, qos, pub_id, 0, window)
        self._var = encode_str(topic)

    def batch(self, n: int) -> bytes:
        ts = time.time_ns() // 1000
        first = bytes((0x30 | (self.qos << 1),))
        var, seq, pid, qos = self._var, self.seq, self._pid, self.qos
        parts: list[bytes] = []
        for _ in range(n):
            seq += 1
            payload = b'{"ts":%d,"seq":%d,"temperature":%.1f,"humidity":%d}' % (
                ts, seq, 15.0 + (seq * 7 % 300) / 10, 30 + seq % 50)
            head = var
            if qos:
                pid = pid % 65535 + 1
                head = var + _PID_BYTES[pid]
            parts += (first, encode_varint(len(head) + len(payload)), head, payload)
        self.seq, self._pid = seq, pid
        if qos:
            self.inflight += n
        self.counters.sent += n
        return b"".join(parts)


class LatencySubscriber(MqttConn):
    """A QoS 0 subscriber that reads `ts` from each telemetry payload (its own parse: the JSON has no binary
    header for MqttConn's)."""

    __slots__ = ("samples_us",)

    def __init__(self, counters: Counters) -> None:
        super().__init__(counters)
        self.samples_us: list[int] = []

    def data_received(self, data: bytes) -> None:
        if self._buf:
            data, self._buf = self._buf + data, b""
        now_us = time.time_ns() // 1000
        i = 0
        while (parsed := packet_at(data, i)) is not None:
            first, j, end = parsed
            kind = first >> 4
            if kind == 3:
                p = j + 2 + ((data[j] << 8) | data[j + 1]) + (2 if first & 0x06 else 0)
                self.counters.received += 1
                if data.startswith(b'{"ts":', p) and len(self.samples_us) < MAX_LATENCY_SAMPLES:
                    comma = data.find(b",", p + 6, end)
                    if comma > 0:
                        self.samples_us.append(now_us - int(data[p + 6:comma]))
            elif kind in (2, 9):  # CONNACK, SUBACK: handled as MqttConn does
                super().data_received(data[i:end])
            i = end
        self._buf = data[i:]


async def subscribe_latency(ep: Endpoint, name: str, topic_filter: str) -> LatencySubscriber:
    """A connected LatencySubscriber of `topic_filter` (QoS 0)."""
    loop = asyncio.get_running_loop()
    _, sub = await loop.create_connection(lambda: LatencySubscriber(Counters()), ep.host, ep.port)
    sub.write(connect_packet(name))
    await asyncio.wait_for(sub.connack, 10)
    if await asyncio.wait_for(sub.subscribe(topic_filter, 0), 10) >= 0x80:
        sub.close()
        raise RuntimeError("subscription refused")
    return sub
