"""Command line: `tidewire serve` starts a node, `tidewire passwd` edits a password file, `tidewire cluster` runs or
inspects a local cluster, `tidewire store` checks a data directory, `tidewire config` shows the settings."""

from __future__ import annotations

import importlib

import typer
from typer._click.core import Command, Context  # typer carries its own click: its group's signatures use these
from typer.core import TyperGroup

from tidewire.gateway.cli.passwd import passwd_command
from tidewire.gateway.cli.serve import make_serve_command
from tidewire.gateway.extras import require_for_command

# Command groups imported only when used: a node's start (and every `tidewire ctl` call) skips the others' imports
# (httpx, RocksDB, ...). name -> (module, its Typer app, the extra every command of the group needs)
LAZY_GROUPS: dict[str, tuple[str, str, str | None]] = {
    "cluster": ("tidewire.gateway.cli.cluster", "cluster_app", "redis"),  # cluster up / status
    "lake": ("tidewire.gateway.cli.pipeline", "lake_app", "lake"),  # lake run, lake compact
    "pipeline": ("tidewire.gateway.cli.pipeline", "pipeline_app", None),  # pipeline run <job> | package
    "store": ("tidewire.gateway.cli.store", "store_app", None),  # store check|compact|dump
    "ctl": ("tidewire.gateway.cli.ctl", "ctl_app", "admin"),  # a running node through its admin API
    "config": ("tidewire.gateway.cli.config", "config_app", None),  # config reference | show
}


class _LazyGroup(TyperGroup):
    def list_commands(self, ctx: Context) -> list[str]:
        return [*super().list_commands(ctx), *LAZY_GROUPS]

    def get_command(self, ctx: Context, cmd_name: str) -> Command | None:
        if cmd_name not in LAZY_GROUPS:
            return super().get_command(ctx, cmd_name)
        module, attribute, extra = LAZY_GROUPS[cmd_name]
        if extra is not None:
            require_for_command(extra, f"tidewire {cmd_name}")
        command = typer.main.get_group(getattr(importlib.import_module(module), attribute))
        command.name = cmd_name
        return command


app = typer.Typer(add_completion=False, help="Tidewire MQTT gateway.", cls=_LazyGroup)


@app.callback()
def main() -> None:
    """Tidewire MQTT gateway."""




app.command("serve")(make_serve_command())  # one flag per setting; see gateway/cli/serve.py
app.command("passwd")(passwd_command)  # mosquitto_passwd-compatible; see gateway/cli/passwd.py

if __name__ == "__main__":
    app()
