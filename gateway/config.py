"""The one settings model: defaults < config file (TOML or YAML) < `TIDEWIRE_*` env vars < CLI flags.

`Settings` is the union of its sections (`ListenerSettings`, `MqttSettings`, ...): every setting has one name, the
same in the file (flat, or in its section's table), the environment (`TIDEWIRE_<NAME>`) and the flag
(`--name`, generated from the model by `gateway/cli/serve.py`). A part of the gateway that reads one concern
takes that section's type. `docs/configuration.md` is generated from this module (`tidewire config reference`).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, BeforeValidator, Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from tidewire.bridges.mqtt.settings import BridgeSettings
from tidewire.bridges.rules.settings import RuleSettings
from tidewire.errors import ConfigError
from tidewire.gateway.core.tenants import ANY_TENANT, valid_tenant_name

ListenerName = Literal["mqtt", "mqtts", "ws", "wss", "amqp", "amqps", "rocketmq"]
OFF_WORDS = frozenset({"off", "none", "false", "disabled", ""})


def _port_or_off(value: Any) -> Any:
    """`off` (or none/false/disabled/empty) turns a listener off; anything else is validated as a number. YAML
    reads a bare `off` as false: that is off too, never port 0."""
    if value is False or (isinstance(value, str) and value.strip().lower() in OFF_WORDS):
        return None
    if value is True:
        raise ValueError("a port is a number, 0 (a free port) or off")
    return value


# A listener's port: a number, 0 for a free port the OS picks (the bound port is logged), or None (`off`).
Port = Annotated[int | None, BeforeValidator(_port_or_off)]

# Ports where 0 used to mean "off" (before 0 meant a free port on every listener): a 0 there is refused, so an
# old config never opens a listener on a random port without its operator knowing.
ZERO_WAS_OFF = ("amqp_port", "amqps_port", "rocketmq_port", "admin_port")


class ListenerOptions(BaseModel):
    """Per-listener overrides; a field left unset takes the node-wide setting of the same name."""

    model_config = {"extra": "forbid"}

    max_connections: int | None = Field(None, ge=1)
    max_connection_rate: float | None = Field(None, ge=0, description="CONNECTs/s accepted; 0: no limit")
    connection_rate_burst: int | None = Field(None, ge=1)
    proxy_protocol: bool | None = None


class ListenerSettings(BaseModel):
    """`[listeners]`: Where clients connect and who is let in: the MQTT listeners, admission and overload, the PROXY
    protocol and the per-listener overrides. A port is a number, `0` (the OS picks a free one) or `off`.
    """

    host: str = Field("127.0.0.1", description="address every listener binds (0.0.0.0: all IPv4 interfaces)")
    port: Port = Field(1883, ge=0, le=65535, description="MQTT over TCP")
    tls_port: Port = Field(None, ge=0, le=65535, description="MQTT over TLS")
    ws_port: Port = Field(None, ge=0, le=65535, description="MQTT over WebSocket")
    wss_port: Port = Field(None, ge=0, le=65535, description="MQTT over WebSocket over TLS")
    ws_path: str = Field("/mqtt", description="HTTP path of the WebSocket listeners")
    ws_require_subprotocol: bool = Field(False, description="refuse WebSocket clients that offer no subprotocol "
                                                            "(EMQX's default); `mqtt` is chosen when offered")
    ws_origins: list[str] | None = Field(None, description="allowed browser Origin values; None: any")
    max_connections: int = Field(100_000, ge=1, description="per listener unless `listeners` overrides it")
    max_connection_rate: float = Field(0, ge=0, description="CONNECTs/s per listener (token bucket); 0: no limit")
    connection_rate_burst: int = Field(100, ge=1, description="CONNECTs accepted at once above the rate")
    max_pending_connects: int = Field(10_000, ge=1, description="CONNECTs in authentication at once; "
                                                                "beyond: 0x89 / code 3")
    overload_loop_lag_ms: float = Field(1000, ge=0, description="event-loop lag above which new CONNECTs are "
                                                                "refused (0x89 / code 3); 0: off")
    connect_timeout: float = Field(10.0, gt=0, description="s to wait for CONNECT after accept")
    close_drain_timeout: float = Field(2.0, ge=0, description="s a closing socket is drained so the client "
                                                              "reads our last packet")
    proxy_protocol: bool = Field(False, description="expect a PROXY protocol v1/v2 header on every listener")
    proxy_protocol_timeout: float = Field(5.0, gt=0, description="s to wait for the PROXY header")
    proxy_protocol_trusted: list[str] = Field(default_factory=list, description="CIDRs of the load balancers "
                                              "allowed to send PROXY headers; empty: any peer")
    listeners: dict[ListenerName, ListenerOptions] = Field(default_factory=dict,
                                                           description="per-listener overrides")


class AutoSubscription(BaseModel):
    """One `auto_subscribe` entry (EMQX's `auto_subscribe.topics`): a filter and its subscription options."""

    model_config = {"extra": "forbid"}

    topic: str = Field(min_length=1, description="a topic filter; `%c`: the client id, `%u`: the user name")
    qos: int = Field(0, ge=0, le=2)
    nl: bool = Field(False, description="no local (MQTT 5)")
    rap: bool = Field(False, description="retain as published (MQTT 5)")
    rh: int = Field(0, ge=0, le=2, description="retain handling (MQTT 5)")


class TopicRewriteRule(BaseModel):
    """One `topic_rewrite` rule (EMQX's `rewrite`): a topic (or filter) matching `source_topic` whose text `re`
    matches becomes `dest_topic`, with `$1`... the regex's groups and `${clientid}`, `${username}` the client's."""

    model_config = {"extra": "forbid"}

    action: Literal["publish", "subscribe", "all"] = Field(description="publish: PUBLISH topics and wills; "
                                                           "subscribe: SUBSCRIBE and UNSUBSCRIBE filters; all: both")
    source_topic: str = Field(min_length=1, description="a topic filter the topic must match")
    re: str = Field(description="a regular expression searched in the topic (Python syntax)")
    dest_topic: str = Field(min_length=1)

    @field_validator("re")
    @classmethod
    def _compiles(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a regular expression: {exc}") from exc
        return value


class MqttSettings(BaseModel):
    """`[mqtt]`: The MQTT protocol's limits and flow: packet and topic sizes, keepalive, in-flight windows, inbound
    rates, session expiry, topic aliases, shared subscriptions and incoming bridges.
    """

    max_keepalive: int = Field(65535, ge=0, le=65535, description="cap on keepalive; 0 means no cap")
    max_packet_size: int = Field(1024 * 1024, ge=64, le=268_435_460, description="bytes, whole packet")
    max_client_id_length: int = Field(65535, ge=23, description="bytes of a client id; longer: CONNACK 0x85 / code 2")
    max_topic_levels: int = Field(128, ge=1, description="levels of a topic name or filter")
    max_topic_length: int = Field(65535, ge=1, le=65535, description="bytes of a topic name or filter")
    max_subscriptions: int = Field(0, ge=0, description="per client; 0: no limit (SUBACK 0x97 beyond)")
    max_retained_messages: int = Field(0, ge=0, description="retained messages in the store; beyond, a retained "
                                       "publish is refused (PUBACK/PUBREC 0x97); 0: no limit")
    max_retained_bytes: int = Field(0, ge=0, description="bytes of all retained messages in the store; beyond, as "
                                    "max_retained_messages; 0: no limit")
    max_retained_payload: int = Field(0, ge=0, description="payload bytes of one retained message; larger: refused "
                                      "(0x97); 0: no limit beyond max_packet_size")
    max_queued_messages: int = Field(0, ge=0, description="messages kept for one offline persistent session: on "
                                     "its return only the newest this many are delivered, the older are dropped "
                                     "(reason queue_full); 0: no limit")
    max_stored_sessions: int = Field(0, ge=0, description="sessions in the store; beyond, housekeeping expires the "
                                     "offline ones nearest their expiry early; 0: no limit")
    stored_filters_check_interval: float = Field(60.0, gt=0, description="s between checks of which wildcard "
                                                 "filters of offline sessions a stored session still holds: one "
                                                 "whose sessions all expired or were evicted stops being indexed "
                                                 "(and kept in memory) within two checks")
    max_inbound_rate: float = Field(0, ge=0, description="PUBLISHes/s per client before reading pauses; 0: off")
    max_inbound_bytes_rate: float = Field(0, ge=0, description="bytes/s per client before reading pauses; 0: off")
    persistent_client_expiration: int = Field(0, ge=0, description="s a 3.1.1 persistent session lives "
                                                                    "disconnected; 0: forever (Mosquitto)")
    max_inflight: int = Field(512, ge=1, le=65535, description="outbound QoS 1/2 window per client")
    max_inbound_qos2: int = Field(1024, ge=1, description="inbound QoS 2 awaiting PUBREL per client")
    retry_interval: float = Field(20.0, gt=0, description="s before an unacked 3.1.1 QoS 1/2 is resent")
    max_session_expiry: int = Field(0xFFFFFFFF, ge=0, description="cap on session expiry interval (s)")
    max_pending_publishes: int = Field(50_000, ge=1, description="messages waiting for the store before "
                                                                "publishers are paused")
    write_buffer_high: int = Field(256 * 1024, ge=1024, description="bytes queued before pausing a client")
    pull_batch: int = Field(256, ge=1, description="messages pulled per queue read")
    topic_alias_maximum: int = Field(64, ge=0, le=65535, description="inbound topic aliases per client")
    response_information: str = Field("reply/", description="CONNACK Response Information prefix (+client id)")
    # Sparkplug B (gateway.core.sparkplug): on by default, since it costs a prefix check per publish and only
    # Sparkplug edge nodes publish births; off: no `$sparkplug/certificates/` entries and no refusals under it.
    sparkplug_aware: bool = Field(True, description="Sparkplug Aware MQTT Server (Sparkplug 3.0): keep the last "
                                  "NBIRTH/DBIRTH of each edge node and device as retained messages on "
                                  "`$sparkplug/certificates/spBv1.0/<group>/NBIRTH/<edge>[...]`, readable as the "
                                  "ACL allows; clients may not publish under `$sparkplug/certificates/`")
    shared_strategy: Literal["least_inflight", "round_robin", "random", "sticky", "hash_clientid",
                             "hash_topic"] = Field("least_inflight", description="`$share` group member chosen for "
                                                   "each message (per group: `shared_strategies`)")
    shared_strategies: dict[str, str] = Field(default_factory=dict,
                                              description="group name glob → strategy, e.g. {'jobs*': 'round_robin'}")
    accept_bridges: bool = Field(True, description="let other brokers' bridges in as bridges (Mosquitto's try_private: "
                                 "level 0x83/0x84; MQTT 5: user property tidewire-bridge=1); false: CONNACK code 1 to "
                                 "a 3.x bridge, MQTT 5's property ignored")
    # --- delayed publish, exclusive subscriptions, auto-subscribe, topic rewrite (EMQX's) ----------------------
    delayed_publish: bool = Field(True, description="`$delayed/<seconds>/<topic>` publishes to <topic> after the "
                                  "delay (EMQX's; an interval of 4294967 or more is a Unix time); false: such "
                                  "topics are ordinary topics")
    delayed_max_seconds: int = Field(4294967, ge=1, le=4294967, description="longest delay (s); longer: PUBACK "
                                     "0x90. Never beyond retention_seconds (a delayed message waits in the log)")
    delayed_max_messages: int = Field(100_000, ge=1, description="delayed messages waiting cluster-wide; beyond, "
                                      "a delayed publish is refused (PUBACK/PUBREC 0x97)")
    exclusive_subscriptions: bool = Field(True, description="`$exclusive/<filter>`: one subscriber at a time "
                                          "cluster-wide (others get SUBACK 0x97), until it unsubscribes or its "
                                          "session ends; false: SUBACK 0x8F, as EMQX")
    auto_subscribe: list[AutoSubscription] = Field(default_factory=list, description="subscriptions made for "
                                                   "every client as it connects, as if it had sent SUBSCRIBE (the "
                                                   "ACL applies, retained messages are sent); `%c` and `%u` in a "
                                                   "topic are its client id and user name, e.g. "
                                                   "[{\"topic\": \"cmd/%c\", \"qos\": 1}]")
    topic_rewrite: list[TopicRewriteRule] = Field(default_factory=list, description="EMQX's rewrite rules, "
                                                  "in order, before the ACL (docs/topic-rewrite.md), e.g. "
                                                  "[{\"action\": \"all\", \"source_topic\": \"x/#\", \"re\": "
                                                  "\"^x/(.+)$\", \"dest_topic\": \"y/$1\"}]")


class SecuritySettings(BaseModel):
    """`[security]`: TLS for every TLS listener (Mosquitto's option names), and authentication and authorization: the
    password file, JWT, HTTP authentication and the ACL file.
    """

    certfile: Path | None = Field(None, description="server certificate chain (PEM) of the TLS listeners")
    keyfile: Path | None = Field(None, description="private key (PEM) of certfile")
    cafile: Path | None = Field(None, description="CA bundle that client certificates must chain to")
    require_certificate: bool = Field(False, description="TLS clients must present a certificate that chains to cafile")
    use_identity_as_username: bool = Field(False, description="client certificate CN is the user name")
    use_subject_as_username: bool = Field(False, description="client certificate subject is the user name")
    tls_min_version: Literal["1.2", "1.3"] = Field("1.2", description="oldest TLS version accepted")
    tls_ciphers: str | None = Field(None, description="OpenSSL cipher list for TLS 1.2")
    password_file: Path | None = Field(None, description="Mosquitto password_file ($7$/$6$ lines) and "
                                                         "SCRAM-SHA-256 lines for MQTT 5 AUTH")
    auth_file: Path | None = Field(None, description="deprecated: read as a second password_file")
    allow_anonymous: bool | None = Field(None, description="default: true only when no authentication "
                                                           "source is configured (Mosquitto 2)")
    auth_chain: list[str] = Field(["file", "jwt", "http", "dynsec"], description="order of the authentication "
                                  "sources: the built-in `file`, `jwt`, `http`, `dynsec` (each on when configured) "
                                  "and installed plugins "
                                  "(entry point group tidewire.auth, see [plugins])")
    password_hash_threads: int = Field(2, ge=1, description="threads that check expensive password hashes")
    password_inline_iterations: int = Field(200, ge=0, description="PBKDF2 checks up to this many iterations "
                                            "run inline (Mosquitto's 101: ~70 us); more go to the threads")
    jwt_secret: str | None = Field(None, description="HS256 secret")
    jwt_public_key: Path | None = Field(None, description="PEM public key for RS256/ES256")
    jwt_jwks_file: Path | None = Field(None, description="JWKS file (keys chosen by `kid`)")
    jwt_username_claim: str = Field("sub", description="claim that is the user name")
    jwt_acl_claim: str = Field("acl", description="claim with {pub, sub, all} topic lists; absent: ACL file")
    jwt_audience: str | None = Field(None, description="required `aud` claim; None: not checked")
    jwt_issuer: str | None = Field(None, description="required `iss` claim; None: not checked")
    jwt_leeway: float = Field(0, ge=0, description="s of clock skew allowed on exp/nbf")
    http_auth_url: str | None = Field(None, description="POST {clientid, username, password, peerhost, "
                                                        "protocol} here; JSON answer")
    http_auth_timeout: float = Field(5.0, gt=0, description="s an HTTP authentication answer may take")
    http_auth_cache_ttl: float = Field(60.0, ge=0, description="s an answer is reused; 0: no cache")
    http_auth_on_error: Literal["deny", "ignore"] = Field("deny", description="answer when the service is down")
    http_auth_headers: dict[str, str] = Field(default_factory=dict, description="headers sent with every HTTP "
                                                                                "authentication request (e.g. its own "
                                                                                "credentials)")
    http_auth_max_connections: int = Field(32, ge=1, description="connections to the HTTP authentication service at "
                                                                 "once")
    acl_file: Path | None = Field(None, description="Mosquitto-syntax ACL file (`topic`, `user`, `pattern` with %c and "
                                                    "%u)")
    # Dynamic security: Mosquitto's dynamic-security plugin on the store (extensions.dynsec, gateway.ops.dynsec)
    dynsec_enabled: bool = Field(False, description="users, groups, roles and ACLs managed at run time over "
                                 "$CONTROL/dynamic-security/v1 (Mosquitto's JSON commands, mosquitto_ctrl dynsec), "
                                 "the admin API and the dashboard, kept in the store; `dynsec` must be in auth_chain")
    dynsec_admin_username: str | None = Field(None, description="bootstrap: when the store holds no dynamic-security "
                                              "configuration yet, start one with this client in an `admin` role that "
                                              "may send commands (as `mosquitto_ctrl dynsec init`); never overwrites")
    dynsec_admin_password: str | None = Field(None, description="the bootstrap admin's password (prefer the env var "
                                              "TIDEWIRE_DYNSEC_ADMIN_PASSWORD); stored salted and hashed")
    dynsec_refresh_interval: float = Field(2.0, gt=0, description="s between checks of the stored configuration's "
                                           "version (heals a change notice lost between nodes)")
    dynsec_password_iterations: int = Field(101, ge=1, le=10_000_000, description="PBKDF2-SHA512 iterations of a "
                                            "new password hash (Mosquitto's 101)")
    dynsec_max_clients: int = Field(100_000, ge=1, description="clients the configuration may hold")
    dynsec_max_roles: int = Field(10_000, ge=1, description="roles the configuration may hold")
    dynsec_max_groups: int = Field(10_000, ge=1, description="groups the configuration may hold")
    dynsec_max_acls: int = Field(1_000, ge=1, description="ACLs one role may hold")
    dynsec_max_request_bytes: int = Field(1 << 20, ge=1024, description="bytes of one control request; a larger "
                                          "one is refused")
    dynsec_max_commands: int = Field(100, ge=1, description="commands in one control request")


class PluginSettings(BaseModel):
    """`[plugins]`: Operator code installed as Python entry points and chosen by name (docs/plugins.md):
    authentication sources (named in `auth_chain`), authorizers and publish hooks; each call's timeout, and the
    answer that applies when a plugin raises or times out. In this table, `options`, `defaults` and `timeouts`
    stand for `plugin_options`, `plugin_defaults` and `plugin_timeouts` (`[plugins.options.NAME]`).
    """

    authorizers: list[str] = Field(["acl"], description="who decides what a client may publish and read, every one "
                                   "of them must allow: the built-in `acl` (acl_file; allow-all without one) and "
                                   "installed plugins (entry point group tidewire.authz)")
    publish_hooks: list[str] = Field(default_factory=list, description="installed plugins (entry point group "
                                     "tidewire.publish_hooks) run in this order on every publish, after the ACL "
                                     "and before the append: allow, deny or rewrite")
    plugin_timeout: float = Field(1.0, gt=0, description="s a plugin call may take; then its default applies")
    plugin_timeouts: dict[str, float] = Field(default_factory=dict, description="plugin name → its own timeout (s)")
    plugin_defaults: dict[str, Literal["allow", "deny", "ignore"]] = Field(
        default_factory=dict, description="plugin name → the answer when it raises or times out: authentication "
        "`ignore` (the default: the next source decides) or `deny`; authorizers `deny` (the default) or `allow`; "
        "publish hooks `allow` (the default) or `deny`")
    plugin_options: dict[str, dict[str, Any]] = Field(default_factory=dict, description="plugin name → the options "
                                                      "its factory is called with (`[plugins.options.NAME]`)")

    @field_validator("plugin_timeouts")
    @classmethod
    def _positive_timeouts(cls, value: dict[str, float]) -> dict[str, float]:
        bad = [name for name, seconds in value.items() if not seconds > 0]
        if bad:
            raise ValueError(f"a timeout must be over 0 s: {', '.join(bad)}")
        return value


class StoreSettings(BaseModel):
    """`[store]`: Where messages, sessions, offsets and retained messages live: the embedded engine in `data_dir`,
    Redis or Redis Cluster; retention and the read cache.
    """

    store: str = Field("embedded", description="`embedded` (files in data_dir), `redis://HOST:PORT/DB`, "
                       "`redis-cluster://HOST:PORT[,HOST:PORT...]`, "
                       "`redis-sentinel://HOST:PORT[,HOST:PORT...]/MASTER_NAME[/DB]` (a primary with replicas, "
                       "found through Redis Sentinel), or `package.module:factory[?key=value&...]`: an "
                       "engine not shipped with Tidewire, called with the settings and the query's keys")
    store_partitions: int = Field(16, ge=1, le=64, description="log partitions on Redis Cluster (1 on one Redis)")
    store_replicas: int = Field(0, ge=0, description="replicas of the Redis primary that must hold a message "
                                "before a publisher gets its acknowledgement (WAIT; one Redis or Sentinel, not "
                                "Redis Cluster); 0: acknowledged once the primary has it")
    store_replica_timeout: float = Field(1.0, gt=0, description="s an acknowledgement waits for store_replicas "
                                         "replicas; with fewer the store counts as failing: nothing is "
                                         "acknowledged, the wait is retried")
    store_replica_backlog: int = Field(100_000, ge=1, description="messages a node keeps, with store_replicas, "
                                       "until replicas confirm them (to append again after a failover); beyond "
                                       "it appends wait")
    store_timeout: float = Field(5.0, gt=0, description="s a Redis store call or heartbeat may wait for an answer: "
                                 "how long a silent store takes to count as unreachable (then new clients are "
                                 "refused)")
    store_epoch_ttl: float = Field(3600.0, gt=0, description="Redis store: seconds a client id without a stored "
                                   "session keeps its fencing epoch (a stale node stays fenced off after that too, by "
                                   "the epoch floor; a new session not written within this after its claim is refused)")
    data_dir: Path = Field(Path("data"), description="directory of the embedded store (and the admin token file)")
    fsync: Literal["batch", "interval", "never"] = Field(
        "batch", description="when appends reach the disk before they are acknowledged: `batch` (each write batch), "
                             "`interval` (every fsync_interval_ms), `never` (the OS decides)")
    fsync_interval_ms: int = Field(50, ge=1, description="ms between syncs with fsync = interval")
    segment_bytes: int = Field(64 * 1024 * 1024, ge=4096, le=2**32 - 1, description="size of a log segment file")
    retention_bytes: int = Field(0, ge=0, description="0: unlimited")
    retention_seconds: int = Field(7 * 24 * 3600, ge=0, description="0: unlimited")
    retention_ignores_holds: bool = Field(False, description="retention may delete records the lake bridge "
                                          "has not exported yet (they are then counted as lost)")
    cache_messages_per_queue: int = Field(4096, ge=16, description="newest messages per queue kept in the shared read "
                                                                   "cache")
    store_recent_messages: int = Field(8192, ge=0, description="newest messages the store keeps decoded in memory")
    segment_max_queues: int = Field(200_000, ge=0, description="a log segment that indexed this many distinct "
                                    "queues is sealed early: bounds the index kept in memory (0: no limit)")
    index_checkpoint_bytes: int = Field(16 * 1024 * 1024, ge=0, description="the active segment's index is "
                                        "written each time it grew this much: bounds what a restart after a crash "
                                        "scans (0: only at close)")
    meta_write_buffer_mb: int = Field(32, ge=1, description="RocksDB memtables of the embedded store's records")
    meta_block_cache_mb: int = Field(64, ge=1, description="RocksDB block cache of the embedded store's records")
    meta_background_jobs: int = Field(2, ge=1, description="RocksDB flush and compaction threads")


class ClusterSettings(BaseModel):
    """`[cluster]`: This node's identity and, on a shared Redis store, how it finds and watches the other nodes."""

    node_id: str = Field("node1", description="this node's id, unique in its cluster ($SYS topics, the lookup, leases)")
    cluster_port: Port = Field(None, ge=0, le=65535, description="internal port for the other nodes; set "
                                     "to join a cluster (Redis store only)")
    cluster_host: str | None = Field(None, description="address the other nodes reach this one at; default: host")
    cluster_advertise_port: Port = Field(None, ge=1, le=65535, description="port the other nodes reach this one at "
                                         "(NAT, a port mapping, a proxy); default: the cluster port as bound")
    cluster_secret: str | None = Field(None, description="shared secret every node of the cluster proves")
    cluster_heartbeat: float = Field(0.5, gt=0, description="s between membership heartbeats")
    cluster_member_ttl: float = Field(3.0, gt=0, description="s without a heartbeat before a node is dead")
    cluster_resync_interval: float = Field(1.0, gt=0, description="s between re-reads of every local queue (a "
                                           "notify lost with a node delays, never loses)")
    cluster_notify_lease: float = Field(5.0, ge=0, description="s a node may notify a queue's readers directly on "
                                        "its slot owner's answer (one hop); the owner sends changes meanwhile; 0: "
                                        "always through the owner (two hops)")


# --- Multi-tenancy (gateway.core.tenants) ------------------------------------------------------------------
class TenantLimits(BaseModel):
    """One tenant's limits, on each node (0: no limit)."""

    model_config = {"extra": "forbid"}

    max_connections: int = Field(0, ge=0, description="connected MQTT clients of the tenant on one node; the next "
                                 "one is refused with CONNACK 0x97 (3.1.1: 3); 0: no limit")
    max_connection_rate: float = Field(0, ge=0, description="CONNECTs/s of the tenant's clients on one node (token "
                                       "bucket, one second's burst); over it CONNACK 0x9F (3.1.1: 3); 0: no limit")
    max_message_rate: float = Field(0, ge=0, description="PUBLISHes/s of the tenant's clients on one node (token "
                                    "bucket, one second's burst); over it PUBACK/PUBREC 0x97, the message dropped; "
                                    "0: no limit")
    max_retained_bytes: int = Field(0, ge=0, description="the tenant's stored bytes: payload bytes of its retained "
                                    "messages in the store (measured every `tenant_measure_interval`, plus what "
                                    "was admitted since); a retained publish over it gets PUBACK/PUBREC 0x97; "
                                    "0: no limit")


class TenantSettings(BaseModel):
    """`[tenancy]`: Tenants: each tenant's topics live under its mount point `$tenant/<name>/`, invisible to the
    others (docs/tenants.md). A client's tenant comes from its listener, else from its authentication source (a
    JWT claim, `AuthDecision.tenant`), else from `tenant_users`; none: the default tenant (no mount)."""

    tenants: dict[str, TenantLimits] = Field(default_factory=dict, description="tenant name → its limits "
                                             "(names: letters, digits, `_`, `-`, `.`, at most 64; not `p2p`); "
                                             "`*`: the limits of every tenant not listed")
    tenant_listeners: dict[ListenerName, str] = Field(default_factory=dict, description="listener → the tenant of "
                                                      "every client connecting there (an identity naming another "
                                                      "tenant is refused)")
    tenant_jwt_claim: str | None = Field(None, description="JWT claim naming the client's tenant; None: not read")
    tenant_measure_interval: float = Field(30.0, gt=0, description="s between measures of the retained bytes of "
                                           "each tenant with `max_retained_bytes`")
    tenant_users: dict[str, str] = Field(default_factory=dict, description="proved user name → tenant, for "
                                         "sources whose records carry none (the password file)")
    tenant_superusers: list[str] = Field(default_factory=list, description="proved user names of the default "
                                         "tenant that are superusers: every topic, every tenant's under "
                                         "`$tenant/<name>/`, every AMQP vhost")

    @field_validator("tenants", "tenant_listeners", "tenant_users", mode="after")
    @classmethod
    def _tenant_names(cls, value: dict[str, Any], info: Any) -> dict[str, Any]:
        names = value.keys() if info.field_name == "tenants" else value.values()
        bad = sorted(str(name) for name in names if not valid_tenant_name(str(name)) and (
            name != ANY_TENANT or info.field_name != "tenants"))
        if bad:
            raise ValueError(f"invalid tenant names {bad}: letters, digits, `_`, `-`, `.`, at most 64, not `p2p`")
        return value


class BackendSettings(BaseModel):
    """`[backends]`: The backend protocols: AMQP 0.9.1 and RocketMQ 5 listeners and their limits."""

    amqp_port: Port = Field(5672, ge=0, le=65535, description="AMQP 0.9.1")
    amqps_port: Port = Field(None, ge=0, le=65535, description="AMQP 0.9.1 over TLS (certfile/keyfile)")
    amqp_frame_max: int = Field(131072, ge=4096, description="largest AMQP frame (bytes) offered in Tune")
    amqp_channel_max: int = Field(2047, ge=1, le=65535, description="channels per AMQP connection")
    amqp_heartbeat: int = Field(60, ge=0, le=65535, description="s between heartbeats offered in Tune; 0: off")
    amqp_max_body: int = Field(16 * 1024 * 1024, ge=1, description="largest AMQP message body (bytes)")
    amqp_dedupe_seconds: int = Field(0, ge=0, description="s a confirmed AMQP publish's message-id is held in the "
                                     "store (with the message), so a publisher's retry on any node is stored "
                                     "once; 0: off (AMQP does not require message-ids to be unique)")
    amqp_max_unacked: int = Field(10_000, ge=1, description="unacked deliveries per consumer when prefetch is "
                                                            "0 (unlimited in AMQP)")
    consumer_timeout: int = Field(1800, ge=1, description="s an AMQP delivery may stay unacked before its channel "
                                                          "is closed with 406 and it is requeued (RabbitMQ's "
                                                          "consumer_timeout; a queue's x-consumer-timeout wins)")
    rocketmq_port: Port = Field(8081, ge=0, le=65535, description="RocketMQ 5 gRPC")
    rocketmq_tls: bool = Field(False, description="serve the RocketMQ port over TLS only (the RocketMQ proxy's "
                               "enforcing mode) with certfile and keyfile, reloaded on SIGHUP; with cafile and "
                               "require_certificate, clients must present a certificate")
    rocketmq_endpoint: str | None = Field(None, description="host:port RocketMQ clients reach this node at, "
                                                            "listed in every node's routes; default: host (a "
                                                            "wildcard: cluster_host, else the machine's name) and "
                                                            "rocketmq_port")
    rocketmq_second_topic_property: str = Field("mqttSecondTopic", description="user property holding the MQTT "
                                                "topic below the RocketMQ topic (its first level)")
    rocketmq_max_body: int = Field(4 * 1024 * 1024, ge=1, description="largest RocketMQ message body (bytes)")
    rocketmq_dedupe_seconds: int = Field(300, ge=0, description="s a sent RocketMQ message id is held in the store "
                                         "(with the message), so a send retried on any node is stored once; "
                                         "0: only on the node that took it")
    rocketmq_max_delay_seconds: int = Field(3 * 24 * 3600, ge=0, description="s ahead a RocketMQ delay "
                                            "message's delivery time may be (RocketMQ's timerMaxDelaySec)")
    rocketmq_transaction_check_seconds: int = Field(30, ge=1, description="s a RocketMQ half message waits for "
                                                    "its EndTransaction before a producer of its topic is asked "
                                                    "(and between asks)")
    rocketmq_transaction_check_max: int = Field(15, ge=1, description="checks of an open RocketMQ transaction "
                                                "before its half message is dropped (RocketMQ's "
                                                "transactionCheckMax)")
    rocketmq_push_invisible_seconds: int = Field(60, ge=1, le=43_200, description="s a push consumer's "
                                                 "message (received with auto_renew) stays hidden between the "
                                                 "renewals the node makes until the consumer settles it (the "
                                                 "RocketMQ proxy's defaultInvisibleTimeMills)")
    rocketmq_renew_max_seconds: int = Field(3 * 3600, ge=1, description="s a push consumer's message is renewed "
                                            "at most; then it goes to another consumer (the proxy's "
                                            "renewMaxTimeMillis)")
    rocketmq_credentials_file: Path | None = Field(None, description="`access_key:secret_key` lines: the "
                                                   "secrets MQv2-HMAC-SHA1 signatures are checked with (an HMAC "
                                                   "needs the secret itself, not a hash)")


class LakeSettings(BaseModel):
    """`[lake]`: The data lake: the log and the gateway's events exported as partitioned Parquet."""

    lake_dir: Path | None = Field(None, description="export to this lake directory (`--lake`); None: off")
    lake_bridge: bool = Field(True, description="run the log's bridge in this node (one node per partition "
                              "works, by lease); false when `tidewire lake run` does it; events are always "
                              "exported by the node that saw them")
    lake_flush_rows: int = Field(100_000, ge=1, description="rows buffered before a lake file is written")
    lake_flush_bytes: int = Field(64 * 1024 * 1024, ge=1024, description="payload bytes buffered before a flush")
    lake_flush_seconds: float = Field(5.0, gt=0, description="s a buffered row may wait (bounds the lag)")
    lake_events_buffer: int = Field(1_000_000, ge=1, description="events held for the exporter; more are "
                                    "dropped, never waited for (counted: tidewire_lake_events_dropped_total"
                                    "{reason=\"buffer_full\"})")
    lake_compact: bool = Field(True, description="the node's bridge compacts closed hours in the background "
                               "(one compactor at a time per lake, by lock)")
    lake_compact_target_bytes: int = Field(256 * 1024 * 1024, ge=1024, description="size of the files compaction "
                                           "writes (input bytes per output)")
    lake_compact_after: float = Field(3600.0, ge=0, description="s after an hour ends before it is compacted")
    lake_compact_grace: float = Field(3600.0, ge=0, description="s compacted files stay for readers that listed "
                                      "them before they are deleted (a reader must finish within it)")
    lake_retention_days: int = Field(0, ge=0, description="the lake's day partitions older than this many "
                                     "days are removed by the bridge, and older records are not exported "
                                     "(its hold on the log moves past them); 0: keep forever")
    # Sparkplug B in the lake (pipeline.lake.sparkplug_rows)
    sparkplug_lake_births: int = Field(50_000, ge=1, le=10_000_000, description="Sparkplug B births (edge nodes "
                                       "and devices) whose metric aliases the lake bridge keeps to name DATA "
                                       "metrics sent by alias (the oldest go first; a metric of one forgotten "
                                       "is counted unresolved and named by the `sparkplug` job)")


class BridgeSection(BaseModel):
    """`[bridges]`: Links to other MQTT brokers, each configured with Mosquitto's `connection` options by their
    names (`[[bridges]]` tables here, or a file of Mosquitto bridge configuration read as Mosquitto reads it)."""

    bridges: list[BridgeSettings] = Field(default_factory=list, description="MQTT bridges: one table each, with "
                                          "Mosquitto's bridge options (name, addresses, topics, ...)")
    mosquitto_bridge_file: Path | None = Field(None, description="a file of Mosquitto bridge configuration "
                                               "(`connection` blocks; a whole mosquitto.conf may be given, its "
                                               "other options are logged and ignored)")
    bridge_lease_ttl: float = Field(15.0, ge=0.3, description="s a bridge's lease lasts (renewed every third of "
                                    "it): one node of a cluster runs each bridge, and another takes it over "
                                    "within this after that node dies")


class RulesSection(BaseModel):
    """`[rules]`: Rules over the live stream: `SELECT ... FROM "filter" WHERE ...` and an action (republish, AMQP,
    RocketMQ, webhook) fed from a stored position (`[[rules]]` tables; more through the admin API)."""

    rules: list[RuleSettings] = Field(default_factory=list, description="rules: one table each (name, sql, "
                                      "action, enabled)")


class AdminSettings(BaseModel):
    """`[admin]`: Operations: the admin HTTP port (metrics, API, dashboard, health), draining, bans, $SYS and
    logging."""

    admin_host: str | None = Field(None, description="address of the admin port; default: host")
    admin_port: Port = Field(18083, ge=0, le=65535, description="HTTP port of /metrics, /api/v1, the "
                                   "dashboard, /healthz and /readyz")
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
    # Tracing and slow subscribers (gateway.ops.trace, gateway.ops.slow_subscribers; admin/api_trace.py).
    trace_max_traces: int = Field(4, ge=1, le=64, description="traces a node holds at once (running or stopped "
                                  "and not yet deleted); starting one more drops the oldest stopped one, else 409")
    trace_max_packets: int = Field(10_000, ge=1, le=1_000_000, description="packets one trace keeps at most (its "
                                   "ring buffer keeps the newest and counts what it dropped)")
    trace_max_bytes: int = Field(4 * 1024 * 1024, ge=1024, le=256 * 1024 * 1024, description="bytes of JSON lines "
                                 "one trace keeps at most (the newest are kept)")
    trace_max_duration: float = Field(3600.0, gt=0, le=86_400.0, description="s a trace may run before it stops "
                                      "itself (a start asks for its own duration, up to this)")
    trace_max_payload_bytes: int = Field(1024, ge=0, le=65_536, description="payload bytes a trace may record of "
                                         "each PUBLISH when asked to (off unless the trace asks)")
    slow_subscribers_top: int = Field(10, ge=1, le=1000, description="subscribers the slow-subscriber ranking names")
    slow_subscribers_threshold_ms: float = Field(500.0, ge=0, description="average (EWMA) ack time below which a "
                                                 "subscriber is not ranked as slow")
    slow_subscribers_expire: float = Field(300.0, ge=0, le=86_400.0, description="s a slow subscriber that "
                                           "disconnected stays in the ranking (0: only clients online)")
    sys_events: bool = Field(True, description="publish client lifecycle events under $SYS/brokers/<node>/")
    sys_interval: float = Field(10.0, gt=0, description="s between $SYS statistics")
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="lowest level logged")
    log_format: Literal["logfmt", "json"] = Field("logfmt", description="`logfmt` (key=value lines) or `json` (one "
                                                                        "object per line)")


# Section name (its table in the config file) -> its model, in the order the reference lists them.
SECTIONS: dict[str, type[BaseModel]] = {
    "listeners": ListenerSettings, "mqtt": MqttSettings, "security": SecuritySettings, "plugins": PluginSettings,
    "store": StoreSettings,
    "cluster": ClusterSettings, "backends": BackendSettings, "lake": LakeSettings, "bridges": BridgeSection,
    "rules": RulesSection, "admin": AdminSettings, "tenancy": TenantSettings,
}
# Settings a flag would show in the process list: file or environment only.
# Plugin options may hold a plugin's own credentials.
SECRETS = frozenset({"cluster_secret", "api_token", "jwt_secret", "http_auth_headers", "plugin_options",
                     "dynsec_admin_password"})
# Short names a section's table may use for its settings: `[plugins.options.NAME]` reads as plugin_options.
SECTION_SHORT_NAMES: dict[str, dict[str, str]] = {
    "plugins": {"options": "plugin_options", "defaults": "plugin_defaults", "timeouts": "plugin_timeouts"}}


class Settings(BaseSettings, TenantSettings, AdminSettings, RulesSection, BridgeSection, LakeSettings, BackendSettings,
               ClusterSettings, StoreSettings, PluginSettings, SecuritySettings, MqttSettings, ListenerSettings):
    """Every knob of a node. Env var: `TIDEWIRE_<FIELD>` (upper case), e.g. `TIDEWIRE_PORT=1884`."""

    model_config = SettingsConfigDict(env_prefix="TIDEWIRE_", extra="forbid")

    @field_validator(*ZERO_WAS_OFF, mode="after")
    @classmethod
    def _zero_was_off(cls, value: int | None, info: Any) -> int | None:
        if value == 0:
            raise ValueError(f"{info.field_name} = 0 turned this listener off before 0 meant a free port on "
                             f"every listener: write `{info.field_name} = off` to turn it off, or a port number")
        return value

    @property
    def jwt_configured(self) -> bool:
        """A JWT key is set (the source is on)."""
        return bool(self.jwt_secret) or self.jwt_public_key is not None or self.jwt_jwks_file is not None

    @classmethod
    def load(cls, config_file: Path | None = None, **overrides: Any) -> Settings:
        """Build settings from an optional TOML/YAML file, the environment, and explicit overrides (None: not
        given)."""
        values: dict[str, Any] = read_config_file(config_file) if config_file is not None else {}
        from_env = cls()
        values.update({name: getattr(from_env, name) for name in from_env.model_fields_set})
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


def section_of(name: str) -> str:
    """The section a setting belongs to."""
    for section, model in SECTIONS.items():
        if name in model.model_fields:
            return section
    raise KeyError(name)


def _is_section_table(name: str, value: Any) -> bool:
    """`store` and `listeners` name both a section and a setting. The `store` setting is a string, so a table is
    the section; the `listeners` setting is itself a table (listener name -> overrides), so a table is the
    section when it holds one of the section's settings."""
    if name not in SECTIONS or not isinstance(value, dict):
        return False
    if name != "listeners":
        return True
    return any(str(k).replace("-", "_") in ListenerSettings.model_fields for k in value)


def read_config_file(path: Path) -> dict[str, Any]:
    """The file's settings, flat. Either flat keys or one table per section (`[store]`, `[cluster]`, ...), or
    both; all may sit under a `tidewire` table. A key in the wrong section's table is an error naming the right
    one, so a file cannot silently hold a setting the node ignores."""
    text = path.read_text()
    data = (yaml.safe_load(text) or {}) if path.suffix in (".yaml", ".yml") else tomllib.loads(text)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of settings")
    top = data.get("tidewire", data)
    flat: dict[str, Any] = {}
    for key, value in top.items():
        name = str(key).replace("-", "_")
        if _is_section_table(name, value):
            short = SECTION_SHORT_NAMES.get(name, {})
            for inner, inner_value in value.items():
                setting = str(inner).replace("-", "_")
                setting = short.get(setting, setting)
                if setting not in SECTIONS[name].model_fields:
                    where = f"; it belongs in [{section_of(setting)}]" if setting in Settings.model_fields else ""
                    raise ConfigError(f"{path}: [{name}] has no setting {inner!r}{where}")
                flat[setting] = inner_value
        else:
            flat[name] = value
    return flat
