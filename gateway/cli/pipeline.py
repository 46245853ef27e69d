"""`tidewire lake run|compact|retention ...`, `tidewire pipeline run <job> ...` and `tidewire pipeline package`:
thin forwards to the pipeline's own argument parsers (`pipeline.lake.command`, `pipeline.lake.compact_command`,
`pipeline.lake.retention`, `pipeline.cli`) and artifact builder (`pipeline.artifact`), imported only when used so
the gateway starts without Spark."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tidewire.gateway.extras import require_for_command
from tidewire.pipeline.artifact import DEFAULT_OUTPUT, ArtifactError, build  # the standard library only: no Spark

_FORWARD = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}

lake_app = typer.Typer(add_completion=False, help="The lake bridge: the log and events as Parquet.")
pipeline_app = typer.Typer(add_completion=False, help="PySpark jobs over the lake.")


@lake_app.command("run", context_settings=_FORWARD)
def lake_run(ctx: typer.Context) -> None:
    """Export the log to the lake as its own process (`tidewire lake run --help` for the options)."""
    from tidewire.pipeline.lake.command import main

    raise typer.Exit(main(list(ctx.args)))


@lake_app.command("compact", context_settings=_FORWARD)
def lake_compact(ctx: typer.Context) -> None:
    """Compact the lake's closed hours once (`tidewire lake compact --help` for the options)."""
    from tidewire.pipeline.lake.compact_command import main

    raise typer.Exit(main(list(ctx.args)))


@lake_app.command("retention", context_settings=_FORWARD)
def lake_retention(ctx: typer.Context) -> None:
    """Remove the lake's day partitions older than --days (`tidewire lake retention --help`)."""
    from tidewire.pipeline.lake.retention import main

    raise typer.Exit(main(list(ctx.args)))


@pipeline_app.command("run", context_settings=_FORWARD)
def pipeline_run(ctx: typer.Context) -> None:
    """Run a job: aggregates, reports or alerts (`tidewire pipeline run --help` for the options)."""
    require_for_command("pipeline", "tidewire pipeline run")
    from tidewire.pipeline.cli import main

    raise typer.Exit(main(["run", *ctx.args]))


@pipeline_app.command("package")
def pipeline_package(
    output: Annotated[Path, typer.Option("--output", "-o", help="the zip for --py-files")] = DEFAULT_OUTPUT,
    master: Annotated[str, typer.Option(help="the master in the printed lines")] = "spark://SPARK-MASTER:7077",
    lake: Annotated[str, typer.Option(help="the lake in the printed lines")] = "/shared/lake",
) -> None:
    """Build the jobs' zip for spark-submit --py-files (and a launcher per job beside it); print the lines."""
    try:
        artifact = build(output)
    except ArtifactError as e:
        typer.echo(f"tidewire pipeline package: {e}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"wrote {artifact.zip_path} ({len(artifact.modules)} modules) and "
               f"{len(artifact.launchers)} launchers in {artifact.zip_path.parent / 'jobs'}", err=True)
    for line in artifact.submit_lines(master, lake):
        typer.echo(line)
