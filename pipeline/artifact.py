"""What a Spark cluster runs the jobs from: `tidewire pipeline package [-o FILE]`.

spark-submit wants a zip for `--py-files` and a Python file as the application. The zip holds exactly the modules
the jobs import, found by following their import statements from the installed `tidewire.pipeline` package (so it
cannot drift from the code); one launcher per job, the application file, is written beside it in `jobs/`. A job that
imports anything a driver lacks (another Tidewire package, a library outside the driver requirements) fails the
build with the chain of imports that reaches it, not a cluster run with a ModuleNotFoundError.

Imports are read from the source (ast), function-level ones included, so nothing is imported to build the zip:
it builds where pyspark is not installed. Entries carry a fixed time, so the same code gives the same bytes.
"""

from __future__ import annotations

import ast
import sys
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tidewire.errors import TidewireError

PACKAGE = "tidewire.pipeline"
ENTRY = "tidewire.pipeline.cli"  # the jobs' command line: every job is reached from it
# What `tidewire/__init__` itself imports (the choice of the compiled or pure hot path: standard library only).
ROOT_IMPORTS = ("tidewire.compiled",)
JOBS_PACKAGE = "tidewire.pipeline.jobs"
# The driver's documented requirements (import name -> distribution): what a job may import besides the standard
# library and the artifact. Executors need Spark only (the jobs run no Python UDFs).
DRIVER_REQUIREMENTS = {"pyspark": "pyspark", "pyarrow": "pyarrow", "paho": "paho-mqtt"}
DEFAULT_OUTPUT = Path("tidewire-pipeline.zip")
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # the earliest time a zip entry holds: a reproducible artifact

_LAUNCHER = '''"""spark-submit's application file for Tidewire's `{job}` job (written by `tidewire pipeline package`).

`tidewire.pipeline` comes from the zip given to --py-files; the arguments are the job's own (`--lake DIR ...`).
"""

import sys

from tidewire.pipeline.cli import main

sys.exit(main(["run", "{job}", *sys.argv[1:]]))
'''


class ArtifactError(TidewireError):
    """The jobs cannot be packaged: an import the driver could not satisfy, or a job the command line misses."""


@dataclass(frozen=True)
class Artifact:
    zip_path: Path
    modules: tuple[str, ...]  # dotted names in the zip, sorted
    launchers: dict[str, Path]  # job name -> its application file

    def submit_lines(self, master: str, lake: str) -> list[str]:
        """One spark-submit command per job, for a standalone master (client deploy mode, as Python apps are)."""
        lines = []
        for job, launcher in self.launchers.items():
            env = "TIDEWIRE_MQTT_URL=mqtt://USER:PASSWORD@GATEWAY:1883 " if job == "alerts" else ""
            extra = " --rule 'temperature > 80 for 1 minute'" if job == "alerts" else ""
            lines.append(f"{env}spark-submit --master {master} --deploy-mode client --py-files {self.zip_path} "
                         f"{launcher} --lake {lake}{extra}")
        return lines


def _module_file(root: Path, name: str) -> Path | None:
    """The source of module `name` under `root` (the directory holding the `tidewire` package), or None."""
    base = root.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imports(path: Path, module: str) -> Iterable[str]:
    """Every module `path` imports, at any depth of its code; `from . import x` resolved against `module`."""
    tree = ast.parse(path.read_bytes(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1])
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            yield target
            # `from pipeline.jobs import alerts` imports the submodule when there is one
            yield from (f"{target}.{alias.name}" for alias in node.names)


def _allowed_outside(name: str) -> bool:
    top = name.partition(".")[0]
    return top in sys.stdlib_module_names or top in DRIVER_REQUIREMENTS


def job_names(root: Path) -> list[str]:
    """The jobs: the modules of `pipeline/jobs/` (each one is a job of the command line)."""
    folder = root.joinpath(*JOBS_PACKAGE.split("."))
    return sorted(p.stem for p in folder.glob("*.py") if not p.stem.startswith("_"))


def closure(root: Path) -> tuple[str, ...]:
    """The `tidewire.pipeline` modules the jobs' command line imports, with the packages that hold them."""
    found: dict[str, str | None] = {ENTRY: None}  # module -> the module that imported it (for the error)
    stack = [ENTRY]
    while stack:
        module = stack.pop()
        path = _module_file(root, module)
        assert path is not None
        for name in _imports(path, module):
            if name != PACKAGE and not name.startswith((f"{PACKAGE}.", *ROOT_IMPORTS)):
                if not _allowed_outside(name):
                    chain = [module]
                    while (parent := found[chain[-1]]) is not None:
                        chain.append(parent)
                    raise ArtifactError(f"{' <- '.join([name, *chain])}: {name} is in neither the artifact "
                                        f"({PACKAGE}), the standard library nor the driver requirements "
                                        f"({', '.join(DRIVER_REQUIREMENTS)})")
                continue
            if name in found or _module_file(root, name) is None:
                continue  # an attribute of a module (`from pipeline.spark import read_messages`), not a module
            parts = name.split(".")
            # importing a.b.c runs a/__init__ and a/b/__init__ first: what they import is needed too
            for package in [".".join(parts[:i]) for i in range(1, len(parts))] + [name]:
                if package not in found:
                    found[package] = module
                    stack.append(package)
    modules = set(found)
    missing = [job for job in job_names(root) if f"{JOBS_PACKAGE}.{job}" not in modules]
    if missing:
        raise ArtifactError(f"job(s) {', '.join(missing)} in {JOBS_PACKAGE} not reached from {ENTRY}")
    return tuple(sorted(modules))


def package_root() -> Path:
    """The directory holding the installed `tidewire` package (not resolved: in a checkout `tidewire/pipeline` is a
    link to the top-level `pipeline/`, and the zip must hold the paths the code imports)."""
    return Path(__file__).parents[2]


def build(output: Path = DEFAULT_OUTPUT, root: Path | None = None) -> Artifact:
    """Write the zip to `output` and the launchers to `<output's folder>/jobs/`; paths in the result are absolute."""
    root = package_root() if root is None else root
    modules = closure(root)
    output = output.resolve()
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(f".{output.name}.tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name in modules:
            path = _module_file(root, name)
            assert path is not None
            entry = zipfile.ZipInfo(path.relative_to(root).as_posix(), _ZIP_TIME)
            entry.compress_type = zipfile.ZIP_DEFLATED
            entry.external_attr = 0o644 << 16
            archive.writestr(entry, path.read_bytes())
    tmp.replace(output)
    launchers = {}
    folder = output.parent / "jobs"
    folder.mkdir(exist_ok=True)
    for job in job_names(root):
        launcher = folder / f"{job}.py"
        launcher.write_text(_LAUNCHER.format(job=job))
        launchers[job] = launcher
    return Artifact(output, modules, launchers)
