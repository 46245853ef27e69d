"""What compiling the hot path buys, piece by piece: the same in-process micro-measures with the compiled build
and with its sources (`TIDEWIRE_PURE_PYTHON=1`), each in a fresh interpreter pinned to one core.

`python -m loadtest.compile_bench [--rounds 5] [--core 1]`

Measures (median of rounds, ns per operation):
  parse_publish   `Parser.feed` of 1,000 back-to-back QoS 1 PUBLISH packets (per packet)
  encode_publish  `encode(Publish(...))` of a QoS 1 PUBLISH
  parse_connect   a new `Parser` fed one MQTT 3.1.1 CONNECT
  topic_match     `FilterTrie.match` of one topic against 1,000 filters
  connect         a clean MQTT 3.1.1 connect through a real node on the embedded store, sans IO: CONNECT in,
                  CONNACK out, DISCONNECT in, connection lost (everything a connect costs but the socket)
Which modules are compiled is `tidewire.compiled.MODULES`; the header line says whether the build compiled them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tidewire.compiled import MODULES, PURE_ENV

MEASURES = ("parse_publish", "encode_publish", "parse_connect", "topic_match", "connect")


def _per_op(fn: Callable[[], int], rounds: int) -> float:
    """Median over rounds of ns per operation; `fn` runs once and returns how many operations it did."""
    fn()  # warm up
    results = []
    for _ in range(rounds):
        t0 = time.perf_counter_ns()
        n = fn()
        results.append((time.perf_counter_ns() - t0) / n)
    return statistics.median(results)


def _codec_measures(rounds: int) -> dict[str, float]:
    from tidewire.gateway.protocols.mqtt.codec import Parser, Publish, encode

    one = encode(Publish("devices/abc/telemetry", b"x" * 64, 1, False, False, 7), 4)
    stream = one * 1000
    connect = b"\x10\x16\x00\x04MQTT\x04\x02\x00\x3c\x00\x0aclient-001"

    def parse_publish() -> int:
        for _ in range(20):
            parser = Parser(protocol_level=4)
            parser.feed(stream)
        return 20_000

    def encode_publish() -> int:
        for _ in range(20_000):
            encode(Publish("devices/abc/telemetry", b"x" * 64, 1, False, False, 7), 4)
        return 20_000

    def parse_connect() -> int:
        for _ in range(20_000):
            Parser().feed(connect)
        return 20_000

    return {"parse_publish": _per_op(parse_publish, rounds), "encode_publish": _per_op(encode_publish, rounds),
            "parse_connect": _per_op(parse_connect, rounds)}


def _topic_measure(rounds: int) -> float:
    from tidewire.gateway.core.topics import FilterTrie

    index: FilterTrie[int] = FilterTrie()
    for i in range(1000):
        index.add(f"site/{i % 50}/+/temp/#" if i % 2 else f"site/{i % 50}/dev{i}/+", i)
    topics = [f"site/{i % 50}/dev{i}/temp" for i in range(1000)]

    def match() -> int:
        for topic in topics:
            index.match(topic)
        return len(topics)

    return _per_op(match, rounds)


class _NullIo:
    """A connection that takes whatever the channel writes and closes when asked (`ChannelIo`)."""

    def __init__(self) -> None:
        self.closed = False

    def write(self, data: bytes) -> None:
        pass

    def writelines(self, chunks: list[bytes]) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def end_output(self) -> bool:
        return False

    def set_deadline(self, when: float | None) -> None:
        pass

    def call_later(self, delay: float, callback: Callable[[], None]) -> asyncio.TimerHandle:
        return asyncio.get_running_loop().call_later(delay, callback)

    def certificate_name(self, kind: Any) -> str | None:
        return None


async def _connect_measure(rounds: int) -> float:
    from tidewire.extensions.hooks import AllowAll
    from tidewire.gateway.config import Settings
    from tidewire.gateway.node import Node
    from tidewire.gateway.protocols.mqtt.channel import MqttChannel
    from tidewire.gateway.transport.listeners import make_listener
    from tidewire.lookup.base import InProcessLookup
    from tidewire.notify.base import LocalNotifier
    from tidewire.store.embedded.engine import EmbeddedStore

    with tempfile.TemporaryDirectory(prefix="compile-bench-") as tmp:
        settings = Settings(data_dir=Path(tmp), port=0, node_id="bench")
        store = EmbeddedStore(Path(tmp), fsync="never")
        await store.open()
        lookup = InProcessLookup()
        node = Node(settings, store, lookup, LocalNotifier(lookup), AllowAll())
        await node.start()
        listener = make_listener(settings, "mqtt", node.clock)
        connects = [b"\x10\x16\x00\x04MQTT\x04\x02\x00\x3c\x00\x0a" + b"client-%03d" % i for i in range(1000)]
        disconnect = b"\xe0\x00"
        try:
            def connect() -> int:
                for packet in connects:
                    channel = MqttChannel(node, listener, _NullIo(), "127.0.0.1:5000", node.clock)
                    channel.receive(packet)
                    channel.receive(disconnect)
                    channel.connection_lost("closed")
                return len(connects)

            result = _per_op(connect, rounds)
        finally:
            await node.stop()
            await store.close()
    return result


def measure(rounds: int) -> dict[str, Any]:
    """Every measure in this interpreter, as the build (or TIDEWIRE_PURE_PYTHON) has it."""
    import importlib

    from tidewire.compiled import is_compiled

    compiled = [m for m in MODULES if is_compiled(importlib.import_module(m))]
    out: dict[str, Any] = {"compiled_modules": len(compiled), **_codec_measures(rounds),
                           "topic_match": _topic_measure(rounds)}
    import uvloop

    out["connect"] = uvloop.run(_connect_measure(rounds))
    return out


def run_variant(pure: bool, rounds: int, core: int | None) -> dict[str, Any]:
    env = dict(os.environ)
    env.pop(PURE_ENV, None)
    if pure:
        env[PURE_ENV] = "1"
    env["TIDEWIRE_LOG_LEVEL"] = "warning"
    pin = ["taskset", "-c", str(core)] if core is not None else []
    proc = subprocess.run([*pin, sys.executable, "-m", "loadtest.compile_bench", "--inner", "--rounds", str(rounds)],
                          capture_output=True, text=True, env=env, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def table(compiled: dict[str, Any], pure: dict[str, Any]) -> str:
    lines = [f"{'ns per operation':<16} | {'compiled':>9} | {'pure Python':>11} | speed-up",
             f"{'-' * 16}-+-{'-' * 9}-+-{'-' * 11}-+---------"]
    for key in MEASURES:
        c, p = compiled[key], pure[key]
        lines.append(f"{key:<16} | {c:>9,.0f} | {p:>11,.0f} | {p / c:>7.2f}x")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m loadtest.compile_bench", description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--core", type=int, default=1, help="pin each run to this core (-1: do not pin)")
    ap.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.inner:
        print(json.dumps(measure(args.rounds)))
        return 0
    core = None if args.core < 0 or (os.cpu_count() or 1) <= args.core else args.core
    compiled = run_variant(False, args.rounds, core)
    pure = run_variant(True, args.rounds, core)
    print(f"compiled build: {compiled['compiled_modules']} of {len(MODULES)} hot-path modules compiled "
          f"(pure run: {pure['compiled_modules']})")
    print(table(compiled, pure))
    return 0


if __name__ == "__main__":
    sys.exit(main())
