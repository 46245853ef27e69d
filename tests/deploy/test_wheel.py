"""The distribution as a user gets it (the `dist` fixture: sdist, then the wheel from the sdist): `twine check`,
and the wheel installed into a clean venv. One import name, `tidewire`; no benchmark, test or other top-level
name. The core installed with its dependencies and serving MQTT is test_core_install (make test-slow)."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

PACKAGES = ("gateway", "store", "cache", "lookup", "notify", "extensions", "admin", "pipeline")


def test_wheel_and_sdist_hold_one_import_name(dist: Path, wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"tidewire", wheel.name.split("-py3")[0] + ".dist-info"}, tops
    info = wheel.name.split("-py3")[0] + ".dist-info"
    assert zipfile.ZipFile(wheel).read(f"{info}/top_level.txt").decode().split() == ["tidewire"]
    for package in PACKAGES:  # the linked folders arrive as real files
        assert f"tidewire/{package}/__init__.py" in names, package
    assert "tidewire/py.typed" in names and "tidewire/admin/static/index.html" in names
    assert not [n for n in names if "loadtest" in n or n.startswith("tests/") or "/tests/" in n]
    # the test suite's store engines (late answers, injected failures) are test code, not shipped engines
    assert "tidewire/store/embedded/engine.py" in names
    assert not [n for n in names if n.startswith("tidewire/store/") and ("delaying" in n or "failing" in n)]
    sdist = next(dist.glob("tidewire-*.tar.gz"))
    with tarfile.open(sdist) as tar:
        members = tar.getmembers()
    assert not [m.name for m in members if m.issym()]
    assert {m.name.split("/")[1] for m in members if m.name.count("/") >= 2} == {"tidewire", "tidewire.egg-info"}
    checked = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", str(wheel), str(sdist)],
                             capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.slow  # several seconds (a real node, a build or a long model run): make test-slow
def test_the_wheel_installs_into_a_clean_venv(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    # --no-deps: what the wheel itself puts on the path (the dependencies are PyPI's business)
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--no-deps", str(wheel)], check=True, timeout=120)
    probe = ("import importlib.util as u, json, sys; "
             "print(json.dumps({n: u.find_spec(n) is not None for n in sys.argv[1:]}))")
    found = subprocess.run([str(venv / "bin" / "python"), "-c", probe, "tidewire", "tidewire.gateway.node",
                            "tidewire.pipeline.jobs.aggregates", *PACKAGES, "loadtest", "tests"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(found.stdout) == {"tidewire": True, "tidewire.gateway.node": True,
                                        "tidewire.pipeline.jobs.aggregates": True,
                                        **dict.fromkeys(PACKAGES, False), "loadtest": False, "tests": False}
    assert (venv / "bin" / "tidewire").exists()
