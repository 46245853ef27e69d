"""`tidewire.compiled`: the hot path runs compiled when the build compiled it and is current, from its sources when
asked (`TIDEWIRE_PURE_PYTHON=1`) or when the sources changed since the build; `make test` runs the compiled build
(CI's fresh clone compiles in `make dev`), `make test-pure` the sources."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tidewire import compiled
from tidewire.compiled import MODULES, PURE_ENV, STAMP, is_compiled, module_path, sources_digest

ROOT = Path(__file__).parents[1]
PROBE = ("import importlib, json, sys; from tidewire.compiled import MODULES, is_compiled; "
         "print(json.dumps({m: is_compiled(importlib.import_module(m)) for m in MODULES}))")


def _compiler_present() -> bool:
    return shutil.which(os.environ.get("CC", "cc")) is not None


def test_this_run_uses_the_implementation_it_was_asked_for() -> None:
    kinds = {m: is_compiled(importlib.import_module(m)) for m in MODULES}
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        assert not any(kinds.values()), kinds
        return
    if not (ROOT / "tidewire" / STAMP).exists():
        if os.environ.get("TIDEWIRE_COMPILE") == "0" or not _compiler_present():
            pytest.skip("built without compiling the hot path (TIDEWIRE_COMPILE=0 or no C compiler)")
        pytest.fail("the hot path was never compiled here: `make dev` builds it")
    assert all(kinds.values()), f"stale or partial compiled build (`make dev` rebuilds it): {kinds}"


def test_pure_python_is_chosen_for_child_processes_too(tmp_path: Path) -> None:
    env = {**os.environ, PURE_ENV: "1"}
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True,
                         cwd=tmp_path)
    assert not any(json.loads(out.stdout).values())


def _tree(tmp_path: Path) -> Path:
    """A copy of the compiled modules' sources, laid out as the checkout."""
    for name in MODULES:
        target = tmp_path / module_path(name)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / module_path(name), target)
    return tmp_path


def test_a_build_is_current_only_while_its_sources_are_unchanged(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    root = _tree(tmp_path)
    assert not compiled._build_is_current(str(root))  # no stamp: nothing was built from these sources
    (root / "tidewire" / STAMP).write_text(sources_digest(str(root)) + "\n")
    assert compiled._build_is_current(str(root))
    assert capsys.readouterr().err == ""
    edited = root / module_path(MODULES[-1])
    edited.write_text(edited.read_text() + "\n# an edit after the build\n")
    assert not compiled._build_is_current(str(root))
    assert "older than its sources" in capsys.readouterr().err
