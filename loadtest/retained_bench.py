"""A wildcard subscribe over many retained messages: time to SUBACK, time until every one arrived, the node's RSS.

`python -m loadtest.retained_bench [--retained 1000000] [--payload 16] [--qos 1]`

A fresh Tidewire takes `--retained` retained publishes (QoS 0, pipelined, then one QoS 1 whose PUBACK says all
are stored) on topics `r/<i // 1000>/<i % 1000>`; then one client subscribes to `r/#` at `--qos` and acks each
message as it comes (a QoS 1 subscriber's window is the node's `max_inflight`): the report has the SUBACK
latency, the seconds until the last message, how many arrived (and how many twice), and the node's RSS before
the subscribe and its peak during the delivery, sampled every 0.1 s, plus the data dir's size.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Sequence
from pathlib import Path

from loadtest import servers
from loadtest.client import ConnackRefused, Counters, connect, connect_packet, publish_packet

SAMPLE_S = 0.1
CHUNK = 1000  # publishes per write while flooding


def topic(i: int) -> str:
    return f"r/{i // 1000}/{i % 1000}"


async def flood(host: str, port: int, n: int, payload: bytes) -> float:
    started = time.perf_counter()
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(connect_packet("retained-flood"))
    await reader.readexactly(4)
    for start in range(0, n, CHUNK):
        writer.write(b"".join(_retained(topic(i), payload) for i in range(start, min(n, start + CHUNK))))
        await writer.drain()
    writer.write(_retained("r-done", b"", qos=1))
    await reader.readexactly(4)  # PUBACK: every publish before it is stored
    writer.close()
    return time.perf_counter() - started


def _retained(name: str, payload: bytes, qos: int = 0) -> bytes:
    packet = bytearray(publish_packet(name, payload, qos, 1 if qos else 0))
    packet[0] |= 0x01  # RETAIN
    return bytes(packet)


async def subscribe_all(host: str, port: int, n: int, qos: int, pid: int) -> dict[str, float]:
    counters = Counters(max_samples=0)
    for _ in range(600):  # right after the flood the node may refuse while its event loop lags (code 3)
        try:
            conn = await connect(host, port, "retained-sub", counters)
            break
        except ConnackRefused:
            await asyncio.sleep(0.1)
    else:
        raise RuntimeError("the node refused the subscriber for 60 s")
    rss_before = servers.rss_kb(pid)
    started = time.perf_counter()
    await conn.subscribe("r/#", qos)
    suback_s = time.perf_counter() - started
    peak = rss_before
    last_change, last = time.perf_counter(), 0
    while counters.received < n:
        await asyncio.sleep(SAMPLE_S)
        peak = max(peak, servers.rss_kb(pid))
        if counters.received != last:
            last_change, last = time.perf_counter(), counters.received
        elif time.perf_counter() - last_change > 30:
            break  # nothing for 30 s: report what came
    total_s = time.perf_counter() - started
    conn.close()
    return {"suback_ms": round(suback_s * 1000, 1), "delivery_s": round(total_s, 1), "received": counters.received,
            "per_s": round(counters.received / total_s), "rss_before_mb": round(rss_before / 1024, 1),
            "rss_peak_mb": round(peak / 1024, 1)}


def run(n: int, payload_size: int, qos: int) -> dict[str, float]:
    server = servers.start_tidewire(core=None, extra_env={"TIDEWIRE_LOG_LEVEL": "warning"})
    try:
        flood_s = asyncio.run(flood(server.host, server.port, n, b"x" * payload_size))
        result: dict[str, float] = {"retained": n, "payload": payload_size, "qos": qos, "flood_s": round(flood_s, 1)}
        result.update(asyncio.run(subscribe_all(server.host, server.port, n, qos, server.pid)))
        data = server.workdir / "data"
        result["disk_mb"] = round(sum(f.stat().st_size for f in Path(data).rglob("*") if f.is_file()) / 1e6, 1)
        return result
    finally:
        server.stop(30.0)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--retained", type=int, default=1_000_000)
    parser.add_argument("--payload", type=int, default=16)
    parser.add_argument("--qos", type=int, choices=(0, 1), default=1)
    args = parser.parse_args(argv)
    print(json.dumps(run(args.retained, args.payload, args.qos)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
