"""The one settings model: defaults < config file (TOML or YAML) < `TIDEWIRE_*` env vars < CLI flags."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Every knob of a node. Env var: `TIDEWIRE_<FIELD>` (upper case), e.g. `TIDEWIRE_PORT=1884`."""

    model_config = SettingsConfigDict(env_prefix="TIDEWIRE_", extra="forbid")

    # listener
    host: str = "127.0.0.1"
    port: int = Field(1883, ge=0, le=65535)
    node_id: str = "node1"
    max_connections: int = Field(100_000, ge=1)
    # protocol limits
    max_keepalive: int = Field(65535, ge=0, le=65535, description="cap on keepalive; 0 means no cap")
    max_packet_size: int = Field(1024 * 1024, ge=64, le=268_435_460, description="bytes, whole packet")
    max_client_id_length: int = Field(65535, ge=23)
    max_topic_levels: int = Field(128, ge=1)
    max_inflight: int = Field(512, ge=1, le=65535, description="outbound QoS 1/2 window per client")
    max_inbound_qos2: int = Field(1024, ge=1, description="inbound QoS 2 awaiting PUBREL per client")
    retry_interval: float = Field(20.0, gt=0, description="s before an unacked 3.1.1 QoS 1/2 is resent")
    max_session_expiry: int = Field(0xFFFFFFFF, ge=0, description="cap on session expiry interval (s)")
    connect_timeout: float = Field(10.0, gt=0, description="s to wait for CONNECT after accept")
    write_buffer_high: int = Field(256 * 1024, ge=1024, description="bytes queued before pausing a client")
    pull_batch: int = Field(256, ge=1, description="messages pulled per queue read")
    # store
    data_dir: Path = Path("data")
    fsync: Literal["batch", "interval", "never"] = "batch"
    fsync_interval_ms: int = Field(50, ge=1)
    segment_bytes: int = Field(64 * 1024 * 1024, ge=4096)
    retention_bytes: int = Field(0, ge=0, description="0: unlimited")
    retention_seconds: int = Field(7 * 24 * 3600, ge=0, description="0: unlimited")
    cache_messages_per_queue: int = Field(4096, ge=16)
    store_recent_messages: int = Field(8192, ge=0, description="newest messages the store keeps decoded in memory")
    # MQTT 5 and shared subscriptions
    topic_alias_maximum: int = Field(64, ge=0, le=65535, description="inbound topic aliases per client")
    response_information: str = Field("reply/", description="CONNACK Response Information prefix (+client id)")
    shared_strategy: Literal["least_inflight", "round_robin", "random", "sticky", "hash_clientid",
                             "hash_topic"] = "least_inflight"
    shared_strategies: dict[str, str] = Field(default_factory=dict,
                                              description="group name glob → strategy, e.g. {'jobs*': 'round_robin'}")
    # $SYS
    sys_events: bool = Field(True, description="publish client lifecycle events under $SYS/brokers/<node>/")
    sys_interval: float = Field(10.0, gt=0, description="s between $SYS statistics")
    # extensions
    acl_file: Path | None = None
    auth_file: Path | None = Field(None, description="SCRAM-SHA-256 credentials for MQTT 5 enhanced auth")
    # logging
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: Literal["logfmt", "json"] = "logfmt"

    @classmethod
    def load(cls, config_file: Path | None = None, **overrides: Any) -> Settings:
        """Build settings from an optional TOML/YAML file, the environment, and explicit overrides."""
        values: dict[str, Any] = read_config_file(config_file) if config_file is not None else {}
        from_env = cls()
        values.update({name: getattr(from_env, name) for name in from_env.model_fields_set})
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


def read_config_file(path: Path) -> dict[str, Any]:
    text = path.read_text()
    if path.suffix in (".yaml", ".yml"):
        data = yaml.safe_load(text) or {}
    else:
        data = tomllib.loads(text)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of settings")
    section = data.get("tidewire", data)
    return {str(k).replace("-", "_"): v for k, v in section.items()}
