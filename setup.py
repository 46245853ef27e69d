"""The build's one decision beyond pyproject.toml: compile the hot path (tidewire/compiled.py lists it) with mypyc
when mypyc, a C compiler and Python's headers are here, else install it as plain Python. TIDEWIRE_COMPILE=0
forces plain Python; TIDEWIRE_COMPILE=1 makes a missing compiler an error instead of a fallback.

`build_ext` (which wheels and editable installs call) then writes `compiled.stamp`, the digest of the sources it
compiled, beside the extensions: `tidewire.compiled` runs them only while the sources still match it."""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).parent
sys.path.insert(0, str(ROOT))
from tidewire.compiled import GROUP, MODULES, STAMP, module_path, sources_digest  # noqa: E402


def _compiler_present() -> bool:
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    headers = Path(sysconfig.get_paths()["include"]) / "Python.h"
    return shutil.which(cc.split()[0]) is not None and headers.exists()


def _mypyc_present() -> bool:
    try:
        import mypyc.build  # noqa: F401
    except ImportError:
        return False
    return True


def compiling() -> bool:
    wanted = os.environ.get("TIDEWIRE_COMPILE", "auto")
    if wanted == "0":
        return False
    missing = [what for what, ok in (("mypyc", _mypyc_present()), ("a C compiler and Python's headers",
                                                                    _compiler_present())) if not ok]
    if missing and wanted == "1":
        raise SystemExit(f"tidewire: TIDEWIRE_COMPILE=1 but no {' or '.join(missing)}")
    if missing:
        print(f"tidewire: no {' or '.join(missing)}: the hot path stays pure Python", file=sys.stderr)
    return not missing


def _remove_stale_extensions() -> None:
    """Extensions of modules no longer compiled (an earlier build's, in place beside the sources) would be imported
    before their `.py`: they go before the build."""
    compiled = {module_path(m)[: -len(".py")] for m in MODULES}
    for folder, _, files in os.walk(ROOT / "tidewire", followlinks=True):
        for name in files:
            if name.endswith(".so") and not name.startswith(GROUP.rpartition(".")[2] + "__mypyc"):
                path = Path(folder) / name
                module = path.relative_to(ROOT).as_posix().split(".", 1)[0]
                if module not in compiled:
                    path.unlink()


class StampedBuild(build_ext):
    """Builds the extensions, then stamps the sources they were compiled from."""

    def run(self) -> None:
        if self.inplace:
            _remove_stale_extensions()
        super().run()
        out = ROOT if self.inplace else Path(self.build_lib)
        (out / "tidewire" / STAMP).write_text(sources_digest(str(ROOT)) + "\n", encoding="ascii")


if compiling():
    from mypyc.build import mypycify

    # Not the project's mypy configuration (its pydantic plugin is not in an isolated build's environment), and no
    # installed package's types: a third-party type is Any to the compiler, so what it builds is the same in an
    # isolated build and in a venv that has every dependency.
    options = ["--config-file=", "--no-site-packages", "--ignore-missing-imports", "--python-version", "3.11"]
    # Relative: setuptools lists the generated C among the sdist's sources (MANIFEST.in prunes build/).
    extensions = mypycify([*options, *(module_path(m) for m in MODULES)], opt_level="3", group_name=GROUP,
                          target_dir=os.path.join("build", "mypyc"))
    setup(ext_modules=extensions, cmdclass={"build_ext": StampedBuild})
else:
    setup()
