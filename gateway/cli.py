"""Command line: `tidewire serve` starts one node on the embedded store; `tidewire passwd` makes credentials."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from extensions.passwords import credential_line
from gateway.config import Settings
from gateway.logs import setup_logging
from gateway.server import run, serve

app = typer.Typer(add_completion=False, help="Tidewire MQTT gateway.")


@app.callback()
def main() -> None:
    """Tidewire MQTT gateway."""


@app.command("serve")
def serve_command(
    config: Annotated[Optional[Path], typer.Option("--config", "-c", help="TOML or YAML settings file")] = None,  # noqa: UP045
    host: Annotated[Optional[str], typer.Option(help="listen address")] = None,  # noqa: UP045
    port: Annotated[Optional[int], typer.Option(help="MQTT TCP port")] = None,  # noqa: UP045
    data_dir: Annotated[Optional[Path], typer.Option(help="embedded store directory")] = None,  # noqa: UP045
    acl_file: Annotated[Optional[Path], typer.Option(help="Mosquitto-syntax ACL file")] = None,  # noqa: UP045
    max_keepalive: Annotated[Optional[int], typer.Option(help="cap on client keepalive (s)")] = None,  # noqa: UP045
    log_level: Annotated[Optional[str], typer.Option(help="debug|info|warning|error")] = None,  # noqa: UP045
) -> None:
    """Start one gateway node (settings: defaults < --config file < TIDEWIRE_* env < flags)."""
    settings = Settings.load(config, host=host, port=port, data_dir=data_dir, acl_file=acl_file,
                             max_keepalive=max_keepalive, log_level=log_level)
    setup_logging(settings.log_level, settings.log_format)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    run(serve(settings))


@app.command("passwd")
def passwd_command(
    username: str,
    password: Annotated[str, typer.Option(prompt=True, hide_input=True, help="read from the terminal if omitted")],
    iterations: Annotated[int, typer.Option(min=4096)] = 4096,
) -> None:
    """Print a SCRAM-SHA-256 credentials line for the `auth_file` (MQTT 5 enhanced authentication)."""
    typer.echo(credential_line(username, password, iterations=iterations))


if __name__ == "__main__":
    app()
