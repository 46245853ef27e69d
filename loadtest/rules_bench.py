"""What a rule costs: publish → webhook latency at a steady rate, and the node's QoS 1 fan-in with and without a
rule that sends every message to a webhook, in the same run.

`python -m loadtest.rules_bench [--runs 3] [--rate 1000] [--seconds 5] [--batch 500]`

Tidewire runs on core 0 (taskset), with its rule given through `TIDEWIRE_RULES`. The webhook endpoint is a
minimal asyncio HTTP server in this process, pinned to core 1 with the load:
- **latency**: this process publishes QoS 1 JSON messages `{"t": <perf_counter_ns>}` at `--rate` (one
  connection, paced), the rule `SELECT payload.t AS t FROM "bench/rules/#"` POSTs each (batch_size 1), and the
  endpoint takes `perf_counter_ns()` on arrival: CLOCK_MONOTONIC, the same clock in both processes.
- **fan-in**: the C tool's fan-in (`loadtest.conn_bench`'s, 10 publishers → 1 subscriber, QoS 1, closed loop)
  against a node without a rule, then against one whose rule `SELECT * FROM "#"` sends every message to the
  endpoint in batches of `--batch`; the endpoint counts what it got, so the rule's own lag shows too.
Each (measure, variant, run) gets a fresh node; medians of `--runs`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

from loadtest import conn_bench, servers
from loadtest.bench import LOAD_CORE, pin_self
from loadtest.client import Counters, connect, publish_packet
from loadtest.scenarios import percentiles

TOPIC = "bench/rules/t"
WARMUP = 100  # messages before the measured ones


class Endpoint:
    """An HTTP/1.1 server that answers 200 to every POST and records its JSON bodies' arrival (keep-alive)."""

    def __init__(self) -> None:
        self.arrivals_ns: list[tuple[int, Any]] = []
        self.results = 0
        self.server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                body = await reader.readexactly(length)
                now = time.perf_counter_ns()
                got = json.loads(body)
                self.results += len(got) if isinstance(got, list) else 1
                self.arrivals_ns.append((now, got))
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass  # the client went, or the endpoint stops
        finally:
            writer.close()

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()


def rule(sql: str, url: str, batch: int) -> str:
    return json.dumps([{"name": "bench", "sql": sql, "action": {
        "type": "webhook", "url": url, "batch_size": batch, "timeout": 30, "max_retries": 100}}])


async def _latency_run(rate: float, seconds: float) -> dict[str, Any]:
    endpoint = Endpoint()
    await endpoint.start()
    env = {"TIDEWIRE_RULES": rule(f'SELECT payload.t AS t FROM "{TOPIC}"', f"http://127.0.0.1:{endpoint.port}/",
                                  1)}
    try:
        with servers.start_tidewire(extra_env=env) as server:
            counters = Counters()
            conn = await connect(server.host, server.port, "rules-bench-pub", counters)
            total = WARMUP + int(rate * seconds)
            start = time.perf_counter()
            for i in range(total):
                delay = start + i / rate - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                payload = json.dumps({"t": time.perf_counter_ns()}).encode()
                conn.write(publish_packet(TOPIC, payload, 1, i % 65535 + 1))
            deadline = time.monotonic() + 10
            while len(endpoint.arrivals_ns) < total and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            conn.close()
    finally:
        await endpoint.stop()
    samples = [now - got["t"] for now, got in endpoint.arrivals_ns[WARMUP:] if isinstance(got, dict)]
    p50, p99, _ = percentiles(samples)
    return {"p50_ms": p50, "p99_ms": p99, "received": len(endpoint.arrivals_ns), "sent": total}


# The fan-in variants: no rule; a rule that reads every message and selects none (what its WHERE costs); a rule
# that sends every message to the webhook.
VARIANTS: dict[str, str | None] = {
    "no rule": None,
    "a rule selecting none": "SELECT * FROM \"#\" WHERE clientid = 'nobody'",
    "a rule sending all to a webhook": 'SELECT * FROM "#"',
}


async def _fanin_run(sql: str | None, batch: int, cfg: conn_bench.Config, exe: Any) -> dict[str, Any]:
    endpoint = Endpoint()
    await endpoint.start()
    with_rule = sql is not None
    env = {"TIDEWIRE_RULES": rule(sql, f"http://127.0.0.1:{endpoint.port}/", batch)} if sql is not None else {}
    try:
        with servers.start_tidewire(extra_env=env) as server:
            tool = conn_bench.Tool(exe, server.host, server.port, cfg.load_core, cfg.mqtt5)
            loop = asyncio.get_running_loop()
            result = await loop.run_in_executor(None, conn_bench.measure_fanin, server, tool, cfg)
            received = int(result.get("received", 0))
            deadline = time.monotonic() + 30
            while with_rule and "nobody" not in (sql or "") and endpoint.results < received \
                    and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            result["webhook_results"] = endpoint.results
    finally:
        await endpoint.stop()
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--batch", type=int, default=500)
    args = parser.parse_args(argv)
    pin_self(LOAD_CORE)
    exe = conn_bench.build_tool()
    cfg = conn_bench.Config(seconds=args.seconds)
    latency = []
    fanin: dict[str, list[dict[str, Any]]] = {name: [] for name in VARIANTS}
    for run in range(args.runs):
        r = asyncio.run(_latency_run(args.rate, args.seconds))
        print(f"latency run {run + 1}: p50 {r['p50_ms']:.2f} ms p99 {r['p99_ms']:.2f} ms "
              f"({r['received']} of {r['sent']} posted)", flush=True)
        latency.append(r)
        for name, sql in VARIANTS.items():
            f = asyncio.run(_fanin_run(sql, args.batch, cfg, exe))
            print(f"fan-in run {run + 1}, {name}: {f.get('msgs_per_s', 0):,.0f} msgs/s "
                  f"(received {f.get('received', 0):,}), webhook got {f['webhook_results']:,}", flush=True)
            fanin[name].append(f)

    def med(rows: list[dict[str, Any]], key: str) -> float:
        return statistics.median(float(r.get(key) or 0) for r in rows)

    print(f"\nmedians of {args.runs}: rule latency publish → webhook at {args.rate:,.0f} msgs/s: "
          f"p50 {med(latency, 'p50_ms'):.2f} ms, p99 {med(latency, 'p99_ms'):.2f} ms")
    plain = med(fanin["no rule"], "msgs_per_s")
    for name in VARIANTS:
        rate = med(fanin[name], "msgs_per_s")
        print(f"fan-in QoS 1, {name}: {rate:,.0f} msgs/s ({rate / plain if plain else 0:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
