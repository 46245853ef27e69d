"""The test plugin distribution (`plugin_pkg/`) made discoverable without pip: its module and a minimal
`tidewire_test_plugin-0.1.dist-info` (METADATA and entry_points.txt, the entry points read from its pyproject.toml)
in a directory, which a process then has on its PYTHONPATH. importlib.metadata reads entry points from exactly such
a directory, as it reads an installed distribution's."""

from __future__ import annotations

import os
import shutil
import tomllib
from pathlib import Path

PACKAGE = Path(__file__).parent / "plugin_pkg"
MODULE = "tidewire_test_plugin"


def lay_out(target: Path) -> Path:
    """Put the plugin distribution into `target` (made if missing); returns `target`, for a PYTHONPATH."""
    project = tomllib.loads((PACKAGE / "pyproject.toml").read_text())["project"]
    target.mkdir(parents=True, exist_ok=True)
    shutil.copytree(PACKAGE / MODULE, target / MODULE, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__"))
    info = target / f"{MODULE}-{project['version']}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    lines: list[str] = []
    for group, points in project["entry-points"].items():
        lines.append(f"[{group}]")
        lines += [f"{name} = {target_}" for name, target_ in points.items()]
        lines.append("")
    (info / "entry_points.txt").write_text("\n".join(lines))
    return target


def pythonpath(plugin_dir: Path) -> str:
    """PYTHONPATH for a child process: the plugin directory first, then what this process was given."""
    inherited = os.environ.get("PYTHONPATH", "")
    return os.pathsep.join(p for p in (str(plugin_dir), inherited) if p)
