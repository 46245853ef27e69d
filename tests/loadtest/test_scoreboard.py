"""The scoreboard (`loadtest.scoreboard`): medians per target, Tidewire/Mosquitto ratios, aims checked as the
issue states them (fan-out's on every run), and a tiny real run of its command line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from loadtest import conn_bench, scoreboard


def _board(results: dict[str, dict[str, list[dict[str, Any]]]]) -> scoreboard.Board:
    board = scoreboard.Board(3, list(scoreboard.TARGETS), list(scoreboard.MEASURES), conn_bench.Config(),
                             Path("/nonexistent"))
    board.results = results
    return board


def _runs(key: str, *values: float) -> list[dict[str, Any]]:
    return [{key: v, "run": i + 1} for i, v in enumerate(values)]


def _cells(text: str) -> dict[str, list[str]]:
    return {line.split("|")[0].strip(): [c.strip() for c in line.split("|")] for line in text.splitlines()}


def test_medians_ratios_and_aims() -> None:
    board = _board({
        "connect": {"tidewire": _runs("connects_per_s", 9000, 10000, 11000),
                    "mosquitto": _runs("connects_per_s", 20000, 19000, 21000),
                    "bare": _runs("connects_per_s", 18000, 18000, 18000)},
        "fanin": {"tidewire": _runs("msgs_per_s", 80000, 90000, 70000),
                  "tidewire-py": _runs("msgs_per_s", 60000, 60000, 60000),
                  "mosquitto": _runs("msgs_per_s", 50000, 60000, 55000)},
        # run 2's ratio is 4.0: the median ratio passes, the aim (every run) does not
        "fanout": {"tidewire": _runs("rate", 600000, 400000, 700000),
                   "mosquitto": _runs("rate", 100000, 100000, 100000)},
    })
    cells = _cells(scoreboard.table(board))
    header = cells["measure"]
    assert header[1:5] == ["Tidewire", "Tidewire (pure Python)", "Mosquitto", "bare uvloop"]
    assert cells["connects/s"][1:7] == ["10,000", "-", "20,000", "18,000", "0.50", "≥ 1.0x Mosquitto"]
    assert cells["connects/s"][7] == "NOT met"
    assert cells["fan-in QoS 1 msgs/s (10 → 1)"][1:4] == ["80,000", "60,000", "55,000"]
    assert cells["fan-in QoS 1 msgs/s (10 → 1)"][7] == "met"
    fanout = cells["fan-out deliveries/s (1 → 1,000)"]
    assert fanout[1] == "600,000" and fanout[5].startswith("6.00 (runs 6.0, 4.0, 7.0)") and fanout[7] == "NOT met"
    assert "latency p50 µs (QoS 1, 1k/s)" in cells and cells["latency p50 µs (QoS 1, 1k/s)"][1] == "-"


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc)")
def test_cli_prints_one_table_of_a_real_run(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "runs.jsonl"
    rc = scoreboard.main(["--runs", "1", "--only", "connect", "--targets", "tidewire,bare", "--connections", "200",
                          "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    cells = _cells(text.split("\n\n")[-1])
    assert int(cells["connects/s"][1].replace(",", "")) > 0 and int(cells["connects/s"][2].replace(",", "")) > 0
    raw = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted((r["measure"], r["target"], r["ok"]) for r in raw) == [("connect", "bare", 200),
                                                                           ("connect", "tidewire", 200)]
