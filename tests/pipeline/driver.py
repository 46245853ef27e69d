"""A Spark driver's Python as a user of a real cluster has it: the documented driver requirements (pyspark with
py4j, pyarrow, paho-mqtt) and nothing of Tidewire, so a job that reaches past its artifact fails as it would there.

A venv whose site-packages links just those packages from the test environment (no download, no pip run); the
test environment's other packages, the checkout and its editable install are not on its path.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

DRIVER_PACKAGES = ("pyspark", "py4j", "pyarrow", "paho")


def make_driver_python(folder: Path) -> Path:
    """Create the venv in `folder`; returns its interpreter."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=60)
    python = folder / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True, timeout=30).stdout.strip()
    for name in DRIVER_PACKAGES:
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.submodule_search_locations, name
        (Path(purelib) / name).symlink_to(next(iter(spec.submodule_search_locations)))
    return python


def driver_env(**extra: str) -> dict[str, str]:
    """This environment without anything that would put the checkout or the test venv on the driver's path."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP", "PYTHONSAFEPATH")}
    venv_bin = str(Path(sysconfig.get_paths()["scripts"]))
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != venv_bin)
    env.update(extra)
    return env
