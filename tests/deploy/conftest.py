"""The distribution built once per session: `python -m build` (the sdist from the checkout, the wheel from the
unpacked sdist, so a file the sdist misses fails the wheel) with this venv's setuptools and mypy (no download);
and the integration suite's paho fixture. `dist`/`wheel` are the pure-Python build (seconds: make test checks
its contents); `compiled_wheel` has the hot path compiled (a minute of C: make test-slow installs and runs it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy import ROOT
from tests.integration.conftest import paho_factory  # noqa: F401  (fixture)


def _build(out: Path, compile_hot_path: bool) -> Path:
    env = {**os.environ, "TIDEWIRE_COMPILE": "1" if compile_hot_path else "0"}
    built = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)],
                           capture_output=True, text=True, timeout=600, env=env)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    return out


@pytest.fixture(scope="session")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build(tmp_path_factory.mktemp("dist"), False)


@pytest.fixture(scope="session")
def wheel(dist: Path) -> Path:
    return next(dist.glob("tidewire-*.whl"))


@pytest.fixture(scope="session")
def compiled_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return next(_build(tmp_path_factory.mktemp("compiled-dist"), True).glob("tidewire-*.whl"))
