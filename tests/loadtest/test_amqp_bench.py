"""Smoke runs of the AMQP and RocketMQ benchmarks with tiny sizes against real servers: a private RabbitMQ node
(skipped when rabbitmq-server is not installed) and the Tidewire gateway, and the report lines."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from loadtest import amqp_bench, rabbit_proc, rocketmq_bench
from loadtest.amqp_bench import BenchConfig, Measurement

pytestmark = pytest.mark.timeout(60)
needs_rabbitmq = pytest.mark.skipif(not rabbit_proc.available(), reason="rabbitmq-server not installed")

TINY = BenchConfig(messages=120, size=32, batch=40, prefetch=10, max_seconds=10.0)
TINY_ROCKET = rocketmq_bench.RocketConfig(messages=60, size=16, threads=2, window=16, batch=8, receive_await=1,
                                          max_seconds=10.0)


def check_amqp(results: list[Measurement], target: str) -> None:
    assert [m.measure for m in results] == list(amqp_bench.MEASURES)
    for m in results:
        assert m.target == target
        assert m.count == TINY.messages, m.line()
        assert m.seconds > 0 and m.rate > 0
    consumed = results[-1]
    assert consumed.lost == 0 and consumed.dup == 0


@needs_rabbitmq
def test_rabbitmq_runs_every_measure_and_leaves_no_process_behind() -> None:
    with rabbit_proc.RabbitProc() as rabbit:
        assert rabbit_proc.amqp_answers(rabbit.host, rabbit.port)
        assert rabbit.proc is not None and rabbit.epmd is not None
        started = {**rabbit_proc.descendants(rabbit.proc.pid), rabbit.epmd.pid: "", rabbit.proc.pid: ""}
        beam = rabbit.pid
        assert beam in started and beam != rabbit.proc.pid  # the pid file names beam.smp
        workdir = rabbit.dir
        target = amqp_bench.Target("rabbitmq", rabbit.host, rabbit.port, beam, rabbit.stop)
        check_amqp(amqp_bench.run_measures(target, amqp_bench.MEASURES, TINY), "rabbitmq")
    assert not workdir.exists()
    assert not [pid for pid in started if Path(f"/proc/{pid}").exists()]
    assert not rabbit_proc.amqp_answers(rabbit.host, rabbit.port)


def test_gateway_runs_every_amqp_measure() -> None:
    with amqp_bench.start_target("tidewire", core=None) as target:
        check_amqp(amqp_bench.run_measures(target, amqp_bench.MEASURES, TINY), "tidewire")


def test_gateway_runs_every_rocketmq_measure() -> None:
    before = {t.ident for t in threading.enumerate()}
    port = rabbit_proc.free_port()
    server = amqp_bench.start_gateway(rocketmq_port=port, core=None)
    try:
        results = rocketmq_bench.run_measures(f"127.0.0.1:{port}", rocketmq_bench.MEASURES, TINY_ROCKET,
                                              server.pid)
    finally:
        server.stop()
    # Only the client's one I/O loop thread, shared by all its clients for the life of the process, remains.
    left = [t.name for t in threading.enumerate() if t.ident not in before and t.is_alive()]
    assert set(left) <= {"channel_io_loop_thread"}, left
    assert [m.measure for m in results] == list(rocketmq_bench.MEASURES)
    for m in results:
        assert m.count == TINY_ROCKET.messages, rocketmq_bench.line(m)
        assert m.rate > 0
    assert results[-1].lost == 0 and results[-1].dup == 0


def test_report_prints_medians_and_the_ratio() -> None:
    tide = [Measurement("pika-confirm", "tidewire", n, 1.0) for n in (100, 300, 200)]
    rabbit = [Measurement("pika-confirm", "rabbitmq", n, 1.0) for n in (400, 400, 500)]
    lines = amqp_bench.report({("pika-confirm", "tidewire"): tide, ("pika-confirm", "rabbitmq"): rabbit},
                              ["pika-confirm", "consume"], ["tidewire", "rabbitmq"])
    assert len(lines) == 3
    assert "tidewire" in lines[0] and "200 msgs/s" in lines[0] and "median of 3" in lines[0]
    assert "400 msgs/s" in lines[1]
    assert lines[2].startswith("ratio") and "tidewire/rabbitmq = 0.50" in lines[2]
    only_tide = amqp_bench.report({("consume", "tidewire"): [Measurement("consume", "tidewire", 10, 2.0, lost=1)]},
                                  ["consume"], ["tidewire"])
    assert len(only_tide) == 1 and "lost 1" in only_tide[0]


def test_cli_rejects_bad_sizes(capsys: pytest.CaptureFixture[str]) -> None:
    assert amqp_bench.main(["--size", "4"]) == 2
    assert rocketmq_bench.main(["--measures", "nope"]) == 2
    assert "--size" in capsys.readouterr().err


def test_with_option_replaces_or_appends() -> None:
    assert amqp_bench.with_option(["serve", "--amqp-port", "0", "-v"], "--amqp-port", "5") == \
        ["serve", "--amqp-port", "5", "-v"]
    assert amqp_bench.with_option(["serve"], "--rocketmq-port", "7") == ["serve", "--rocketmq-port", "7"]
