"""`tidewire config`: docs/configuration.md is exactly what `reference` prints (so it names every setting, its
section, default and flag), and `show` prints a file that `--config` reads back to the same settings."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tidewire.gateway.cli.config import reference
from tidewire.gateway.config import SECRETS, SECTIONS, Settings

REPO = Path(__file__).resolve().parents[3]


def test_configuration_doc_is_the_generated_reference() -> None:
    written = (REPO / "docs" / "configuration.md").read_text()
    assert written == reference(), ("docs/configuration.md is stale: run "
                                    "`.venv/bin/tidewire config reference > docs/configuration.md`")


def test_reference_lists_every_setting_under_its_section() -> None:
    text = reference()
    for section, model in SECTIONS.items():
        body = text.split(f"## [{section}]\n", 1)[1].split("\n## [", 1)[0]
        for name in model.model_fields:
            assert f"| `{name}` |" in body, (section, name)
    for secret in SECRETS:
        assert f"| `{secret}` |" in text and "(secret: file or env)" in text


def test_show_prints_a_file_that_loads_back_to_the_same_settings(tmp_path: Path) -> None:
    given = tmp_path / "given.toml"
    given.write_text('[listeners]\nport = 1777\n[backends]\namqp_port = "off"\n[cluster]\nnode_id = "shown"\n'
                     'cluster_secret = "never-printed"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEWIRE_")}
    done = subprocess.run([sys.executable, "-m", "tidewire", "config", "show", "-c", str(given)],
                          capture_output=True, text=True, timeout=30, env=env)
    assert done.returncode == 0, done.stderr
    assert "never-printed" not in done.stdout
    shown = tmp_path / "shown.yaml"
    shown.write_text(done.stdout)
    again = Settings.load(shown)
    original = Settings.load(given)
    assert again.model_dump(exclude=set(SECRETS)) == original.model_dump(exclude=set(SECRETS))
    assert (again.port, again.amqp_port, again.node_id) == (1777, None, "shown")


@pytest.mark.parametrize("argv", [["config", "reference"], ["config", "--help"]])
def test_config_commands_run(argv: list[str]) -> None:
    done = subprocess.run([sys.executable, "-m", "tidewire", *argv], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
