"""Push consumers' invisibility renewal (ReceiveMessage with auto_renew), as the RocketMQ 5 proxy does it: a
message a push consumer works on for longer than the invisible duration is not redelivered to another consumer
of its group, and when that consumer dies (kill -9) what it held goes to another one at once, not after the
duration."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from rocketmq import ConsumeResult, FilterExpression, Message, MessageListener, PushConsumer

from tests.integration.conftest import Gateway, PahoFactory
from tests.waiting import wait_until
from tidewire.gateway.protocols.rocketmq.renewal import RenewalTable
from tidewire.store.base import Claim

from .conftest import Clients

# A push consumer in its own process (so the test can kill -9 it): prints "<body> <attempt>" for each delivery,
# works 7 s on "slow" (over two invisible durations of 3 s) and forever on "stuck".
HOLDER = """
import sys, threading, time
from rocketmq import ClientConfiguration, ConsumeResult, Credentials, FilterExpression, MessageListener, PushConsumer

lock = threading.Lock()

class Listener(MessageListener):
    def consume(self, message):
        with lock:  # one write per line: print's pieces from two consumption threads interleave
            sys.stdout.write(f"{message.body.decode()} {message.delivery_attempt}\\n")
            sys.stdout.flush()
        if message.body == b"slow":
            time.sleep(7)
        elif message.body == b"stuck":
            threading.Event().wait()
        return ConsumeResult.SUCCESS

config = ClientConfiguration(sys.argv[1], Credentials(), request_timeout=3)
consumer = PushConsumer(config, "renew", Listener(), {"a": FilterExpression()}, consumption_thread_count=4)
consumer.startup()
print("ready", flush=True)
threading.Event().wait()
"""


class _Recorder(MessageListener):
    def __init__(self) -> None:
        self.got: queue.Queue[tuple[bytes, int]] = queue.Queue()

    def consume(self, message: Message) -> int:
        self.got.put((message.body, message.delivery_attempt))
        return ConsumeResult.SUCCESS


@pytest.mark.slow  # its own gateway, a consumer process and a 7 s listener
def test_a_long_consumption_is_not_redelivered_and_a_dead_consumers_messages_move(
        rmq_gateway: Callable[..., Gateway], clients: Clients, paho_factory: PahoFactory, tmp_path: Path) -> None:
    gw = rmq_gateway(env={"TIDEWIRE_ROCKETMQ_PUSH_INVISIBLE_SECONDS": "3"})
    out = tmp_path / "holder.out"
    with out.open("wb") as sink:
        holder = subprocess.Popen([sys.executable, "-c", HOLDER, f"127.0.0.1:{gw.rocketmq_port}"], stdout=sink,
                                  stderr=subprocess.STDOUT, env={**os.environ, "HOME": str(tmp_path)})
    try:
        wait_until(lambda: "ready" in out.read_text(), timeout=15, what="the holder consumer")
        wait_until(lambda: "event=rocketmq.subscription group=renew topic=a " in gw.stderr, what="subscription")
        device = paho_factory(gw.port, "device-1")
        device.connect()
        device.publish("a/1", b"slow", qos=1)
        device.publish("a/2", b"stuck", qos=1)
        # The push consumer polls only once its first assignment scan answers (1 s after start, then every 5 s):
        # a loaded machine may miss the first.
        wait_until(lambda: {"slow 1", "stuck 1"} <= set(out.read_text().splitlines()), timeout=30,
                   what=lambda: f"the holder working on both; it printed {out.read_text()!r}\n{gw.stderr[-3000:]}")
        other = _Recorder()
        consumer = PushConsumer(clients.config(gw), "renew", other, {"a": FilterExpression()})
        consumer.startup()
        clients.made.append(consumer)
        # The holder works 7 s on "slow"; "stuck" it never finishes: the node renews both.
        with pytest.raises(queue.Empty):
            other.got.get(timeout=9)
        held = out.read_text().splitlines()
        assert held.count("slow 1") == 1 and held.count("stuck 1") == 1 and len(held) == 3, held
        os.kill(holder.pid, signal.SIGKILL)  # its telemetry stream ends: "stuck" is let go
        holder.wait()
        assert other.got.get(timeout=6) == (b"stuck", 2)
        with pytest.raises(queue.Empty):
            other.got.get(timeout=4)  # "slow" was acknowledged after its 7 s: never redelivered
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


def test_renewal_table_renews_at_half_the_duration_and_gives_up_after_the_maximum() -> None:
    table = RenewalTable(invisible_ms=2000, max_ms=5000, capacity=2)
    assert table.hold("g", "c1", Claim(7, 1, 70), now_ms=0)
    assert table.hold("g", "c2", Claim(8, 1, 80), now_ms=500)
    assert not table.hold("g", "c1", Claim(9, 1, 90), now_ms=500)  # over capacity: it just lapses
    assert table.due(999) == ([], [])
    assert table.due(1000) == ([("g", 7, 70)], [])
    assert table.due(1600) == ([("g", 7, 70), ("g", 8, 80)], [])
    table.held[("g", 7, 70)].visible_at_ms = 6000  # renewed
    assert table.due(5000) == ([("g", 8, 80)], [("g", 7, 70)])  # 7 was renewed for max_ms: given up
    assert table.of_client("c2") == [("g", 8, 80)]
