"""RocketMQ 5 benchmarks (issue 8): the unmodified rocketmq-python-client against the Tidewire gateway.

`python -m loadtest.rocketmq_bench --runs 3 [--messages N] [--size B] [--threads T]`: for each run a fresh
gateway (`python -m tidewire serve --rocketmq-port P --amqp-port off`, pinned to core 0; this load generator on
core 1), endpoint 127.0.0.1:P, plain gRPC (the client's `tls_enable` defaults to False: it then builds an
`aio.insecure_channel`; True would use `aio.secure_channel` with default root certificates), no credentials.
Measures, each on its own topic `bench_<token>` (the first MQTT level of what it writes):
- `send-sync`: one Producer shared by `--threads` threads, each calling `send()` (a SendMessage round trip,
  returning the receipt) in a loop.
- `send-async`: one Producer, `send_async()` with `--window` sends in flight (concurrent.futures).
- `receive`: a SimpleConsumer (group `bench_g_<token>`, tag filter `*`) started and polled once, `--messages`
  preloaded with send_async, then `--threads` threads each calling `receive(--batch, invisible 30 s)` and `ack()`
  for every message; time from the first receive to the last message acked.
Producer/consumer start-up (QueryRoute, Telemetry settings) is not timed. Each measure stops early after
`--max-seconds`. There is no RocketMQ broker to compare with (no Java here): Tidewire's numbers only.

Measured on the 2-core dev container (other work running at the same time), `python -m loadtest.rocketmq_bench
--runs 3` (5,000 messages of 64 bytes, 4 threads, window 256, batch 32): send-sync 1,425 msgs/s, send-async
2,122 msgs/s, receive + ack 1,598 msgs/s (lost 0, dup 0); the gateway at 80-97% of its core, the client at
65-95% of its.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass
from typing import Any

from rocketmq.v5.client import ClientConfiguration, Credentials
from rocketmq.v5.consumer import SimpleConsumer
from rocketmq.v5.model import FilterExpression, Message
from rocketmq.v5.producer import Producer

from loadtest import bench, servers
from loadtest.amqp_bench import SEQ_BYTES, CpuClock, Measurement, cpu_medians, start_gateway
from loadtest.rabbit_proc import free_port

MEASURES = ("send-sync", "send-async", "receive")
TAG = "t1"
INVISIBLE_S = 30  # receive: a received message stays invisible to others this long (no redelivery mid-run)
WARMUP_AWAIT_S = 1  # the consumer's first, registering receive long-polls this long at most
REQUEST_TIMEOUT_S = 10  # ClientConfiguration.request_timeout


@dataclass(slots=True)
class RocketConfig:
    messages: int = 5000  # per measure
    size: int = 64  # body bytes (at least SEQ_BYTES)
    threads: int = 4  # send-sync and receive
    window: int = 256  # send-async: sends in flight
    batch: int = 32  # receive: max messages per ReceiveMessage
    receive_await: int = 2  # receive: s of long polling (an idle thread returns this soon after the last message)
    max_seconds: float = 30.0  # per measure


def _body(seq: int, size: int) -> bytes:
    return seq.to_bytes(SEQ_BYTES, "big") + b"x" * max(0, size - SEQ_BYTES)


def _message(topic: str, seq: int, size: int) -> Message:
    # A fresh Message per send: the producer writes the message id into it.
    m = Message()
    m.topic = topic
    m.body = _body(seq, size)
    m.tag = TAG
    return m


def client_config(endpoint: str) -> ClientConfiguration:
    return ClientConfiguration(endpoint, Credentials(), request_timeout=REQUEST_TIMEOUT_S)


def start_producer(endpoint: str, topic: str) -> Producer:
    producer = Producer(client_config(endpoint), (topic,))
    producer.startup()
    return producer


def _send_async(producer: Producer, topic: str, cfg: RocketConfig, deadline: float) -> int:
    """send_async with up to cfg.window in flight; returns how many completed (a failed send raises)."""
    pending: set[Future[Any]] = set()
    sent = done = 0
    while (sent < cfg.messages and time.perf_counter() < deadline) or pending:
        while sent < cfg.messages and len(pending) < cfg.window and time.perf_counter() < deadline:
            pending.add(producer.send_async(_message(topic, sent, cfg.size)))
            sent += 1
        finished, pending = wait(pending, timeout=max(0.0, deadline - time.perf_counter()) + REQUEST_TIMEOUT_S,
                                 return_when=FIRST_COMPLETED)
        if not finished:
            raise TimeoutError(f"{len(pending)} sends got no receipt")
        for f in finished:
            f.result()
            done += 1
    return done


def send_sync(endpoint: str, cfg: RocketConfig, token: str, server_pid: int = 0) -> Measurement:
    topic = f"bench_{token}"
    producer = start_producer(endpoint, topic)
    try:
        counts = [0] * cfg.threads
        errors: list[BaseException] = []
        per_thread = -(-cfg.messages // cfg.threads)
        cpu = CpuClock(server_pid).start()
        t0 = time.perf_counter()
        deadline = t0 + cfg.max_seconds

        def loop(i: int) -> None:
            try:
                for k in range(min(per_thread, cfg.messages - i * per_thread)):
                    if time.perf_counter() > deadline:
                        return
                    producer.send(_message(topic, i * per_thread + k, cfg.size))
                    counts[i] += 1
            except BaseException as e:  # reported by the main thread
                errors.append(e)

        threads = [threading.Thread(target=loop, args=(i,), name=f"bench-send-{i}") for i in range(cfg.threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        measured = Measurement("send-sync", "tidewire", sum(counts), time.perf_counter() - t0).add_cpu(cpu)
    finally:
        producer.shutdown()
    if errors:
        raise RuntimeError(f"send-sync: {errors[0]!r}") from errors[0]
    return measured


def send_async(endpoint: str, cfg: RocketConfig, token: str, server_pid: int = 0) -> Measurement:
    topic = f"bench_{token}"
    producer = start_producer(endpoint, topic)
    try:
        cpu = CpuClock(server_pid).start()
        t0 = time.perf_counter()
        n = _send_async(producer, topic, cfg, t0 + cfg.max_seconds)
        measured = Measurement("send-async", "tidewire", n, time.perf_counter() - t0).add_cpu(cpu)
    finally:
        producer.shutdown()
    return measured


class _Tally:
    """What the receive threads got: distinct sequence numbers, receipts acked, the time of the last one and
    the CPU shares up to it (idle threads then still wait out a long poll: that must not dilute them)."""

    def __init__(self, expected: int, cpu: CpuClock, t0: float) -> None:
        self.expected = expected
        self.cpu = cpu
        self.t0 = t0
        self.lock = threading.Lock()
        self.seen: set[int] = set()
        self.acked = 0
        self.last = 0.0
        self.shares: tuple[float, float] | None = None
        self.errors: list[BaseException] = []

    def add(self, seq: int) -> None:
        with self.lock:
            self.seen.add(seq)
            self.acked += 1
            self.last = time.perf_counter()
            if self.shares is None and len(self.seen) >= self.expected:
                self.shares = self.cpu.shares(self.last - self.t0)

    def complete(self) -> bool:
        with self.lock:
            return len(self.seen) >= self.expected


def stop_consumer(consumer: SimpleConsumer) -> None:
    """shutdown(), and the message decode pool that rocketmq-python-client 5.1.2's shutdown leaves running
    (threads would pile up over runs). Its one shared I/O loop thread (channel_io_loop_thread) is meant to live
    as long as the process."""
    consumer.shutdown()
    pool = getattr(consumer, "_Consumer__message_decode_executor", None)
    if pool is not None:
        pool.shutdown(wait=True)


def receive(endpoint: str, cfg: RocketConfig, token: str, server_pid: int = 0) -> Measurement:
    topic, group = f"bench_{token}", f"bench_g_{token}"
    consumer = SimpleConsumer(client_config(endpoint), group, {topic: FilterExpression()},
                              await_duration=WARMUP_AWAIT_S)
    consumer.startup()
    try:
        # One receive first, so the group exists before the preload whatever position a new group starts at.
        for m in consumer.receive(cfg.batch, INVISIBLE_S):
            consumer.ack(m)
        producer = start_producer(endpoint, topic)
        try:
            preloaded = _send_async(producer, topic, cfg, time.perf_counter() + cfg.max_seconds)
        finally:
            producer.shutdown()
        consumer.await_duration = cfg.receive_await
        cpu = CpuClock(server_pid).start()
        t0 = time.perf_counter()
        tally = _Tally(preloaded, cpu, t0)
        deadline = t0 + cfg.max_seconds

        def loop() -> None:
            try:
                while not tally.complete() and time.perf_counter() < deadline:
                    for m in consumer.receive(cfg.batch, INVISIBLE_S):
                        consumer.ack(m)
                        tally.add(int.from_bytes(m.body[:SEQ_BYTES], "big"))
            except BaseException as e:  # reported by the main thread
                tally.errors.append(e)

        threads = [threading.Thread(target=loop, name=f"bench-receive-{i}") for i in range(cfg.threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        measured = Measurement("receive", "tidewire", tally.acked, time.perf_counter() - t0,
                               lost=preloaded - len(tally.seen), dup=tally.acked - len(tally.seen)).add_cpu(cpu)
        if tally.shares is not None:  # complete: up to the last ack, not the idle threads' last long poll
            measured.seconds = tally.last - t0
            measured.load_cpu, measured.server_cpu = tally.shares
    finally:
        stop_consumer(consumer)
    if tally.errors:
        raise RuntimeError(f"receive: {tally.errors[0]!r}") from tally.errors[0]
    return measured


def run_measures(endpoint: str, measures: Sequence[str], cfg: RocketConfig, server_pid: int = 0) -> list[Measurement]:
    """Each measure on its own topic (a fresh token); `server_pid`: whose CPU time to report (0: none)."""
    funcs = {"send-sync": send_sync, "send-async": send_async, "receive": receive}
    return [funcs[m](endpoint, cfg, secrets.token_hex(4), server_pid) for m in measures]


def median_line(measure: str, runs: list[Measurement]) -> str:
    rates = [m.rate for m in runs]
    extra = f"; lost {sum(m.lost for m in runs):,}, dup {sum(m.dup for m in runs):,}" if measure == "receive" else ""
    return (f"median       {measure:<11} tidewire {statistics.median(rates):>11,.0f} msgs/s (median of {len(runs)}; "
            f"runs {', '.join(f'{r:,.0f}' for r in rates)}{extra}; {cpu_medians(runs)})")


def line(m: Measurement) -> str:
    extra = f", lost {m.lost:,}, dup {m.dup:,}" if m.measure == "receive" else ""
    return (f"{m.measure:<11} tidewire {m.rate:>11,.0f} msgs/s ({m.count:,} in {m.seconds:.2f} s{extra}; cpu load "
            f"{m.load_cpu:.0%} server {m.server_cpu:.0%})")


def compare(measures: Sequence[str], cfg: RocketConfig, runs: int, *,
            core: int | None) -> tuple[dict[str, list[Measurement]], bool]:
    results: dict[str, list[Measurement]] = {}
    ok = True
    for i in range(1, runs + 1):
        port = free_port()
        try:
            server = start_gateway(rocketmq_port=port, core=core)
        except Exception as e:
            print(f"error        tidewire run {i}: {str(e)[-3000:]}", file=sys.stderr, flush=True)
            ok = False
            continue
        try:
            for measure in measures:
                try:
                    m = run_measures(f"127.0.0.1:{port}", [measure], cfg, server.pid)[0]
                except Exception as e:  # the other measures still run
                    ok = False
                    print(f"error        {measure} run {i}: {e!r}\n{server.log_tail()}", file=sys.stderr,
                          flush=True)
                    continue
                results.setdefault(measure, []).append(m)
                print(f"{f'run {i}/{runs}':<12} {line(m)}", flush=True)
        finally:
            server.stop()
    return results, ok


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m loadtest.rocketmq_bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    d = RocketConfig()
    ap.add_argument("--runs", type=int, default=3, help="fresh gateways; the median is reported")
    ap.add_argument("--messages", type=int, default=d.messages, help="messages per measure")
    ap.add_argument("--size", type=int, default=d.size, help=f"body bytes (>= {SEQ_BYTES})")
    ap.add_argument("--threads", type=int, default=d.threads, help="send-sync senders, receive receivers")
    ap.add_argument("--window", type=int, default=d.window, help="send-async: sends in flight")
    ap.add_argument("--batch", type=int, default=d.batch, help="receive: max messages per ReceiveMessage")
    ap.add_argument("--receive-await", type=int, default=d.receive_await, help="receive: s of long polling")
    ap.add_argument("--max-seconds", type=float, default=d.max_seconds, help="a measure stops after this")
    ap.add_argument("--measures", default=",".join(MEASURES))
    ap.add_argument("--no-pin", action="store_true", help="do not pin the gateway/load to cores 0/1")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    measures = [m for m in args.measures.split(",") if m]
    unknown = [m for m in measures if m not in MEASURES]
    counts = (args.messages, args.threads, args.window, args.batch, args.receive_await)
    if unknown or args.size < SEQ_BYTES or min(counts) < 1:
        print(f"unknown measures {unknown}, or --size < {SEQ_BYTES}, or a count < 1", file=sys.stderr)
        return 2
    bench.raise_nofile()
    pinned = not args.no_pin and bench.pin_self(bench.LOAD_CORE)
    print(f"# python -m loadtest.rocketmq_bench {' '.join(sys.argv[1:] if argv is None else argv)}\n"
          f"# cores {os.cpu_count()}; gateway core {servers.SERVER_CORE if pinned else 'unpinned'}, load core "
          f"{bench.LOAD_CORE if pinned else 'unpinned'}; no RocketMQ broker to compare with", flush=True)
    cfg = RocketConfig(messages=args.messages, size=args.size, threads=args.threads, window=args.window,
                       batch=args.batch, receive_await=args.receive_await, max_seconds=args.max_seconds)
    results, ok = compare(measures, cfg, args.runs, core=servers.SERVER_CORE if pinned else None)
    for measure in measures:
        if results.get(measure):
            print(median_line(measure, results[measure]), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
