"""Smoke runs of the operations benchmarks, tiny and unpinned: the drain benchmark (SIGTERM to exit with idle
clients held by the C load tool) and the metrics on/off fan-out benchmark; each prints its table."""

from __future__ import annotations

import os
import re
import shutil

import pytest

from loadtest import drain_bench, metrics_bench

pytestmark = pytest.mark.timeout(120)


@pytest.mark.skipif(not (os.environ.get("CC") or shutil.which("cc")), reason="no C compiler (cc)")
def test_drain_bench_times_a_drain(capsys: pytest.CaptureFixture[str]) -> None:
    assert drain_bench.main(["--runs", "1", "--connections", "200", "--targets", "tidewire", "--no-pin"]) == 0
    out = capsys.readouterr().out
    assert "tidewire" in out
    assert re.search(r"\d+(\.\d+)?", out)


def test_metrics_bench_compares_on_and_off(capsys: pytest.CaptureFixture[str]) -> None:
    assert metrics_bench.main(["--runs", "1", "--subscribers", "5", "--rate", "2000", "--seconds", "1",
                               "--no-pin"]) == 0
    out = capsys.readouterr().out
    assert "on" in out and "off" in out and "ratio" in out.lower()
