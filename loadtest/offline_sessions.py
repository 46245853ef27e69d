"""What a persistent session that never returns costs a node: RSS and disk per offline session.

`python -m loadtest.offline_sessions [--sessions 10000 50000 100000] [--concurrency 64] [--wildcards 0.5]`

For each N: a fresh Tidewire, N clients with random ids connect with clean session off (MQTT 3.1.1), subscribe
once (a share `--wildcards` to a wildcard filter `dev/<id>/+/cmd`, the rest to an exact topic `dev/<id>/cmd`, as
the fuzzer in issue 22 did) and disconnect. Then the node's RSS (after SETTLE_S), its data dir's size, and the
same after a graceful restart on the same data: what the node holds for sessions that are offline is the first
RSS minus the second (the second holds only what a start loads).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from loadtest import servers
from loadtest.client import DISCONNECT, connect_packet, subscribe_packet
from loadtest.redis_proc import terminate

SETTLE_S = 2.0  # after the last DISCONNECT: the node finishes parking the sessions before RSS is read


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


async def _one(host: str, port: int, client_id: str, topic_filter: str) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(connect_packet(client_id, clean=False) + subscribe_packet(1, topic_filter, 1))
        await reader.readexactly(4)  # CONNACK
        await reader.readexactly(5)  # SUBACK with one code
        writer.write(DISCONNECT)
        await writer.drain()
    finally:
        writer.close()


async def park_sessions(host: str, port: int, n: int, concurrency: int, wildcards: float) -> float:
    """Connect, subscribe and leave `n` persistent sessions; returns the seconds taken."""
    started = time.perf_counter()
    todo = iter(range(n))
    cut = int(n * wildcards)

    async def worker() -> None:
        for i in todo:
            cid = "off-" + secrets.token_hex(8)
            await _one(host, port, cid, f"dev/{cid}/+/cmd" if i < cut else f"dev/{cid}/cmd")

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - started


def measure(n: int, concurrency: int, wildcards: float) -> dict[str, float]:
    server = servers.start_tidewire(core=None)
    data = server.workdir / "data"
    try:
        time.sleep(0.5)
        base_kb = server.rss_kb()
        seconds = asyncio.run(park_sessions(server.host, server.port, n, concurrency, wildcards))
        time.sleep(SETTLE_S)
        offline_kb = server.rss_kb()
        print(json.dumps({"sessions": n, "offline_mb": round(offline_kb / 1024, 1)}), flush=True)
        terminate(server.proc, 60.0)
        disk = dir_bytes(data)
        cmd = servers.tidewire_command(server.host, server.port, data)
        server.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=server.workdir,
                                       env=dict(os.environ, TIDEWIRE_LOG_LEVEL="warning"))
        restart_started = time.perf_counter()
        servers.wait_ready(server.host, server.port, server.proc, 900.0)
        restart_s = time.perf_counter() - restart_started
        time.sleep(SETTLE_S)
        restart_kb = server.rss_kb()
        return {"sessions": n, "park_s": round(seconds, 1), "base_mb": round(base_kb / 1024, 1),
                "offline_mb": round(offline_kb / 1024, 1), "restarted_mb": round(restart_kb / 1024, 1),
                "bytes_per_offline_session": round((offline_kb - base_kb) * 1024 / n),
                "held_for_offline_mb": round((offline_kb - restart_kb) / 1024, 1),
                "restart_s": round(restart_s, 1), "disk_mb": round(disk / 1e6, 1),
                "disk_bytes_per_session": round(disk / n)}
    finally:
        server.stop(30.0)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, nargs="+", default=[10_000, 50_000, 100_000])
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--wildcards", type=float, default=0.5, help="share of sessions with a wildcard filter")
    args = parser.parse_args(argv)
    for n in args.sessions:
        print(json.dumps(measure(n, args.concurrency, args.wildcards)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
