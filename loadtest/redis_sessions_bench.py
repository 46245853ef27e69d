"""A node joining a cluster whose Redis store holds N stored sessions: is its start flat in N?

    PYTHONPATH=<checkout> python -m loadtest.redis_sessions_bench [--sessions 10k,100k,1m] [--online 100]
        [--json PATH]

For each N: a private `redis-server` (AOF on, `appendfsync no`: the fill is set-up, not the measurement) is
filled with N persistent sessions through the engine's own `RedisStore.put_session` (its scripts and record
encoding; many calls in flight at once), like `loadtest.meta_scale`'s: two subscriptions each
(`devices/<n>/cmd` and one of 1000 wildcard filters `fleet/<k>/+`), half with a finite expiry (deadlines in the
future), all offline but `--online` of them (a fixed number, so the start's work on online sessions does not
grow with N). Then SLOWLOG is reset with every command logged, and `tidewire serve --store <url>` started:

- `ready_s`: from spawn until the node answers an MQTT CONNECT (it listens once its start is done);
- `slowlog_max_us` / `slowlog_commands`: the longest Redis command during the start and how many ran (SLOWLOG
  with `slowlog-log-slower-than 0`; the seal loop's commands after ready count too, a few per 0.1 s);
- `node_rss_mb`: the node's RSS right after ready.

Run it with PYTHONPATH at the checkout under test (the node is started with the same interpreter and path).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

from loadtest.ports import free_port
from loadtest.redis_proc import RedisProc
from loadtest.servers import rss_kb, tidewire_command, wait_ready
from tidewire.store.base import NEVER_EXPIRES, SessionRecord, SubscriptionRecord
from tidewire.store.redis.engine import RedisStore

IN_FLIGHT = 2000  # put_session calls awaited together while filling
READY_TIMEOUT = 1800.0  # s: today's code reads every session at a start
SLOWLOG_LEN = 1_000_000


def count(text: str) -> int:
    text = text.strip().lower()
    mult = {"k": 1000, "m": 1_000_000}.get(text[-1:], 1)
    return int(float(text.rstrip("km")) * mult)


def record(i: int, online: int, now_ms: int) -> SessionRecord:
    subs = {f"devices/{i}/cmd": SubscriptionRecord(f"devices/{i}/cmd", 1, since_seq=0),
            f"fleet/{i % 1000}/+": SubscriptionRecord(f"fleet/{i % 1000}/+", 1, since_seq=0)}
    return SessionRecord(f"client-{i:08d}", 4, 86_400 if i % 2 else NEVER_EXPIRES, subs,
                         disconnected_at_ms=0 if i < online else now_ms, owner="gone-node")


async def fill(url: str, sessions: int, online: int) -> float:
    t0 = time.perf_counter()
    now_ms = int(time.time() * 1000)
    async with RedisStore(url) as store:
        for start in range(0, sessions, IN_FLIGHT):
            records = [record(i, online, now_ms) for i in range(start, min(sessions, start + IN_FLIGHT))]
            if hasattr(store, "put_sessions"):  # pipelined (this build); earlier ones: many calls in flight
                await store.put_sessions(records)
            else:
                await asyncio.gather(*(store.put_session(r) for r in records))
            if start % 100_000 == 0 and start:
                print(f"  {start:>10,} sessions  {time.perf_counter() - t0:7.1f} s", flush=True)
    return time.perf_counter() - t0


def slowlog(client: redis.Redis) -> tuple[int, int, str]:
    """(longest µs, commands logged, the longest one's command) from SLOWLOG GET."""
    entries = client.slowlog_get(SLOWLOG_LEN)
    if not entries:
        return 0, 0, ""
    top = max(entries, key=lambda e: e["duration"])
    command = top["command"]
    text = command.decode(errors="replace") if isinstance(command, bytes) else str(command)
    return int(top["duration"]), len(entries), text[:60]


def start_node(url: str, proc_redis: RedisProc) -> dict[str, Any]:
    host, port = "127.0.0.1", free_port("127.0.0.1")
    workdir = Path(tempfile.mkdtemp(prefix="loadtest-redis-sessions-"))
    env = dict(os.environ)
    env.setdefault("TIDEWIRE_LOG_LEVEL", "warning")
    client = redis.Redis(host=proc_redis.host, port=proc_redis.port)
    client.config_set("slowlog-max-len", SLOWLOG_LEN)
    client.config_set("slowlog-log-slower-than", 0)
    client.slowlog_reset()
    t0 = time.perf_counter()
    with (workdir / "server.log").open("wb") as log:
        proc = subprocess.Popen(tidewire_command(host, port, workdir / "data", store=url), stdout=log,
                                stderr=subprocess.STDOUT, env=env)
    try:
        wait_ready(host, port, proc, timeout=READY_TIMEOUT)
        ready = time.perf_counter() - t0
        rss = rss_kb(proc.pid) / 1024
        client.config_set("slowlog-log-slower-than", -1)
        longest, n, name = slowlog(client)
    finally:
        proc.terminate()
        proc.wait(10)
    return {"ready_s": round(ready, 2), "slowlog_max_us": longest, "slowlog_max_command": name,
            "slowlog_commands": n, "node_rss_mb": round(rss, 1)}


def run(sessions: int, online: int) -> dict[str, Any]:
    with RedisProc(appendfsync="no") as server:
        filled = asyncio.run(fill(server.url, sessions, online))
        used = int(server.info("memory")["used_memory"]) / 2**20
        out: dict[str, Any] = {"sessions": sessions, "online": online, "fill_s": round(filled, 1),
                               "redis_used_mb": round(used, 1)}
        out.update(start_node(server.url, server))
        out["second_start"] = start_node(server.url, server)  # indexes built (or found) by the first start
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", default="10k,100k", help="comma-separated counts (k/m suffixes)")
    ap.add_argument("--online", type=int, default=100, help="stored sessions marked online (fixed, not per N)")
    ap.add_argument("--json", type=Path, help="write the results here too")
    args = ap.parse_args()
    results = []
    for n in (count(s) for s in args.sessions.split(",")):
        print(f"N = {n:,}", flush=True)
        res = run(n, args.online)
        print(json.dumps(res), flush=True)
        results.append(res)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
