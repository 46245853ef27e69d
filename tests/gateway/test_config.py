"""The settings model: every setting in exactly one section, reachable from the file (flat or in its section's
table) and the environment; one meaning of port 0; old files whose 0 meant "off" refused with a message."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from tidewire.errors import ConfigError
from tidewire.gateway.config import SECTIONS, ZERO_WAS_OFF, Settings, read_config_file, section_of


@pytest.fixture(autouse=True)
def _no_tidewire_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("TIDEWIRE_"):
            monkeypatch.delenv(name)


def test_every_setting_is_in_exactly_one_section() -> None:
    seen: dict[str, str] = {}
    for section, model in SECTIONS.items():
        for name in model.model_fields:
            assert name not in seen, f"{name} in [{seen[name]}] and [{section}]"
            seen[name] = section
    assert set(seen) == set(Settings.model_fields)
    assert len(seen) > 100 and section_of("store_partitions") == "store"


def test_no_test_only_knob_in_the_production_model() -> None:
    for name, field in Settings.model_fields.items():
        text = f"{name} {field.description or ''}".lower()
        assert "testing only" not in text and "benchmarks only" not in text, name


def test_sections_and_flat_keys_give_the_same_settings(tmp_path: Path) -> None:
    flat = tmp_path / "flat.toml"
    flat.write_text('port = 1999\nstore_partitions = 4\namqp_port = "off"\nlog_format = "json"\n')
    tables = tmp_path / "tables.toml"
    tables.write_text('[listeners]\nport = 1999\n[store]\nstore = "embedded"\nstore_partitions = 4\n'
                      '[backends]\namqp_port = "off"\n[admin]\nlog_format = "json"\n')
    yaml_file = tmp_path / "sections.yaml"
    yaml_file.write_text("tidewire:\n  listeners: {port: 1999}\n  store: {store_partitions: 4}\n"
                         "  backends: {amqp_port: off}\n  admin: {log_format: json}\n")
    loaded = [Settings.load(path) for path in (flat, tables, yaml_file)]
    for settings in loaded:
        assert (settings.port, settings.store_partitions, settings.amqp_port, settings.log_format) == (
            1999, 4, None, "json")


def test_listeners_table_is_the_section_or_the_overrides_by_what_it_holds(tmp_path: Path) -> None:
    overrides = tmp_path / "overrides.toml"
    overrides.write_text("[listeners.mqtt]\nmax_connections = 3\n")
    assert Settings.load(overrides).listeners["mqtt"].max_connections == 3
    both = tmp_path / "both.toml"
    both.write_text("[listeners]\nport = 1998\n[listeners.listeners.amqp]\nmax_connections = 4\n")
    settings = Settings.load(both)
    assert settings.port == 1998 and settings.listeners["amqp"].max_connections == 4


def test_a_setting_in_the_wrong_section_names_the_right_one(tmp_path: Path) -> None:
    path = tmp_path / "wrong.toml"
    path.write_text("[store]\nport = 5\n")
    with pytest.raises(ConfigError, match=r"\[store\] has no setting 'port'; it belongs in \[listeners\]"):
        read_config_file(path)
    path.write_text("[mqtt]\nmax_inflight_typo = 5\n")
    with pytest.raises(ConfigError, match=r"has no setting 'max_inflight_typo'$"):
        read_config_file(path)


@pytest.mark.parametrize("name", ["port", "tls_port", "ws_port", "wss_port", "cluster_port", *ZERO_WAS_OFF])
def test_off_turns_any_listener_off(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(f"TIDEWIRE_{name.upper()}", "off")
    assert getattr(Settings(), name) is None
    assert getattr(Settings(**{name: "OFF"}), name) is None


@pytest.mark.parametrize("name", ["port", "tls_port", "ws_port", "wss_port", "cluster_port"])
def test_zero_is_a_free_port(name: str) -> None:
    assert getattr(Settings(**{name: 0}), name) == 0


@pytest.mark.parametrize("name", ZERO_WAS_OFF)
def test_zero_where_it_meant_off_is_refused_with_what_changed(name: str, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "old.yaml"
    path.write_text(f"{name}: 0\n")
    with pytest.raises(ValidationError, match=f"{name} = 0 turned this listener off .* write `{name} = off`"):
        Settings.load(path)
    monkeypatch.setenv(f"TIDEWIRE_{name.upper()}", "0")
    with pytest.raises(ValidationError, match=f"write `{name} = off`"):
        Settings()


def test_ports_out_of_range_or_words_are_refused() -> None:
    for bad in (65536, -1, "twelve", True):
        with pytest.raises(ValidationError):
            Settings(port=bad)


def test_environment_reaches_lists_mappings_and_nested_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIDEWIRE_WS_ORIGINS", '["https://a.example"]')
    monkeypatch.setenv("TIDEWIRE_SHARED_STRATEGIES", '{"jobs*": "round_robin"}')
    monkeypatch.setenv("TIDEWIRE_LISTENERS", '{"amqp": {"max_connections": 7}}')
    monkeypatch.setenv("TIDEWIRE_ROCKETMQ_CREDENTIALS_FILE", "/etc/tidewire/rocketmq.keys")
    settings = Settings()
    assert settings.ws_origins == ["https://a.example"]
    assert settings.shared_strategies == {"jobs*": "round_robin"}
    assert settings.listeners["amqp"].max_connections == 7
    assert settings.rocketmq_credentials_file == Path("/etc/tidewire/rocketmq.keys")


def test_precedence_is_file_then_environment_then_overrides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "t.toml"
    path.write_text("port = 1001\nnode_id = 'from-file'\nmax_inflight = 7\n")
    monkeypatch.setenv("TIDEWIRE_PORT", "1002")
    monkeypatch.setenv("TIDEWIRE_NODE_ID", "from-env")
    settings = Settings.load(path, port="1003")
    assert (settings.port, settings.node_id, settings.max_inflight) == (1003, "from-env", 7)
