"""Command line: `tidewire serve` starts a node, `tidewire passwd` edits a password file, `tidewire cluster` runs or
inspects a local cluster, `tidewire store` checks a data directory."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Annotated, Optional

import typer
from typer._click.core import Command, Context  # typer carries its own click: its group's signatures use these
from typer.core import TyperGroup

from tidewire.gateway.cli.passwd import passwd_command
from tidewire.gateway.config import Settings
from tidewire.gateway.extras import require_for_command
from tidewire.gateway.ops.logs import setup_logging

# Command groups imported only when used: a node's start (and every `tidewire ctl` call) skips the others' imports
# (httpx, RocksDB, ...). name -> (module, its Typer app, the extra every command of the group needs)
LAZY_GROUPS: dict[str, tuple[str, str, str | None]] = {
    "cluster": ("tidewire.gateway.cli.cluster", "cluster_app", "redis"),  # cluster up / status
    "lake": ("tidewire.gateway.cli.pipeline", "lake_app", "lake"),  # lake run
    "pipeline": ("tidewire.gateway.cli.pipeline", "pipeline_app", None),  # pipeline run <job> | package
    "store": ("tidewire.gateway.cli.store", "store_app", None),  # store check|compact|dump
    "ctl": ("tidewire.gateway.cli.ctl", "ctl_app", "admin"),  # a running node through its admin API
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




@app.command("serve")
def serve_command(
    config: Annotated[Optional[Path], typer.Option("--config", "-c", help="TOML or YAML settings file")] = None,
    host: Annotated[Optional[str], typer.Option(help="listen address")] = None,
    port: Annotated[Optional[int], typer.Option(help="MQTT TCP port")] = None,
    tls_port: Annotated[Optional[int], typer.Option(help="MQTT over TLS port")] = None,
    ws_port: Annotated[Optional[int], typer.Option(help="MQTT over WebSocket port")] = None,
    wss_port: Annotated[Optional[int], typer.Option(help="MQTT over secure WebSocket port")] = None,
    certfile: Annotated[Optional[Path], typer.Option(help="server certificate chain (PEM)")] = None,
    keyfile: Annotated[Optional[Path], typer.Option(help="server private key (PEM)")] = None,
    cafile: Annotated[Optional[Path], typer.Option(help="CA certificates for client certificates (PEM)")] = None,
    require_certificate: Annotated[Optional[bool], typer.Option(
        "--require-certificate/--no-require-certificate", help="clients must present a certificate")] = None,
    use_identity_as_username: Annotated[Optional[bool], typer.Option(
        "--use-identity-as-username/--no-use-identity-as-username",
        help="client certificate CN is the user name")] = None,
    use_subject_as_username: Annotated[Optional[bool], typer.Option(
        "--use-subject-as-username/--no-use-subject-as-username",
        help="client certificate subject is the user name")] = None,
    password_file: Annotated[Optional[Path], typer.Option(help="Mosquitto password_file")] = None,
    allow_anonymous: Annotated[Optional[bool], typer.Option(
        "--allow-anonymous/--no-allow-anonymous", help="default: off when authentication is configured")] = None,
    store: Annotated[Optional[str], typer.Option(
        help="embedded, redis://HOST:PORT/DB or redis-cluster://HOST:PORT[,HOST:PORT...]")] = None,
    node_id: Annotated[Optional[str], typer.Option(help="this node's id, unique in its cluster")] = None,
    cluster_port: Annotated[Optional[int], typer.Option(help="internal port for the other nodes (joins a cluster)")]
    = None,
    cluster_secret: Annotated[Optional[str], typer.Option(
        help="shared cluster secret (prefer TIDEWIRE_CLUSTER_SECRET: a flag shows in the process list)")] = None,
    amqp_port: Annotated[Optional[int], typer.Option(help="AMQP 0.9.1 port (default 5672; 0 disables)")] = None,
    amqps_port: Annotated[Optional[int], typer.Option(help="AMQP 0.9.1 over TLS port")] = None,
    rocketmq_port: Annotated[Optional[int], typer.Option(help="RocketMQ 5 gRPC port (default 8081; 0 disables)")]
    = None,
    data_dir: Annotated[Optional[Path], typer.Option(help="embedded store directory")] = None,
    lake: Annotated[Optional[Path], typer.Option(help="export the log and events to this lake directory")] = None,
    acl_file: Annotated[Optional[Path], typer.Option(help="Mosquitto-syntax ACL file")] = None,
    max_keepalive: Annotated[Optional[int], typer.Option(help="cap on client keepalive (s)")] = None,
    log_level: Annotated[Optional[str], typer.Option(help="debug|info|warning|error")] = None,
    admin_port: Annotated[Optional[int], typer.Option(help="HTTP port of metrics, admin API, dashboard and health "
                                                      "(default 18083; 0 disables)")] = None,
    api_token_file: Annotated[Optional[Path], typer.Option(
        help="file holding the admin API token (or TIDEWIRE_API_TOKEN)")] = None,
) -> None:
    """Start one gateway node (settings: defaults < --config file < TIDEWIRE_* env < flags)."""
    settings = Settings.load(config, host=host, port=port, tls_port=tls_port, ws_port=ws_port,
                             wss_port=wss_port, certfile=certfile, keyfile=keyfile, cafile=cafile,
                             require_certificate=require_certificate,
                             use_identity_as_username=use_identity_as_username,
                             use_subject_as_username=use_subject_as_username, password_file=password_file,
                             allow_anonymous=allow_anonymous, store=store, node_id=node_id,
                             cluster_port=cluster_port, cluster_secret=cluster_secret, data_dir=data_dir,
                             amqp_port=amqp_port, amqps_port=amqps_port, rocketmq_port=rocketmq_port,
                             acl_file=acl_file, lake_dir=lake,
                             max_keepalive=max_keepalive, log_level=log_level, admin_port=admin_port,
                             api_token_file=api_token_file)
    setup_logging(settings.log_level, settings.log_format)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    from tidewire.errors import StartupError
    from tidewire.gateway.server import run, serve  # here, so `tidewire passwd` starts without them

    try:
        run(serve(settings))
    except StartupError as exc:
        typer.echo(f"tidewire: cannot start: {exc}", err=True)
        raise typer.Exit(2) from None


app.command("passwd")(passwd_command)  # mosquitto_passwd-compatible; see gateway/cli/passwd.py

if __name__ == "__main__":
    app()
