"""AMQP 0-9-1 benchmarks (issue 8): unmodified pika and aio-pika against the Tidewire gateway and RabbitMQ.

`python -m loadtest.amqp_bench --runs 3 [--messages N] [--size B]`: for each run, a fresh server of each
target (Tidewire: `python -m tidewire serve --amqp-port P --rocketmq-port off` on a fresh data dir; RabbitMQ:
Debian's rabbitmq-server 3.10, a private node, see loadtest.rabbit_proc), both pinned to core 0, this load
generator on core 1. Measures, each on its own durable queue bound to `amq.topic` with `bench.<token>.#` (so
RabbitMQ stores every message too: it confirms an unroutable publish without writing it), persistent
messages (delivery-mode 2) of `--size` bytes published to `amq.topic` with routing key `bench.<token>.t1`:
- `pika-confirm`: pika BlockingConnection with confirm_delivery, one publish at a time, each waiting for its
  Basic.Ack (what pika users do).
- `aio-pika-confirm`: aio-pika channel with publisher confirms, `--batch` publishes in flight (gathered).
- `consume`: `--messages` preloaded (aio-pika, confirmed), then one aio-pika consumer at prefetch `--prefetch`
  with manual acks; time from Basic.Consume to the last message received and acked.
Each measure stops early after `--max-seconds`; its rate is then over what was done. Prints every run, the
median per target and the ratio Tidewire/RabbitMQ. Without rabbitmq-server installed it says so and prints
Tidewire's numbers only. `cpu load/server` is CPU time over wall time of this process and of the server.

Measured on the 2-core dev container (other work running at the same time: runs vary by up to 2x),
`python -m loadtest.amqp_bench --runs 3` (10,000 messages of 64 bytes), Tidewire → RabbitMQ 3.10.8, ratio:
  pika-confirm        799 → 927 msgs/s: 0.86 (both wait on an fsync per publish; cpu server ~35%)
  aio-pika-confirm  9,416 → 7,474 msgs/s: 1.26 (500 in flight; the load generator is at 60-90% cpu)
  consume           9,698 → 6,981 msgs/s: 1.39 (prefetch 100, manual acks; lost 0, dup 0)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import aio_pika
import pika

from loadtest import bench, servers
from loadtest.rabbit_proc import RabbitProc, available, free_port, wait_amqp
from loadtest.store_bench import run

MEASURES = ("pika-confirm", "aio-pika-confirm", "consume")
TARGETS = ("tidewire", "rabbitmq")
EXCHANGE = "amq.topic"
SEQ_BYTES = 8  # every body starts with its sequence number, so the consumer can count duplicates and losses
GATEWAY_START_TIMEOUT = 30.0  # s for the gateway's MQTT listener
PORT_TIMEOUT = 15.0  # s for its AMQP/RocketMQ listener once MQTT answers
CLOSE_TIMEOUT = 5.0  # s for closing a client connection


@dataclass(slots=True)
class BenchConfig:
    messages: int = 10_000  # per measure
    size: int = 64  # body bytes (at least SEQ_BYTES)
    batch: int = 500  # aio-pika-confirm: publishes in flight
    prefetch: int = 100  # consume: Basic.Qos prefetch count
    max_seconds: float = 30.0  # per measure


@dataclass(slots=True)
class Measurement:
    measure: str
    target: str
    count: int  # publishes confirmed, or messages received and acked
    seconds: float
    lost: int = 0  # consume: preloaded but not received (within max_seconds)
    dup: int = 0  # consume: received more than once
    load_cpu: float = 0.0  # CPU time of this process / wall time, over the timed part
    server_cpu: float = 0.0  # the same for the server process

    def add_cpu(self, cpu: CpuClock) -> Measurement:
        self.load_cpu, self.server_cpu = cpu.shares(self.seconds)
        return self

    @property
    def rate(self) -> float:
        return self.count / self.seconds if self.seconds > 0 else 0.0

    def line(self) -> str:
        extra = f", lost {self.lost:,}, dup {self.dup:,}" if self.measure == "consume" else ""
        return (f"{self.measure:<17} {self.target:<9} {self.rate:>11,.0f} msgs/s ({self.count:,} in "
                f"{self.seconds:.2f} s{extra}; cpu load {self.load_cpu:.0%} server {self.server_cpu:.0%})")


class CpuClock:
    """CPU seconds of this process and of the server between `start()` and `shares()`."""

    def __init__(self, server_pid: int) -> None:
        self.server_pid = server_pid
        self.load0 = self.server0 = 0.0

    def _server(self) -> float:
        try:
            return servers.cpu_seconds(self.server_pid)
        except (OSError, ValueError, IndexError):
            return 0.0  # the server has gone: its share reads 0

    def start(self) -> CpuClock:
        t = os.times()
        self.load0, self.server0 = t.user + t.system, self._server()
        return self

    def shares(self, wall: float) -> tuple[float, float]:
        t = os.times()
        if wall <= 0:
            return 0.0, 0.0
        return (t.user + t.system - self.load0) / wall, (self._server() - self.server0) / wall


@dataclass(slots=True)
class Target:
    """An AMQP server under test; `stop` ends it."""

    name: str
    host: str
    port: int
    pid: int  # the server process whose CPU time is reported (beam.smp for RabbitMQ)
    stop: Callable[[], None] = field(repr=False)

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@{self.host}:{self.port}/%2F"


# --- servers ---------------------------------------------------------------------------------------------------
def start_gateway(host: str = "127.0.0.1", *, amqp_port: int | None = None, rocketmq_port: int | None = None,
                  core: int | None = servers.SERVER_CORE) -> servers.Server:
    """`python -m tidewire serve` on a fresh data dir with these backend ports (None: off); returns once MQTT
    and each enabled backend port answer."""
    workdir = Path(tempfile.mkdtemp(prefix="loadtest-tidewire-"))
    env = dict(os.environ)
    env.setdefault("TIDEWIRE_LOG_LEVEL", "warning")
    port = servers.free_port(host)
    cmd = servers.tidewire_command(host, port, workdir / "data")
    cmd = [*servers._pin_prefix(core), *with_option(with_option(cmd, "--amqp-port", str(amqp_port or "off")),
                                                    "--rocketmq-port", str(rocketmq_port or "off"))]
    server = servers._spawn("tidewire", cmd, host, port, workdir, "tidewire", env=env,
                            timeout=GATEWAY_START_TIMEOUT)
    try:
        if amqp_port:
            wait_amqp(host, amqp_port, server.proc, PORT_TIMEOUT)
        if rocketmq_port:
            wait_listening(host, rocketmq_port, server.proc, PORT_TIMEOUT)
    except BaseException as e:
        tail = server.log_tail()
        server.stop()
        raise RuntimeError(f"tidewire's backend port did not answer ({e}); command: {' '.join(cmd)}\n{tail}") from e
    return server


def with_option(cmd: list[str], name: str, value: str) -> list[str]:
    """`cmd` with option `name` set to `value`: replaced where the command already has it, else appended."""
    if name in cmd:
        i = cmd.index(name)
        return [*cmd[:i + 1], value, *cmd[i + 2:]]
    return [*cmd, name, value]


def wait_listening(host: str, port: int, proc: subprocess.Popen[bytes], timeout: float) -> None:
    """Poll until a TCP connect succeeds (a gRPC listener says nothing first); fail fast if `proc` exits."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=1.0):
                return
        except OSError:
            pass
        if proc.poll() is not None:
            raise RuntimeError(f"exited with code {proc.returncode} before {host}:{port} accepted connections")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{host}:{port} did not accept connections within {timeout:.0f} s")
        time.sleep(0.05)


