"""`tidewire serve`'s flags are generated from the settings model: every non-secret setting has one, it parses as
the environment would, secrets have none, and a bad value stops the start with one line per problem."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from tidewire.errors import ConfigError
from tidewire.gateway.cli import app
from tidewire.gateway.cli.serve import flag_of, settings_from_flags, value_kind
from tidewire.gateway.config import SECRETS, Settings


def serve_flags() -> dict[str, list[str]]:
    """setting name -> its option strings, from the command typer builds."""
    group = typer.main.get_group(app)
    command = group.get_command(typer.Context(group), "serve")  # type: ignore[arg-type]
    assert command is not None
    return {str(p.name): [*p.opts, *p.secondary_opts] for p in command.params}


def test_every_setting_but_the_secrets_has_its_flag() -> None:
    flags = serve_flags()
    assert flags.pop("config") == ["--config", "-c"]
    expected = set(Settings.model_fields) - SECRETS
    assert set(flags) == expected and len(expected) > 100
    for name, opts in flags.items():
        assert flag_of(name) in opts, name
    assert flags["lake_dir"] == ["--lake-dir", "--lake"]  # the flag it had before flags were generated
    assert "--no-require-certificate" in flags["require_certificate"]
    for secret in SECRETS:
        assert secret not in flags


def test_each_kind_of_flag_value_becomes_the_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("TIDEWIRE_")]:
        monkeypatch.delenv(name)
    settings = settings_from_flags(None, {
        "port": "0", "amqp_port": "off", "max_connection_rate": "2.5", "require_certificate": True,
        "ws_origins": '["https://a.example"]', "listeners": '{"mqtt": {"max_connections": 9}}',
        "data_dir": str(tmp_path), "fsync": "never", "tls_port": None})
    assert (settings.port, settings.amqp_port, settings.max_connection_rate) == (0, None, 2.5)
    assert settings.require_certificate is True and settings.ws_origins == ["https://a.example"]
    assert settings.listeners["mqtt"].max_connections == 9
    assert settings.data_dir == tmp_path and settings.fsync == "never" and settings.tls_port is None
    assert {value_kind(Settings.model_fields[n]) for n in ("ws_origins", "require_certificate", "port")} == {
        "json", "bool", "text"}


def test_bad_values_are_named_together() -> None:
    with pytest.raises(ConfigError) as caught:
        settings_from_flags(None, {"max_inflight": "lots", "fsync": "sometimes", "amqp_port": "0"})
    text = str(caught.value)
    assert "max_inflight:" in text and "fsync:" in text and "write `amqp_port = off`" in text
    with pytest.raises(ConfigError, match="--ws-origins: not JSON"):
        settings_from_flags(None, {"ws_origins": "[oops"})


def test_serve_with_an_old_zero_port_exits_with_the_message(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "tidewire", "serve", "--port", "0", "--data-dir",
                           str(tmp_path / "data"), "--admin-port", "0"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2, done.stderr
    assert "admin_port = 0 turned this listener off" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "data").exists(), "nothing is created before the settings are valid"
