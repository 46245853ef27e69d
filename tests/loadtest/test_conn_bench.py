"""Smoke runs of the C load tool (`loadtest/mqttload.c`) in each mode, tiny, against a real Tidewire; its
behaviour on a broken peer; and the benchmark's table and CLI."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loadtest import conn_bench, servers
from loadtest.conn_bench import Config, Tool
from tests.waiting import wait_until

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.skipif(not (os.environ.get("CC") or shutil.which("cc")), reason="no C compiler (cc)")]


@pytest.fixture(scope="module")
def exe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return conn_bench.build_tool(tmp_path_factory.mktemp("mqttload"))


@pytest.fixture(scope="module")
def server() -> Iterator[servers.Server]:
    with servers.start_tidewire(core=None) as s:
        yield s


def tool_for(exe: Path, port: int, **kw: Any) -> Tool:
    return Tool(exe, "127.0.0.1", port, core=None, timeout_s=kw.pop("timeout_s", 15.0), **kw)


def check_no_errors(r: dict[str, Any]) -> None:
    assert r["errors"] == 0, r
    assert set(r["error_kinds"].values()) == {0}
    assert r["complete"] is True


def test_build_is_cached_by_source_hash(exe: Path) -> None:
    assert os.access(exe, os.X_OK)
    mtime = exe.stat().st_mtime_ns
    assert conn_bench.build_tool(exe.parent) == exe
    assert exe.stat().st_mtime_ns == mtime  # not rebuilt
    assert not list(exe.parent.glob(".*.tmp"))


@pytest.mark.parametrize("mqtt5", [False, True])
def test_connect_counts_every_connack(exe: Path, server: servers.Server, mqtt5: bool) -> None:
    r = tool_for(exe, server.port, mqtt5=mqtt5).run("connect", "-n", "200", "-c", "20", "--prefix", "t-conn")
    check_no_errors(r)
    assert r["mode"] == "connect" and r["mqtt"] == (5 if mqtt5 else 4)
    assert r["requested"] == r["ok"] == 200 and r["concurrency"] == 20
    assert r["connects_per_s"] == pytest.approx(200 / r["elapsed_s"], rel=0.01)
    assert 0 < r["p50_ms"] <= r["p99_ms"] <= r["p999_ms"] <= r["max_ms"] < 10_000
    assert r["slow_closes"] == 0  # the gateway closes after DISCONNECT


def held_connections(pid: int, port: int) -> int:
    """How many established TCP connections to `port` the process `pid` holds a socket of (not the fds it has:
    a start-up probe's socket closing, or a log file, would count there)."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError), open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "01":  # local port, ESTABLISHED
                    inodes.add(fields[9])
    held = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
            held += link.startswith("socket:[") and link[8:-1] in inodes
    return held


def test_idle_holds_connections_until_released(exe: Path, server: servers.Server) -> None:
    def held() -> int:
        return held_connections(server.pid, server.port)

    before = held()
    seen: dict[str, int] = {}

    def on_up(up: dict[str, Any]) -> None:
        with contextlib.suppress(AssertionError):  # the assertion below says how many
            wait_until(lambda: held() >= before + 100, what="the gateway holding the 100 connections")
        seen["held"] = held()

    r = tool_for(exe, server.port).hold_idle(100, 50, on_up)
    check_no_errors(r)
    assert r["phase"] == "up" and r["ok"] == 100 and r["done_held"] == 100 and r["done_dropped"] == 0
    assert seen["held"] >= before + 100  # the gateway really holds them while the tool waits
    wait_until(lambda: held() <= before, what=lambda: f"the connections released on stdin EOF: {held()} held, "
               f"{before} before")


def test_measure_idle_reports_rss_per_connection(exe: Path, server: servers.Server, monkeypatch: pytest.MonkeyPatch
                                                 ) -> None:
    monkeypatch.setattr(conn_bench, "SETTLE_S", 0.2)
    r = conn_bench.measure_idle(server, tool_for(exe, server.port), Config(idle_connections=100, concurrency=50))
    check_no_errors(r)
    assert r["ok"] == 100
    assert r["rss_before_kb"] > 0 and r["rss_after_kb"] > 0
    assert r["bytes_per_conn"] == pytest.approx((r["rss_after_kb"] - r["rss_before_kb"]) * 1024 / 100, abs=0.1)


def test_latency_qos1_loses_nothing(exe: Path, server: servers.Server) -> None:
    r = tool_for(exe, server.port).run("latency", "--rate", "500", "--seconds", "1", "--prefix", "t-lat")
    check_no_errors(r)
    assert r["qos"] == 1 and r["payload"] == 64
    assert r["sent"] == pytest.approx(500, rel=0.1)
    assert r["received"] == r["acked"] == r["sent"] and r["lost"] == 0 and r["dup"] == 0
    assert 0 < r["p50_us"] <= r["p99_us"] <= r["p999_us"] <= r["max_us"] < 5_000_000


@pytest.mark.parametrize("qos", [0, 1, 2])
def test_fanin_counts_every_publisher_message_once(exe: Path, server: servers.Server, qos: int) -> None:
    persistent = ["--persistent"] if qos == 2 else []  # the QoS 2 load of loadtest.qos2_bench
    r = tool_for(exe, server.port).run("fanin", "-n", "4", "--window", "20", "--seconds", "1", "--qos", str(qos),
                                      "--prefix", f"t-fanin{qos}", *persistent)
    check_no_errors(r)
    assert r["mode"] == "fanin" and r["publishers"] == 4 and r["qos"] == qos
    assert r["sent"] > 100 and r["received"] == r["sent"] and r["lost"] == 0 and r["dup"] == 0 and r["gaps"] == 0
    assert r["acked"] == (r["sent"] if qos else 0)
    assert r["msgs_per_s"] > 0 and 0 < r["p50_ms"] <= r["p99_ms"]


def test_bare_broker_answers_connects_and_holds_idle_connections(exe: Path) -> None:
    with servers.start_bare(core=None) as bare:
        r = tool_for(exe, bare.port).run("connect", "-n", "100", "-c", "10", "--prefix", "t-bare")
        check_no_errors(r)
        assert r["ok"] == 100
        r = tool_for(exe, bare.port, mqtt5=True).run("connect", "-n", "20", "-c", "5", "--prefix", "t-bare5")
        check_no_errors(r)


def test_nothing_listening_is_errors_not_a_hang(exe: Path) -> None:
    port = servers.free_port()
    t0 = time.monotonic()
    r = tool_for(exe, port).run("connect", "-n", "30", "-c", "5")
    assert time.monotonic() - t0 < 5
    assert r["ok"] == 0 and r["errors"] == 30 and r["error_kinds"]["connect"] == 30
    assert "refused" in r["first_error"].lower()


class ScriptedPeer:
    """A listener that answers every connection with fixed bytes, `chunk` bytes at a time: not an MQTT broker,
    the broken or slow peer the tool must survive."""

    def __init__(self, reply: bytes, chunk: int) -> None:
        self.reply, self.chunk = reply, chunk
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = int(self.sock.getsockname()[1])
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            with conn:
                conn.recv(1024)  # the CONNECT
                for i in range(0, len(self.reply), self.chunk):
                    conn.sendall(self.reply[i:i + self.chunk])
                    time.sleep(0.01)  # a slow peer: each chunk arrives on its own
            # closed at once: after a whole CONNACK the tool sees a broker closing after DISCONNECT

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.sock.close()


@pytest.mark.parametrize(("reply", "kind"), [
    (b"\x20\x02\x00\x00", None),             # a CONNACK split over 4 reads
    (b"\x20\x02\x00\x05", "refused"),        # not authorised
    (b"\x20\xff\xff\xff\xff\x01", "protocol"),  # remaining length over 4 bytes
    (b"\x90\x03\x00\x01\x00", "protocol"),   # a SUBACK where the CONNACK belongs
    (b"\x20\x02\x00", "reset"),              # closed mid-packet
])
def test_broken_peer_is_a_clear_error(exe: Path, reply: bytes, kind: str | None) -> None:
    peer = ScriptedPeer(reply, chunk=1)
    try:
        r = tool_for(exe, peer.port).run("connect", "-n", "3", "-c", "1", "--conn-timeout", "3")
    finally:
        peer.close()
    if kind is None:
        check_no_errors(r)
        assert r["ok"] == 3
    else:
        assert r["ok"] == 0 and r["error_kinds"][kind] == 3, r


def test_silent_peer_times_out_under_the_deadline(exe: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts (backlog) but never answers
        t0 = time.monotonic()
        r = tool_for(exe, int(silent.getsockname()[1])).run("connect", "-n", "2", "-c", "2", "--conn-timeout", "0.5")
        assert time.monotonic() - t0 < 5
    assert r["ok"] == 0 and r["error_kinds"]["timeout"] == 2


def test_table_medians_ratio_and_aims() -> None:
    def runs(mode: str, key: str, *values: float) -> list[dict[str, Any]]:
        return [{"mode": mode, key: v} for v in values]

    results = {
        "tidewire": {"connect": runs("connect", "connects_per_s", 4000, 5000, 3000),
                     "idle": runs("idle", "bytes_per_conn", 4300.0, 4400.0, 4200.0),
                     "latency": runs("latency", "p50_us", 140.0, 150.0, 200.0)},
        "mosquitto": {"connect": runs("connect", "connects_per_s", 20000, 24000, 22000)},
    }
    lines = {line.split("|")[0].strip(): [c.strip() for c in line.split("|")]
             for line in conn_bench.table(results).splitlines()}
    assert lines["connects/s"] == ["connects/s", "4,000", "22,000", "0.18", "≥ Mosquitto  NOT met"]
    assert lines["KB per idle conn"][1:3] == ["4.20", "-"] and lines["KB per idle conn"][4].endswith("NOT met")
    assert lines["latency p50 µs"][1] == "150" and lines["latency p50 µs"][4] == "≤ 150 µs  met"
    assert "latency p99 µs" not in lines  # no run has that key


def test_cli_runs_tidewire_only(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "runs.jsonl"
    rc = conn_bench.main(["--runs", "1", "--connections", "50", "--modes", "connect", "--targets", "tidewire",
                          "--no-pin", "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "connects/s" in text and "medians of 1 run(s)" in text and "raw runs:" in text
    raw = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["target"], r["mode"], r["run"], r["ok"]) for r in raw] == [("tidewire", "connect", 1, 50)]


def test_cli_tidewire_src_is_the_tree_that_runs(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    fake = tmp_path / "src" / "tidewire"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "__main__.py").write_text("raise SystemExit('fake tidewire from --tidewire-src')\n")
    rc = conn_bench.main(["--runs", "1", "--connections", "10", "--modes", "connect", "--targets", "tidewire",
                          "--no-pin", "--tidewire-src", str(tmp_path / "src")])
    captured = capsys.readouterr()
    assert rc == 1
    assert "fake tidewire from --tidewire-src" in captured.err
