"""CLI: `python -m loadtest.tree_compare --old REF [--new REF] [--scenarios fanin,connect,latency,fanout,idle]
[--runs 3] [--seconds 5]`:
the same benchmark scenarios against two source trees of Tidewire in one run, interleaved (old, new, old, ...),
medians of the runs: a change's cost measured on today's machine, never against a number from another day.

Each tree is `git archive REF` unpacked in a temporary directory and put first on the server's PYTHONPATH (the
new one, without `--new`, is the installed tree as it is now); a tree from before the `tidewire` namespace (its
CLI in `gateway/cli.py`) gets a two-line `tidewire/__main__.py` that runs it. Each run is `python -m
loadtest.bench SCENARIO --target tidewire --json --seconds S` (server on core 0, load on core 1).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The figure each scenario is judged by (a field of loadtest.scenarios.Result), and whether higher is better:
# `rate` is msgs/s (fanin, pairs), deliveries/s (fanout), connects/s (connect) or KB per idle connection (idle).
FIGURES = {"fanin": ("rate", True), "fanout": ("rate", True), "pairs": ("rate", True), "connect": ("rate", True),
           "latency": ("p50_ms", False), "idle": ("rate", False)}
_SHIM = "from gateway.cli import app\n\napp()\n"


def tree(ref: str, into: Path) -> Path:
    archive = subprocess.run(["git", "archive", ref], cwd=ROOT, capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="fully_trusted")
    main = into / "tidewire" / "__main__.py"
    if not main.exists():
        main.parent.mkdir(exist_ok=True)
        (main.parent / "__init__.py").write_text("")
        main.write_text(_SHIM)
    return into


def run_once(scenario: str, src: Path | None, seconds: float) -> dict[str, float]:
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = str(src)
    done = subprocess.run([sys.executable, "-m", "loadtest.bench", scenario, "--target", "tidewire", "--json",
                           "--seconds", str(seconds)],
                          # the tree's own harness too: an old tree's CLI may not read what today's passes it
                          cwd=src or ROOT, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"{scenario} ({src or 'new'}): {done.stderr[-2000:]}")
    results = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return results[-1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m loadtest.tree_compare", description=__doc__.splitlines()[0])
    ap.add_argument("--old", required=True, help="the git ref to compare with (e.g. a commit before a change)")
    ap.add_argument("--new", default=None, help="a git ref for the new side (default: the installed tree)")
    ap.add_argument("--seconds", type=float, default=5.0, help="each scenario's measured phase")
    ap.add_argument("--scenarios", default="fanin,connect,latency,fanout,idle")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args(argv)
    scenarios = args.scenarios.split(",")
    with tempfile.TemporaryDirectory(prefix="tree-compare-") as tmp:
        old = tree(args.old, Path(tmp) / "old")
        new = tree(args.new, Path(tmp) / "new") if args.new else None
        figures: dict[tuple[str, str], list[float]] = {}
        for run in range(args.runs):
            for scenario in scenarios:
                key, _ = FIGURES[scenario]
                for label, src in (("old", old), ("new", new)):
                    result = run_once(scenario, src, args.seconds)
                    figures.setdefault((scenario, label), []).append(float(result[key]))
                    print(f"run {run + 1} {scenario:8} {label}: {key} {result[key]} {result['unit']}", flush=True)
    print(f"\nmedians of {args.runs} (old = {args.old}, new = {args.new or 'this tree'}):")
    for scenario in scenarios:
        key, higher = FIGURES[scenario]
        before = statistics.median(figures[(scenario, "old")])
        after = statistics.median(figures[(scenario, "new")])
        ratio = after / before if before else float("nan")
        better = (ratio >= 1) == higher
        print(f"  {scenario:8} {key:20} old {before:12.1f}  new {after:12.1f}  new/old {ratio:.3f}"
              f"{'' if better else '  (worse)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
