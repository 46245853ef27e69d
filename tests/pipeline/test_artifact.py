"""`tidewire pipeline package`: the zip holds what the jobs import and nothing else, a driver without Tidewire
runs its launchers, and a job that reaches past the artifact fails the build, not a cluster run.

Running the artifact's jobs on a real standalone cluster is test_spark_cluster (make test-slow)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.pipeline.driver import driver_env, make_driver_python
from tidewire.pipeline import artifact
from tidewire.pipeline.artifact import ArtifactError

ROOT = Path(__file__).parents[2]
EXPECTED = {f"tidewire/{name}" for name in (
    "__init__.py", "compiled.py", "pipeline/__init__.py", "pipeline/cli.py", "pipeline/spark.py",
    "pipeline/jobs/__init__.py", "pipeline/jobs/aggregates.py", "pipeline/jobs/alerts.py", "pipeline/jobs/reports.py",
    "pipeline/jobs/compact.py", "pipeline/jobs/sparkplug.py", "pipeline/window.py", "pipeline/fold.py",
    "pipeline/lake/__init__.py",
    "pipeline/lake/schema.py", "pipeline/lake/event_names.py", "pipeline/lake/partitions.py",
    "pipeline/lake/reading.py", "pipeline/lake/compaction.py", "pipeline/lake/compact_command.py",
    "pipeline/lake/writer.py")}


def _package(out: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tidewire", "pipeline", "package", "-o", str(out), "--master",
                           "spark://10.1.2.3:7077", "--lake", "/data/lake"], cwd=cwd, capture_output=True, text=True,
                          timeout=60)


def test_package_command_writes_zip_launchers_and_lines(tmp_path: Path) -> None:
    done = _package(tmp_path / "dist" / "tw.zip", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    zip_path = tmp_path / "dist" / "tw.zip"
    assert set(zipfile.ZipFile(zip_path).namelist()) == EXPECTED  # no bridge, gateway or store module
    lines = done.stdout.splitlines()
    assert len(lines) == 5
    for job in ("aggregates", "alerts", "compact", "reports", "sparkplug"):
        launcher = tmp_path / "dist" / "jobs" / f"{job}.py"
        assert launcher.is_file()
        line = next(x for x in lines if str(launcher) in x)
        assert f"spark-submit --master spark://10.1.2.3:7077 --deploy-mode client --py-files {zip_path} " in line
        assert line.endswith(f"{launcher} --lake /data/lake") or "--rule" in line
    assert "wrote" in done.stderr and f"{len(EXPECTED)} modules" in done.stderr
    first = zip_path.read_bytes()
    assert _package(zip_path, cwd=tmp_path).returncode == 0 and zip_path.read_bytes() == first  # reproducible


@pytest.mark.slow  # seconds: a clean interpreter runs every launcher from the zip
def test_driver_without_tidewire_runs_the_launchers(tmp_path: Path) -> None:
    python = make_driver_python(tmp_path / "driver")
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = driver_env()
    for module in ("tidewire", "gateway", "pipeline"):
        gone = subprocess.run([str(python), "-c", f"import {module}"], cwd=work, env=env, capture_output=True,
                              text=True, timeout=30)
        assert gone.returncode == 1 and "ModuleNotFoundError" in gone.stderr, module
    art = artifact.build(tmp_path / "dist" / "tidewire-pipeline.zip")
    for job, launcher in art.launchers.items():
        # as spark-submit runs the application: the zip on the path, the launcher as the main file
        helped = subprocess.run([str(python), str(launcher), "--help"], cwd=work, capture_output=True, text=True,
                                env={**env, "PYTHONPATH": str(art.zip_path)}, timeout=60)
        assert helped.returncode == 0, helped.stderr
        assert f"usage: tidewire pipeline run {job}" in helped.stdout and "--lake" in helped.stdout
    bad = subprocess.run([str(python), str(art.launchers["alerts"]), "--lake", str(tmp_path), "--rule", "x > 1"],
                         cwd=work, capture_output=True, text=True, env={**env, "PYTHONPATH": str(art.zip_path)},
                         timeout=60)
    assert bad.returncode == 2 and "expected '<field> <op> <number> for <duration>'" in bad.stderr


def _copy_of_pipeline(tmp_path: Path) -> Path:
    """A package root holding tidewire/__init__.py and a copy of tidewire/pipeline, to break."""
    root = tmp_path / "src"
    shutil.copytree(ROOT / "pipeline", root / "tidewire" / "pipeline", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "tidewire" / "__init__.py", root / "tidewire" / "__init__.py")
    return root


@pytest.mark.parametrize("line", ["from tidewire.gateway.core.event_buffer import EventBuffer", "import redis"])
def test_a_job_reaching_past_the_artifact_fails_the_build(tmp_path: Path, line: str) -> None:
    root = _copy_of_pipeline(tmp_path)
    schema = root / "tidewire" / "pipeline" / "lake" / "schema.py"
    schema.write_text(schema.read_text() + f"\n\ndef late() -> None:\n    {line}\n")  # even inside a function
    with pytest.raises(ArtifactError) as e:
        artifact.build(tmp_path / "out.zip", root=root)
    imported = line.split()[1]
    chain = "tidewire.pipeline.lake.schema <- tidewire.pipeline.window <- tidewire.pipeline.cli"
    assert str(e.value) == (f"{imported} <- {chain}: {imported} is in neither the artifact (tidewire.pipeline), the "
                            "standard library nor the driver requirements (pyspark, pyarrow, paho)")
    assert not (tmp_path / "out.zip").exists()


def test_a_job_the_command_line_misses_fails_the_build(tmp_path: Path) -> None:
    root = _copy_of_pipeline(tmp_path)
    (root / "tidewire" / "pipeline" / "jobs" / "forgotten.py").write_text('"""A job nobody registered."""\n')
    with pytest.raises(ArtifactError, match=r"forgotten in tidewire\.pipeline\.jobs not reached from tidewire\."):
        artifact.build(tmp_path / "out.zip", root=root)
