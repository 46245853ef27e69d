"""What a persistent session that never returns costs a node: RSS and disk per offline session.

`python -m loadtest.offline_sessions [--sessions 10000 50000 100000] [--concurrency 64] [--wildcards 0.5]`

For each N: a fresh Tidewire, N clients with random ids connect with clean session off (MQTT 3.1.1), subscribe
once (a share `--wildcards` to a wildcard filter `dev/<id>/+/cmd`, the rest to an exact topic `dev/<id>/cmd`, as
the fuzzer in issue 22 did) and disconnect. Then the node's RSS (after `--settle` s), its data dir's size, and the
same after a graceful restart on the same data: what the node holds for sessions that are offline is the first
RSS minus the second (the second holds only what a start loads).

With caps (`--max-stored-sessions`, `--retained N --max-retained-messages M`): the node runs with them, N retained
messages (distinct topics, QoS 1) are published after the sessions, and what the store holds at the end is counted
from the data dir (sessions, their wildcard filters, retained messages): the flood of issue 22 kept under the caps.
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
from loadtest.client import DISCONNECT, connect_packet, publish_packet, subscribe_packet
from loadtest.redis_proc import terminate
from tidewire.store.embedded.engine import EmbeddedStore

SETTLE_S = 2.0  # after the last DISCONNECT: the node finishes parking the sessions before RSS is read
# With a cap: long enough for housekeeping to evict down to it and for two checks of the stored filters
# (`stored_filters_check_interval`, which the caller may set shorter in the environment).


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

    async def worker() -> None:
        for i in todo:
            cid = "off-" + secrets.token_hex(8)
            await _one(host, port, cid, f"dev/{cid}/+/cmd" if int((i + 1) * wildcards) > int(i * wildcards)
                       else f"dev/{cid}/cmd")

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - started


async def flood_retained(host: str, port: int, n: int, payload: int, window: int = 100) -> int:
    """Publish `n` retained QoS 1 messages on distinct topics, `window` unacknowledged at a time; returns how many
    were acknowledged (a message over a retained cap is acknowledged too, and dropped)."""
    reader, writer = await asyncio.open_connection(host, port)
    body = b"r" * payload
    acked = 0
    try:
        writer.write(connect_packet("retained-flood-" + secrets.token_hex(4)))
        await reader.readexactly(4)
        for start in range(0, n, window):
            batch = range(start, min(n, start + window))
            writer.write(b"".join(publish_packet(f"flood/{i}", body, 1, i % 65535 + 1, retain=True) for i in batch))
            await reader.readexactly(4 * len(batch))  # PUBACKs
            acked += len(batch)
        writer.write(DISCONNECT)
        await writer.drain()
    finally:
        writer.close()
    return acked


async def _stored(data: Path) -> dict[str, int]:
    store = EmbeddedStore(data)
    await store.open()
    try:
        retained, retained_bytes = await store.retained_usage()
        return {"stored_sessions": await store.session_count(),
                "stored_wildcard_filters": len(await store.subscription_filters()),
                "stored_retained": retained, "stored_retained_bytes": retained_bytes}
    finally:
        await store.close()


def measure(n: int, concurrency: int, wildcards: float, max_stored_sessions: int = 0, retained: int = 0,
            max_retained_messages: int = 0, retained_payload: int = 64, settle: float = SETTLE_S) -> dict[str, float]:
    caps = {"TIDEWIRE_PERSISTENT_CLIENT_EXPIRATION": "86400"}  # expiry far off: only a cap removes a session
    if max_stored_sessions:
        caps["TIDEWIRE_MAX_STORED_SESSIONS"] = str(max_stored_sessions)
    if max_retained_messages:
        caps["TIDEWIRE_MAX_RETAINED_MESSAGES"] = str(max_retained_messages)
    server = servers.start_tidewire(core=None, extra_env=caps)
    data = server.workdir / "data"
    try:
        time.sleep(0.5)
        base_kb = server.rss_kb()
        seconds = asyncio.run(park_sessions(server.host, server.port, n, concurrency, wildcards))
        if retained:
            asyncio.run(flood_retained(server.host, server.port, retained, retained_payload))
        time.sleep(settle)
        offline_kb = server.rss_kb()
        print(json.dumps({"sessions": n, "offline_mb": round(offline_kb / 1024, 1)}), flush=True)
        terminate(server.proc, 60.0)
        disk = dir_bytes(data)
        stored = asyncio.run(_stored(data))
        cmd = servers.tidewire_command(server.host, server.port, data)
        server.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=server.workdir,
                                       env=dict(os.environ, TIDEWIRE_LOG_LEVEL="warning", **caps))
        restart_started = time.perf_counter()
        servers.wait_ready(server.host, server.port, server.proc, 900.0)
        restart_s = time.perf_counter() - restart_started
        time.sleep(SETTLE_S)
        restart_kb = server.rss_kb()
        return {"sessions": n, "retained": retained, **{k.removeprefix("TIDEWIRE_").lower(): int(v)
                                                             for k, v in caps.items()}, **stored,
                "park_s": round(seconds, 1), "base_mb": round(base_kb / 1024, 1),
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
    parser.add_argument("--max-stored-sessions", type=int, default=0, help="the node's cap (0: none)")
    parser.add_argument("--retained", type=int, default=0, help="retained messages published after the sessions")
    parser.add_argument("--max-retained-messages", type=int, default=0, help="the node's cap (0: none)")
    parser.add_argument("--retained-payload", type=int, default=64)
    parser.add_argument("--settle", type=float, default=SETTLE_S, help="s after the flood before RSS is read")
    args = parser.parse_args(argv)
    for n in args.sessions:
        print(json.dumps(measure(n, args.concurrency, args.wildcards, args.max_stored_sessions, args.retained,
                                 args.max_retained_messages, args.retained_payload, args.settle)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