@contextmanager
def start_target(name: str, *, core: int | None = servers.SERVER_CORE, host: str = "127.0.0.1") -> Iterator[Target]:
    """A fresh `tidewire` gateway (AMQP on a free port, RocketMQ off) or `rabbitmq` node, stopped on exit."""
    if name == "tidewire":
        port = free_port(host)
        server = start_gateway(host, amqp_port=port, core=core)
        target = Target(name, host, port, server.pid, server.stop)
    elif name == "rabbitmq":
        rabbit = RabbitProc(prefix=servers._pin_prefix(core), host=host).start()
        target = Target(name, host, rabbit.port, rabbit.pid, rabbit.stop)
    else:
        raise ValueError(f"unknown target {name!r}")
    try:
        yield target
    finally:
        target.stop()


# --- measures --------------------------------------------------------------------------------------------------
def _body(seq: int, size: int) -> bytes:
    return seq.to_bytes(SEQ_BYTES, "big") + b"x" * max(0, size - SEQ_BYTES)


def pika_confirm(target: Target, cfg: BenchConfig, token: str) -> Measurement:
    """One BlockingConnection, confirm_delivery, one persistent publish at a time (basic_publish returns once
    the broker acked it)."""
    conn = pika.BlockingConnection(pika.URLParameters(target.url))
    try:
        ch = conn.channel()
        queue = f"bench-pika-{token}"
        ch.queue_declare(queue, durable=True)
        ch.queue_bind(queue, EXCHANGE, f"bench.{token}.#")
        ch.confirm_delivery()
        props = pika.BasicProperties(delivery_mode=2)
        key = f"bench.{token}.t1"
        n = 0
        cpu = CpuClock(target.pid).start()
        t0 = time.perf_counter()
        deadline = t0 + cfg.max_seconds
        while n < cfg.messages and time.perf_counter() < deadline:
            ch.basic_publish(EXCHANGE, key, _body(n, cfg.size), props)
            n += 1
        measured = Measurement("pika-confirm", target.name, n, time.perf_counter() - t0).add_cpu(cpu)
    finally:
        if conn.is_open:
            conn.close()
    return measured


