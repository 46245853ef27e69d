"""The distribution built once per session: `python -m build` (the sdist from the checkout, the wheel from the
unpacked sdist, so a file the sdist misses fails the wheel) with this venv's setuptools (no download); and the
integration suite's paho fixture."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy import ROOT
from tests.integration.conftest import paho_factory  # noqa: F401  (fixture)


@pytest.fixture(scope="session")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    built = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)],
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    return out


@pytest.fixture(scope="session")
def wheel(dist: Path) -> Path:
    return next(dist.glob("tidewire-*.whl"))
