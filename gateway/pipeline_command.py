"""`tidewire lake run ...` and `tidewire pipeline run <job> ...`: thin forwards to the pipeline's own argument
parsers (`pipeline.lake.command`, `pipeline.cli`), imported only when used so the gateway starts without Spark."""

from __future__ import annotations

import typer

_FORWARD = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}

lake_app = typer.Typer(add_completion=False, help="The lake bridge: the log and events as Parquet.")
pipeline_app = typer.Typer(add_completion=False, help="PySpark jobs over the lake.")


@lake_app.command("run", context_settings=_FORWARD)
def lake_run(ctx: typer.Context) -> None:
    """Export the log to the lake as its own process (`tidewire lake run --help` for the options)."""
    from pipeline.lake.command import main

    raise typer.Exit(main(list(ctx.args)))


@pipeline_app.command("run", context_settings=_FORWARD)
def pipeline_run(ctx: typer.Context) -> None:
    """Run a job: aggregates, reports or alerts (`tidewire pipeline run --help` for the options)."""
    from pipeline.cli import main

    raise typer.Exit(main(["run", *ctx.args]))
