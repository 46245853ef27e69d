"""The one settings model: defaults < config file (TOML or YAML) < `TIDEWIRE_*` env vars < CLI flags."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

ListenerName = Literal["mqtt", "mqtts", "ws", "wss", "amqp", "amqps"]


class ListenerOptions(BaseModel):
    """Per-listener overrides; a field left unset takes the node-wide setting of the same name."""

    model_config = {"extra": "forbid"}

    max_connections: int | None = Field(None, ge=1)
    max_connection_rate: float | None = Field(None, ge=0, description="CONNECTs/s accepted; 0: no limit")
    connection_rate_burst: int | None = Field(None, ge=1)
    proxy_protocol: bool | None = None


class Settings(BaseSettings):
    """Every knob of a node. Env var: `TIDEWIRE_<FIELD>` (upper case), e.g. `TIDEWIRE_PORT=1884`."""

    model_config = SettingsConfigDict(env_prefix="TIDEWIRE_", extra="forbid")

    # listeners (a port of None disables that listener; 0 picks a free port)
    host: str = "127.0.0.1"
    port: int | None = Field(1883, ge=0, le=65535, description="MQTT over TCP")
    tls_port: int | None = Field(None, ge=0, le=65535, description="MQTT over TLS")
    ws_port: int | None = Field(None, ge=0, le=65535, description="MQTT over WebSocket")
    wss_port: int | None = Field(None, ge=0, le=65535, description="MQTT over WebSocket over TLS")
    ws_path: str = Field("/mqtt", description="HTTP path of the WebSocket listeners")
    ws_require_subprotocol: bool = Field(False, description="refuse WebSocket clients that offer no subprotocol "
                                                            "(EMQX's default); `mqtt` is chosen when offered")
    ws_origins: list[str] | None = Field(None, description="allowed browser Origin values; None: any")
    node_id: str = "node1"
    max_connections: int = Field(100_000, ge=1, description="per listener unless `listeners` overrides it")
    max_connection_rate: float = Field(0, ge=0, description="CONNECTs/s per listener (token bucket); 0: no limit")
    connection_rate_burst: int = Field(100, ge=1, description="CONNECTs accepted at once above the rate")
    proxy_protocol: bool = Field(False, description="expect a PROXY protocol v1/v2 header on every listener")
    proxy_protocol_timeout: float = Field(5.0, gt=0, description="s to wait for the PROXY header")
    proxy_protocol_trusted: list[str] = Field(default_factory=list, description="CIDRs of the load balancers "
                                              "allowed to send PROXY headers; empty: any peer")
    listeners: dict[ListenerName, ListenerOptions] = Field(default_factory=dict,
                                                           description="per-listener overrides")
    # TLS (mqtts and wss listeners), the options of Mosquitto's of the same names
    certfile: Path | None = None
    keyfile: Path | None = None
    cafile: Path | None = Field(None, description="CA bundle that client certificates must chain to")
    require_certificate: bool = False
    use_identity_as_username: bool = Field(False, description="client certificate CN is the user name")
    use_subject_as_username: bool = Field(False, description="client certificate subject is the user name")
    tls_min_version: Literal["1.2", "1.3"] = "1.2"
    tls_ciphers: str | None = Field(None, description="OpenSSL cipher list for TLS 1.2")
    # protocol limits
    max_keepalive: int = Field(65535, ge=0, le=65535, description="cap on keepalive; 0 means no cap")
    max_packet_size: int = Field(1024 * 1024, ge=64, le=268_435_460, description="bytes, whole packet")
    max_client_id_length: int = Field(65535, ge=23)
    max_topic_levels: int = Field(128, ge=1)
    max_topic_length: int = Field(65535, ge=1, le=65535, description="bytes of a topic name or filter")
    max_subscriptions: int = Field(0, ge=0, description="per client; 0: no limit (SUBACK 0x97 beyond)")
    max_inbound_rate: float = Field(0, ge=0, description="PUBLISHes/s per client before reading pauses; 0: off")
    max_inbound_bytes_rate: float = Field(0, ge=0, description="bytes/s per client before reading pauses; 0: off")
    persistent_client_expiration: int = Field(0, ge=0, description="s a 3.1.1 persistent session lives "
                                                                    "disconnected; 0: forever (Mosquitto)")
    max_pending_connects: int = Field(10_000, ge=1, description="CONNECTs in authentication at once; "
                                                                "beyond: 0x89 / code 3")
    overload_loop_lag_ms: float = Field(1000, ge=0, description="event-loop lag above which new CONNECTs are "
                                                                "refused (0x89 / code 3); 0: off")
    close_drain_timeout: float = Field(2.0, ge=0, description="s a closing socket is drained so the client "
                                                              "reads our last packet")
    max_inflight: int = Field(512, ge=1, le=65535, description="outbound QoS 1/2 window per client")
    max_inbound_qos2: int = Field(1024, ge=1, description="inbound QoS 2 awaiting PUBREL per client")
    retry_interval: float = Field(20.0, gt=0, description="s before an unacked 3.1.1 QoS 1/2 is resent")
    max_session_expiry: int = Field(0xFFFFFFFF, ge=0, description="cap on session expiry interval (s)")
    connect_timeout: float = Field(10.0, gt=0, description="s to wait for CONNECT after accept")
    max_pending_publishes: int = Field(50_000, ge=1, description="messages waiting for the store before "
                                                                "publishers are paused")
    write_buffer_high: int = Field(256 * 1024, ge=1024, description="bytes queued before pausing a client")
    pull_batch: int = Field(256, ge=1, description="messages pulled per queue read")
    # store
    store: str = Field("embedded", description="`embedded` (files in data_dir), `redis://HOST:PORT/DB` or "
                                               "`redis-cluster://HOST:PORT[,HOST:PORT...]`")
    store_partitions: int = Field(16, ge=1, le=64, description="log partitions on Redis Cluster (1 on one Redis)")
    data_dir: Path = Path("data")
    fsync: Literal["batch", "interval", "never"] = "batch"
    fsync_interval_ms: int = Field(50, ge=1)
    segment_bytes: int = Field(64 * 1024 * 1024, ge=4096, le=2**32 - 1)
    retention_bytes: int = Field(0, ge=0, description="0: unlimited")
    retention_seconds: int = Field(7 * 24 * 3600, ge=0, description="0: unlimited")
    cache_messages_per_queue: int = Field(4096, ge=16)
    store_recent_messages: int = Field(8192, ge=0, description="newest messages the store keeps decoded in memory")
    segment_max_queues: int = Field(200_000, ge=0, description="a log segment that indexed this many distinct "
                                    "queues is sealed early: bounds the index kept in memory (0: no limit)")
    index_checkpoint_bytes: int = Field(16 * 1024 * 1024, ge=0, description="the active segment's index is "
                                        "written each time it grew this much: bounds what a restart after a crash "
                                        "scans (0: only at close)")
    meta_write_buffer_mb: int = Field(32, ge=1, description="RocksDB memtables of the embedded store's records")
    meta_block_cache_mb: int = Field(64, ge=1, description="RocksDB block cache of the embedded store's records")
    meta_background_jobs: int = Field(2, ge=1, description="RocksDB flush and compaction threads")
    store_test_delay_ms: float = Field(0, ge=0, description="testing only: every store call waits a random 0..N ms "
                                                            "(calls complete out of order); 0: off")
    # cluster (nodes sharing a Redis store)
    cluster_port: int | None = Field(None, ge=0, le=65535, description="internal port for the other nodes; set "
                                     "to join a cluster (Redis store only); 0 picks a free one")
    cluster_host: str | None = Field(None, description="address the other nodes reach this one at; default: host")
    cluster_secret: str | None = Field(None, description="shared secret every node of the cluster proves")
    cluster_heartbeat: float = Field(0.5, gt=0, description="s between membership heartbeats")
    cluster_member_ttl: float = Field(3.0, gt=0, description="s without a heartbeat before a node is dead")
    cluster_resync_interval: float = Field(1.0, gt=0, description="s between re-reads of every local queue (a "
                                           "notify lost with a node delays, never loses)")
    cluster_notify_broadcast: bool = Field(False, description="benchmarks only: send every notify to every node "
                                           "instead of the nodes the lookup names")
    # backend protocols (gateway/protocols/amqp and rocketmq): for these two, a port of 0 disables the listener
    amqp_port: int | None = Field(5672, ge=0, le=65535, description="AMQP 0.9.1; 0 disables")
    amqps_port: int | None = Field(None, ge=0, le=65535, description="AMQP 0.9.1 over TLS (certfile/keyfile)")
    amqp_frame_max: int = Field(131072, ge=4096, description="largest AMQP frame (bytes) offered in Tune")
    amqp_channel_max: int = Field(2047, ge=1, le=65535, description="channels per AMQP connection")
    amqp_heartbeat: int = Field(60, ge=0, le=65535, description="s between heartbeats offered in Tune; 0: off")
    amqp_max_body: int = Field(16 * 1024 * 1024, ge=1, description="largest AMQP message body (bytes)")
    amqp_max_unacked: int = Field(10_000, ge=1, description="unacked deliveries per consumer when prefetch is "
                                                            "0 (unlimited in AMQP)")
    consumer_timeout: int = Field(1800, ge=1, description="s an AMQP delivery may stay unacked before other "
                                                          "consumers may get it (RabbitMQ's consumer_timeout)")
    rocketmq_port: int | None = Field(8081, ge=0, le=65535, description="RocketMQ 5 gRPC; 0 disables")
    rocketmq_endpoint: str | None = Field(None, description="host:port RocketMQ clients reach this node at; "
                                                            "default: host and rocketmq_port")
    rocketmq_second_topic_property: str = Field("mqttSecondTopic", description="user property holding the MQTT "
                                                "topic below the RocketMQ topic (its first level)")
    rocketmq_max_body: int = Field(4 * 1024 * 1024, ge=1, description="largest RocketMQ message body (bytes)")
    rocketmq_credentials_file: Path | None = Field(None, description="`access_key:secret_key` lines: the "
                                                   "secrets MQv2-HMAC-SHA1 signatures are checked with (an HMAC "
                                                   "needs the secret itself, not a hash)")
    # the data lake (pipeline.lake): the log and the gateway's events as partitioned Parquet
    lake_dir: Path | None = Field(None, description="export to this lake directory (`--lake`); None: off")
    lake_bridge: bool = Field(True, description="run the log's bridge in this node (one node per partition "
                              "works, by lease); false when `tidewire lake run` does it; events are always "
                              "exported by the node that saw them")
    lake_flush_rows: int = Field(100_000, ge=1, description="rows buffered before a lake file is written")
    lake_flush_bytes: int = Field(64 * 1024 * 1024, ge=1024, description="payload bytes buffered before a flush")
    lake_flush_seconds: float = Field(5.0, gt=0, description="s a buffered row may wait (bounds the lag)")
    lake_events_buffer: int = Field(1_000_000, ge=1, description="events held for the exporter; more are "
                                    "counted as dropped, never waited for")
    retention_ignores_holds: bool = Field(False, description="retention may delete records the lake bridge "
                                          "has not exported yet (they are then counted as lost)")
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
    # authentication and authorization
    password_file: Path | None = Field(None, description="Mosquitto password_file ($7$/$6$ lines) and "
                                                         "SCRAM-SHA-256 lines for MQTT 5 AUTH")
    auth_file: Path | None = Field(None, description="deprecated: read as a second password_file")
    allow_anonymous: bool | None = Field(None, description="default: true only when no authentication "
                                                           "source is configured (Mosquitto 2)")
    auth_chain: list[Literal["file", "jwt", "http"]] = Field(["file", "jwt", "http"],
                                                             description="order of the configured sources")
    password_hash_threads: int = Field(2, ge=1, description="threads that check expensive password hashes")
    password_inline_iterations: int = Field(200, ge=0, description="PBKDF2 checks up to this many iterations "
                                            "run inline (Mosquitto's 101: ~70 us); more go to the threads")
    jwt_secret: str | None = Field(None, description="HS256 secret")
    jwt_public_key: Path | None = Field(None, description="PEM public key for RS256/ES256")
    jwt_jwks_file: Path | None = Field(None, description="JWKS file (keys chosen by `kid`)")
    jwt_username_claim: str = Field("sub", description="claim that is the user name")
    jwt_acl_claim: str = Field("acl", description="claim with {pub, sub, all} topic lists; absent: ACL file")
    jwt_audience: str | None = None
    jwt_issuer: str | None = None
    jwt_leeway: float = Field(0, ge=0, description="s of clock skew allowed on exp/nbf")
    http_auth_url: str | None = Field(None, description="POST {clientid, username, password, peerhost, "
                                                        "protocol} here; JSON answer")
    http_auth_timeout: float = Field(5.0, gt=0)
    http_auth_cache_ttl: float = Field(60.0, ge=0, description="s an answer is reused; 0: no cache")
    http_auth_on_error: Literal["deny", "ignore"] = Field("deny", description="answer when the service is down")
    http_auth_headers: dict[str, str] = Field(default_factory=dict)
    http_auth_max_connections: int = Field(32, ge=1)
    acl_file: Path | None = None
    # operations: one HTTP port per node serves /metrics, the admin API (/api/v1), the dashboard and health
    admin_host: str | None = Field(None, description="address of the admin port; default: host")
    admin_port: int | None = Field(18083, ge=0, le=65535, description="HTTP port of /metrics, /api/v1, the "
                                   "dashboard, /healthz and /readyz; 0 disables")
    api_token: str | None = Field(None, description="bearer token of the admin API (prefer the env var "
                                  "TIDEWIRE_API_TOKEN or api_token_file); none: a random one is written to "
                                  "<data_dir>/api_token (mode 0600)")
    api_token_file: Path | None = Field(None, description="file whose first line is the admin API's token")
    metrics: bool = Field(True, description="keep the counters /metrics shows (off: nothing extra is counted)")
    drain_timeout: float = Field(10.0, gt=0, description="s a stopping node gives its clients and writes")
    server_reference: str | None = Field(None, description="MQTT 5 Server Reference sent with DISCONNECT 0x9C "
                                         "(use another server) when this node stops; None: 0x8B")
    ban_refresh_interval: float = Field(2.0, gt=0, description="s between re-reads of the stored ban list "
                                        "(bans made through another node)")
    # logging
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: Literal["logfmt", "json"] = "logfmt"

    @property
    def jwt_configured(self) -> bool:
        """A JWT key is set (the source is on)."""
        return bool(self.jwt_secret) or self.jwt_public_key is not None or self.jwt_jwks_file is not None

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
