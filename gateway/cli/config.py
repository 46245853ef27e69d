"""`tidewire config`: `reference` prints the settings reference (`docs/configuration.md` is its output, kept
current by a test), `show` prints the settings a node would run with, by section, as a file `--config` reads."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

from tidewire.errors import ConfigError
from tidewire.gateway.cli.serve import flag_of, is_port, settings_from_flags
from tidewire.gateway.config import SECRETS, SECTIONS, Settings

config_app = typer.Typer(add_completion=False, no_args_is_help=True, help="The settings: reference and effective.")

REFERENCE_INTRO = """\
# Configuration

Generated from `gateway/config.py` by `tidewire config reference`; a test fails when this file is not its
output. Do not edit by hand.

Every setting has one name. It is read, lowest precedence first, from its default, the config file
(`tidewire serve --config FILE`, TOML or YAML), the environment (`TIDEWIRE_<NAME>`, upper case) and the flag
(`--<name>` with `-` for `_`). Secrets have no flag: a flag shows in the process list.

The file holds the settings flat (`port = 1884`) or in one table per section below (`[listeners]` then
`port = 1884`), or both; all may sit under a `[tidewire]` table. A setting in the wrong section's table is an
error that names its section. Lists and mappings are JSON in the environment and in flags.
`tidewire config show [--config FILE]` prints the settings a node would run with, as such a file.

**Ports.** A port is a number, `0` (the operating system picks a free port; the bound port is logged) or `off`
(the listener does not run). `amqp_port`, `amqps_port`, `rocketmq_port` and `admin_port` used to take `0` for
off: a `0` there is refused with a message saying so, so an old file never opens a listener on a random port.
"""


def _default(name: str, value: Any) -> str:
    if value is None:
        return "off" if is_port(name) else "unset"
    if isinstance(value, Path):
        return f"`{value}`"
    return f"`{json.dumps(value)}`"


def _type(annotation: Any) -> str:
    text = str(annotation).replace("typing.", "").replace("pathlib.", "").replace("NoneType", "None")
    text = re.sub(r"tidewire\.[\w.]+\.(\w+)", r"\1", text)  # a model of ours by its own name
    return text.replace("<class '", "").replace("'>", "").replace("|", "\\|")


def reference() -> str:
    """The settings reference in Markdown: one table per section."""
    out = [REFERENCE_INTRO]
    for section, model in SECTIONS.items():
        out.append(f"## [{section}]\n")
        out.append(" ".join((model.__doc__ or "").split()).split(": ", 1)[-1] + "\n")
        out.append("| setting | type | default | flag | meaning |")
        out.append("|---|---|---|---|---|")
        for name, field in model.model_fields.items():
            flag = "(secret: file or env)" if name in SECRETS else f"`{flag_of(name)}`"
            meaning = (field.description or "").replace("|", "\\|")
            out.append(f"| `{name}` | {_type(field.annotation)} | "
                       f"{_default(name, field.get_default(call_default_factory=True))} | {flag} | {meaning} |")
        out.append("")
    return "\n".join(out)


@config_app.command("reference")
def reference_command() -> None:
    """Print the settings reference (Markdown): the source of docs/configuration.md."""
    typer.echo(reference(), nl=False)


@config_app.command("show")
def show_command(
    config: Annotated[Path | None, typer.Option("--config", "-c", help="TOML or YAML settings file")] = None,
) -> None:
    """Print the settings a node started here would run with (file < env), by section, as YAML that --config
    reads; secrets are left out (they stay in the file or the environment they came from)."""
    try:
        settings: Settings = settings_from_flags(config, {})
    except (ConfigError, OSError) as exc:
        typer.echo(f"tidewire: {exc}", err=True)
        raise typer.Exit(2) from None
    values = settings.model_dump(mode="json")
    document: dict[str, dict[str, Any]] = {}
    for section, model in SECTIONS.items():
        document[section] = {name: "off" if values[name] is None and is_port(name) else values[name]
                             for name in model.model_fields if name not in SECRETS}
    typer.echo(yaml.safe_dump(document, sort_keys=False), nl=False)