async def _publish_confirmed(exchange: aio_pika.abc.AbstractExchange, key: str, cfg: BenchConfig,
                             deadline: float) -> int:
    """Persistent publishes in gathered batches of cfg.batch, each awaiting its confirm; returns how many."""
    n = 0
    while n < cfg.messages and time.perf_counter() < deadline:
        k = min(cfg.batch, cfg.messages - n)
        await asyncio.gather(*(
            exchange.publish(aio_pika.Message(_body(n + i, cfg.size), delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                             key)
            for i in range(k)))
        n += k
    return n


async def _bound_queue(channel: aio_pika.abc.AbstractChannel, name: str, token: str) -> None:
    queue = await channel.declare_queue(name, durable=True)
    await queue.bind(EXCHANGE, f"bench.{token}.#")


async def aio_pika_confirm(target: Target, cfg: BenchConfig, token: str) -> Measurement:
    conn = await aio_pika.connect(target.url)
    try:
        ch = await conn.channel(publisher_confirms=True)
        await _bound_queue(ch, f"bench-aio-{token}", token)
        exchange = await ch.get_exchange(EXCHANGE, ensure=False)
        cpu = CpuClock(target.pid).start()
        t0 = time.perf_counter()
        n = await _publish_confirmed(exchange, f"bench.{token}.t1", cfg, t0 + cfg.max_seconds)
        measured = Measurement("aio-pika-confirm", target.name, n, time.perf_counter() - t0).add_cpu(cpu)
    finally:
        await asyncio.wait_for(conn.close(), CLOSE_TIMEOUT)
    return measured


async def consume(target: Target, cfg: BenchConfig, token: str) -> Measurement:
    """Preload cfg.messages into a bound durable queue, then consume them at prefetch cfg.prefetch, acking each."""
    conn = await aio_pika.connect(target.url)
    try:
        pub = await conn.channel(publisher_confirms=True)
        name = f"bench-consume-{token}"
        await _bound_queue(pub, name, token)
        exchange = await pub.get_exchange(EXCHANGE, ensure=False)
        preloaded = await _publish_confirmed(exchange, f"bench.{token}.t1", cfg,
                                             time.perf_counter() + cfg.max_seconds)
        ch = await conn.channel()
        await ch.set_qos(prefetch_count=cfg.prefetch)
        queue = await ch.declare_queue(name, durable=True)
        seen: set[int] = set()
        received = 0
        done = asyncio.Event()

        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            nonlocal received
            await message.ack()
            received += 1
            seen.add(int.from_bytes(message.body[:SEQ_BYTES], "big"))
            if len(seen) >= preloaded:
                done.set()

        cpu = CpuClock(target.pid).start()
        t0 = time.perf_counter()
        tag = await queue.consume(on_message, no_ack=False)
        try:
            await asyncio.wait_for(done.wait(), cfg.max_seconds)
        except TimeoutError:
            pass
        measured = Measurement("consume", target.name, received, time.perf_counter() - t0,
                               lost=preloaded - len(seen), dup=received - len(seen)).add_cpu(cpu)
        await queue.cancel(tag)
    finally:
        await asyncio.wait_for(conn.close(), CLOSE_TIMEOUT)
    return measured


def run_measures(target: Target, measures: Sequence[str], cfg: BenchConfig) -> list[Measurement]:
    """Each measure on its own queue and routing keys (a fresh token), in the order given."""
    out: list[Measurement] = []
    for measure in measures:
        token = secrets.token_hex(4)
        if measure == "pika-confirm":
            out.append(pika_confirm(target, cfg, token))
        elif measure == "aio-pika-confirm":
            out.append(run(aio_pika_confirm(target, cfg, token)))
        elif measure == "consume":
            out.append(run(consume(target, cfg, token)))
        else:
            raise ValueError(f"unknown measure {measure!r}")
    return out


# --- report ----------------------------------------------------------------------------------------------------
def median_line(measure: str, target: str, runs: list[Measurement]) -> str:
    rates = [m.rate for m in runs]
    extra = ""
    if measure == "consume":
        extra = f"; lost {sum(m.lost for m in runs):,}, dup {sum(m.dup for m in runs):,}"
    return (f"median       {measure:<17} {target:<9} {statistics.median(rates):>11,.0f} msgs/s (median of {len(runs)};"
            f" runs {', '.join(f'{r:,.0f}' for r in rates)}{extra}; {cpu_medians(runs)})")


def cpu_medians(runs: list[Measurement]) -> str:
    return (f"cpu load {statistics.median(m.load_cpu for m in runs):.0%} server "
            f"{statistics.median(m.server_cpu for m in runs):.0%}")


def ratio_line(measure: str, tide: list[Measurement], rabbit: list[Measurement]) -> str:
    t = statistics.median(m.rate for m in tide)
    r = statistics.median(m.rate for m in rabbit)
    if not r:
        return f"ratio        {measure:<17} rabbitmq's median is 0, no ratio"
    return f"ratio        {measure:<17} tidewire/rabbitmq = {t / r:.2f} (msgs/s, higher is better)"


def report(results: dict[tuple[str, str], list[Measurement]], measures: Sequence[str],
           targets: Sequence[str]) -> list[str]:
    lines: list[str] = []
    for measure in measures:
        for target in targets:
            runs = results.get((measure, target), [])
            if runs:
                lines.append(median_line(measure, target, runs))
        tide, rabbit = results.get((measure, "tidewire"), []), results.get((measure, "rabbitmq"), [])
        if tide and rabbit:
            lines.append(ratio_line(measure, tide, rabbit))
    return lines


def compare(targets: Sequence[str], measures: Sequence[str], cfg: BenchConfig, runs: int, *,
            core: int | None) -> tuple[dict[tuple[str, str], list[Measurement]], bool]:
    """`runs` rounds, each with a fresh server per target; prints every measurement as it comes. Returns the
    measurements and whether everything ran."""
    results: dict[tuple[str, str], list[Measurement]] = {}
    ok = True
    for i in range(1, runs + 1):
        for target in targets:
            try:
                with start_target(target, core=core) as t:
                    for m in run_measures(t, measures, cfg):
                        results.setdefault((m.measure, target), []).append(m)
                        print(f"{f'run {i}/{runs}':<12} {m.line()}", flush=True)
            except Exception as e:  # one broken target must not hide the other's numbers
                ok = False
                print(f"error        {target} run {i}: {str(e)[-3000:]}", file=sys.stderr, flush=True)
    return results, ok


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m loadtest.amqp_bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    d = BenchConfig()
    ap.add_argument("--runs", type=int, default=3, help="fresh servers per target; the median is reported")
    ap.add_argument("--messages", type=int, default=d.messages, help="messages per measure")
    ap.add_argument("--size", type=int, default=d.size, help=f"body bytes (>= {SEQ_BYTES})")
    ap.add_argument("--batch", type=int, default=d.batch, help="aio-pika-confirm: publishes in flight")
    ap.add_argument("--prefetch", type=int, default=d.prefetch, help="consume: Basic.Qos prefetch count")
    ap.add_argument("--max-seconds", type=float, default=d.max_seconds, help="a measure stops after this")
    ap.add_argument("--measures", default=",".join(MEASURES))
    ap.add_argument("--targets", default=",".join(TARGETS))
    ap.add_argument("--no-pin", action="store_true", help="do not pin servers/load to cores 0/1")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.size < SEQ_BYTES or args.messages < 1 or args.batch < 1 or args.prefetch < 1:
        print(f"--size must be >= {SEQ_BYTES}; --messages, --batch and --prefetch >= 1", file=sys.stderr)
        return 2
    measures = [m for m in args.measures.split(",") if m]
    targets = [t for t in args.targets.split(",") if t]
    unknown = [*(m for m in measures if m not in MEASURES), *(t for t in targets if t not in TARGETS)]
    if unknown:
        print(f"unknown measures/targets: {', '.join(unknown)}", file=sys.stderr)
        return 2
    bench.raise_nofile()
    pinned = not args.no_pin and bench.pin_self(bench.LOAD_CORE)
    print(f"# python -m loadtest.amqp_bench {' '.join(sys.argv[1:] if argv is None else argv)}\n"
          f"# cores {os.cpu_count()}; server core {servers.SERVER_CORE if pinned else 'unpinned'}, load core "
          f"{bench.LOAD_CORE if pinned else 'unpinned'}", flush=True)
    if "rabbitmq" in targets and not available():
        print("rabbitmq-server not installed: Tidewire's numbers only, no comparison", flush=True)
        targets.remove("rabbitmq")
    cfg = BenchConfig(messages=args.messages, size=args.size, batch=args.batch, prefetch=args.prefetch,
                      max_seconds=args.max_seconds)
    results, ok = compare(targets, measures, cfg, args.runs, core=servers.SERVER_CORE if pinned else None)
    for line in report(results, measures, targets):
        print(line, flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
