"""The node's bridges as configured: `[[bridges]]` tables in a TOML config file, the Mosquitto bridge file, and the
refusal of two bridges that would share a name (checked before the node starts)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidewire.bridges.runner import configured_bridges
from tidewire.errors import ConfigError, StartupError
from tidewire.gateway.config import Settings, read_config_file
from tidewire.gateway.server import optional_parts

TOML = """
[[bridges]]
name = "cloud"
addresses = [{host = "broker.example.com", port = 8883}]
topics = [{pattern = "sensors/#", direction = "out", qos = 1, local_prefix = "site/", remote_prefix = "plant1/"}]
bridge_cafile = "/etc/ssl/ca.pem"
"""


def test_bridges_from_a_toml_file_and_a_mosquitto_file(tmp_path: Path) -> None:
    config = tmp_path / "tidewire.toml"
    config.write_text(TOML)
    mosquitto = tmp_path / "bridge.conf"
    mosquitto.write_text("connection edge\naddress 10.0.0.2\ntopic cmd/# in 1\n")
    settings = Settings(**read_config_file(config), mosquitto_bridge_file=mosquitto)
    found = configured_bridges(settings.bridges, settings.mosquitto_bridge_file, "gw1")
    assert [(b.name, str(b.addresses[0]), b.topics[0].line) for b in found] == [
        ("cloud", "broker.example.com:8883", "topic sensors/# out 1 site/ plant1/"),
        ("edge", "10.0.0.2:1883", "topic cmd/# in 1"),
    ]
    assert found[0].resolved("gw1").client_id == "gw1.cloud" and found[0].tls


def test_two_bridges_with_one_name_are_refused_before_the_node_starts(tmp_path: Path) -> None:
    config = tmp_path / "tidewire.toml"
    config.write_text(TOML)
    mosquitto = tmp_path / "bridge.conf"
    mosquitto.write_text("connection cloud\naddress 10.0.0.2\ntopic cmd/# in 1\n")
    settings = Settings(**read_config_file(config), mosquitto_bridge_file=mosquitto)
    with pytest.raises(ConfigError, match="cloud"):
        configured_bridges(settings.bridges, settings.mosquitto_bridge_file, "gw1")
    with pytest.raises(StartupError, match=r"bridges: .*cloud"):
        optional_parts(settings)


def test_a_bad_mosquitto_file_names_its_line(tmp_path: Path) -> None:
    mosquitto = tmp_path / "bridge.conf"
    mosquitto.write_text("connection edge\naddress 10.0.0.2\ntopic cmd/# sideways 1\n")
    with pytest.raises(StartupError, match=r"bridge\.conf:3"):
        optional_parts(Settings(mosquitto_bridge_file=mosquitto, amqp_port=None, rocketmq_port=None,
                                admin_port=None))
