"""`tidewire serve`: start one node. Its flags are generated from the settings model, one per setting (secrets
aside: a flag shows in the process list), so a new setting has its flag the moment it exists."""

from __future__ import annotations

import inspect
import json
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from pydantic.fields import FieldInfo
from rich.markup import escape

from tidewire.errors import ConfigError, StartupError
from tidewire.gateway.config import SECRETS, Settings, section_of
from tidewire.gateway.ops.logs import setup_logging

# Flags kept from before the flags were generated, besides the generated `--<name>`.
ALIASES: dict[str, tuple[str, ...]] = {"lake_dir": ("--lake",), "mosquitto_bridge_file": ("--mosquitto-bridge",)}


def flag_of(name: str) -> str:
    return "--" + name.replace("_", "-")


def _plain(text: str) -> str:
    """Help text shown as written: typer renders help through rich (one of its dependencies), which would read
    `[...]` as markup."""
    return escape(text)


def is_port(name: str) -> bool:
    """A listener's port (a number, 0 for a free one, or `off`): `config.Port`."""
    return name == "port" or name.endswith("_port")


def value_kind(field: FieldInfo) -> str:
    """How a flag's text becomes the setting: `bool` (an on/off flag pair), `json` (lists and mappings, as in the
    environment) or `text` (pydantic converts it, as it does an env var)."""
    annotation = field.annotation
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    base = args[0] if isinstance(annotation, types.UnionType) and len(args) == 1 else annotation
    if base is bool:
        return "bool"
    if typing.get_origin(base) in (list, dict):
        return "json"
    return "text"


def describe(name: str, field: FieldInfo) -> str:
    """One line of help: what the setting does, its default and its environment variable."""
    default = field.get_default(call_default_factory=True)
    shown = "off" if default is None and is_port(name) else json.dumps(default, default=str)
    what = field.description or name.replace("_", " ")
    return _plain(f"{what} (default {shown}; env TIDEWIRE_{name.upper()})")


def _parameters() -> list[inspect.Parameter]:
    params = [inspect.Parameter("config", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Annotated[
        Path | None, typer.Option("--config", "-c", help=_plain("TOML or YAML settings file (flat, or "
                                                                  "[section] tables)"))])]
    for name, field in Settings.model_fields.items():
        if name in SECRETS:
            continue
        kind = value_kind(field)
        panel = f"{section_of(name)} settings"
        option: Any
        if kind == "bool":
            option = typer.Option(f"{flag_of(name)}/--no-{flag_of(name)[2:]}", help=describe(name, field),
                                  rich_help_panel=panel, show_default=False)
            annotation: Any = Annotated[bool | None, option]
        else:
            metavar = "JSON" if kind == "json" else ("PORT|off" if is_port(name) else "VALUE")
            option = typer.Option(flag_of(name), *ALIASES.get(name, ()), help=describe(name, field),
                                  rich_help_panel=panel, metavar=metavar, show_default=False)
            annotation = Annotated[str | None, option]
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=annotation))
    return params


def settings_from_flags(config: Path | None, flags: dict[str, Any]) -> Settings:
    """Settings from the file, the environment and the flags given (None: not given). ConfigError names every
    bad value at once."""
    values: dict[str, Any] = {}
    for name, raw in flags.items():
        if raw is None:
            continue
        if value_kind(Settings.model_fields[name]) == "json":
            try:
                values[name] = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{flag_of(name)}: not JSON ({exc.msg}): {raw!r}") from None
        else:
            values[name] = raw
    try:
        return Settings.load(config, **values)
    except ValidationError as exc:
        lines = [f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()]
        raise ConfigError("invalid settings:\n  " + "\n  ".join(lines)) from None


def make_serve_command() -> Callable[..., None]:
    """The `serve` command function, its signature built from the settings model."""

    def serve(**flags: Any) -> None:
        """Start one gateway node (settings: defaults < --config file < TIDEWIRE_* env < flags)."""
        try:
            settings = settings_from_flags(flags.pop("config"), flags)
        except (ConfigError, OSError) as exc:
            typer.echo(f"tidewire: {exc}", err=True)
            raise typer.Exit(2) from None
        setup_logging(settings.log_level, settings.log_format)
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        from tidewire.gateway.server import run, serve  # here, so `tidewire passwd` starts without them

        try:
            run(serve(settings))
        except StartupError as exc:
            typer.echo(f"tidewire: cannot start: {exc}", err=True)
            raise typer.Exit(2) from None

    params = _parameters()
    serve.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    serve.__annotations__ = {p.name: p.annotation for p in params}
    return serve
