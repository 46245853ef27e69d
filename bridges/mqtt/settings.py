"""The MQTT bridge's settings model: one `BridgeSettings` per link to another broker, in Mosquitto's terms.

Every field is the option of the same name in a Mosquitto `connection` block (mosquitto.conf(5), 2.0), with
Mosquitto's default, so a block read by `mosquitto_conf.read_bridges` and a table in Tidewire's own configuration
mean the same thing. What Mosquitto supports and Tidewire's bridge does not (lazy start, TLS-PSK, OCSP) is refused
with a message saying so, never accepted and ignored.

The defaults that depend on the machine follow Mosquitto 2.0.11 (its code, where the man page differs): the remote
client id is `<hostname>.<name>`, the local one `local.<remote client id>`, the state topic
`$SYS/broker/connection/<remote client id>/state`. The properties resolve them with this machine's hostname;
`resolved(hostname)` takes the hostname from the caller (tests, or a node that names itself).
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    Field,
    ModelWrapValidatorHandler,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from tidewire.errors import ConfigError
from tidewire.gateway.core.topics import matches, valid_topic_filter, valid_topic_name

Direction = Literal["out", "in", "both"]
ProtocolVersion = Literal["mqttv31", "mqttv311", "mqttv50"]

PROTOCOL_LEVELS: dict[str, int] = {"mqttv31": 3, "mqttv311": 4, "mqttv50": 5}
TLS_VERSIONS = ("tlsv1.2", "tlsv1.3")
NAME_PATTERN = re.compile(r"[A-Za-z0-9_.-]+")
_HOSTNAME = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_.])?")
MAX_U32 = 2**32 - 1

# Mosquitto options Tidewire's bridge refuses (rather than accept and ignore), with the reason an operator reads.
REFUSED: dict[str, str] = {
    "start_type lazy": "start_type lazy is not supported: Tidewire's bridge runs from its start (automatic, or "
                       "once); it does not wait for `threshold` queued messages nor stop after `idle_timeout`",
    "threshold": "threshold only configures start_type lazy, which is not supported: remove it (Tidewire's bridge "
                 "starts as automatic or once)",
    "idle_timeout": "idle_timeout only configures start_type lazy, which is not supported: remove it (Tidewire's "
                    "bridge starts as automatic or once)",
    "bridge_identity": "TLS-PSK (bridge_identity, bridge_psk) is not supported: use certificates (bridge_cafile or "
                       "bridge_capath, and bridge_certfile/bridge_keyfile for a client certificate)",
    "bridge_psk": "TLS-PSK (bridge_identity, bridge_psk) is not supported: use certificates (bridge_cafile or "
                  "bridge_capath, and bridge_certfile/bridge_keyfile for a client certificate)",
    "bridge_require_ocsp": "bridge_require_ocsp true is not supported: Tidewire's bridge cannot check the remote "
                           "broker's OCSP stapling",
}


def default_client_id(name: str, hostname: str) -> str:
    """Mosquitto 2.0.11's remote client id when none is set: `<hostname>.<name>` (`config__check`; the man page
    says `name.hostname`, the code writes the hostname first)."""
    return f"{hostname}.{name}"


class TopicRule(BaseModel):
    """One `topic` line: which messages cross, which way, at which QoS, and how their topics are rewritten.

    A message goes out when its local topic matches `local_filter` (the local prefix, then the pattern): the local
    prefix is taken off and the remote prefix put on. A message comes in when its remote topic matches
    `remote_filter`: the remote prefix is taken off and the local prefix put on. An empty pattern maps the one
    topic `local_prefix` to the one topic `remote_prefix` (both needed: mosquitto.conf(5)'s table).
    """

    model_config = {"extra": "forbid"}

    pattern: str = Field("", description="topic or filter shared (wildcards allowed); \"\" only with both prefixes")
    direction: Direction = Field("out", description="out: local to remote; in: remote to local; both")
    qos: int = Field(0, ge=0, le=2, description="QoS of the bridge's subscriptions for this pattern, both sides")
    local_prefix: str = Field("", description="put before the pattern on the local side (no wildcards)")
    remote_prefix: str = Field("", description="put before the pattern on the remote side (no wildcards)")

    @field_validator("local_prefix", "remote_prefix")
    @classmethod
    def _prefix_is_a_topic(cls, value: str) -> str:
        if value and not valid_topic_name(value):
            raise ValueError(f"{value!r} is not a topic name: a prefix has no + or # (it is put before topics)")
        return value

    @model_validator(mode="after")
    def _valid_mapping(self) -> TopicRule:
        if not self.pattern and not (self.local_prefix and self.remote_prefix):
            raise ValueError(f"`{self.line}`: an empty pattern (\"\") needs both a local and a remote prefix: it "
                             "maps the one topic local-prefix to the one topic remote-prefix (mosquitto.conf(5))")
        for side, topic_filter in (("local", self.local_filter), ("remote", self.remote_filter)):
            if not valid_topic_filter(topic_filter):
                raise ValueError(f"`{self.line}`: the {side} filter {topic_filter!r} (prefix + pattern) is not a "
                                 "valid topic filter (+ and # fill a whole level; # only the last)")
        return self

    @property
    def line(self) -> str:
        """This rule as a Mosquitto `topic` line (`""` for an empty pattern or prefix)."""
        words = [self.pattern or '""', self.direction, str(self.qos)]
        if self.local_prefix or self.remote_prefix:
            words += [self.local_prefix or '""', self.remote_prefix or '""']
        return "topic " + " ".join(words)

    @property
    def local_filter(self) -> str:
        """What the bridge subscribes to locally for an out rule: local prefix + pattern."""
        return self.local_prefix + self.pattern

    @property
    def remote_filter(self) -> str:
        """What the bridge subscribes to remotely for an in rule: remote prefix + pattern."""
        return self.remote_prefix + self.pattern

    @property
    def outgoing(self) -> bool:
        return self.direction != "in"

    @property
    def incoming(self) -> bool:
        return self.direction != "out"

    def to_remote(self, local_topic: str) -> str | None:
        """The remote topic of an out message, or None when this rule does not send it (not an out rule, or the
        topic does not match `local_filter`).

        As Mosquitto (`send__publish`): the local prefix is taken off only when the topic starts with it: `L/#`
        also matches `L`, which goes out as remote prefix + `L`. None as well when the result would be an empty
        topic (`L/` under `L/#` with no remote prefix), which no broker accepts.
        """
        return self._map(local_topic, self.outgoing, self.local_filter, self.local_prefix, self.remote_prefix)

    def to_local(self, remote_topic: str) -> str | None:
        """The local topic of an in message, or None when this rule does not bring it in (not an in rule, or the
        topic does not match `remote_filter`). As `to_remote`, the other way (`bridge__remap_topic_in`)."""
        return self._map(remote_topic, self.incoming, self.remote_filter, self.remote_prefix, self.local_prefix)

    @staticmethod
    def _map(topic: str, carried: bool, topic_filter: str, strip: str, add: str) -> str | None:
        if not carried or not matches(topic_filter, topic):
            return None
        if strip and topic.startswith(strip):
            topic = topic[len(strip):]
        mapped = add + topic
        return mapped or None


def parse_address(text: str) -> tuple[str, int]:
    """`host[:port]` as Mosquitto splits it: at the last colon, port 1883 when there is none. An IPv6 address
    therefore needs its port (`::1:1883`); `[::1]:1883` is read too, without the brackets (Mosquitto 2.0.11 keeps
    them and cannot resolve the name)."""
    host, colon, port_text = text.rpartition(":")
    if not colon:
        return text, 1883
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not port_text.isascii() or not port_text.isdigit():
        raise ValueError(f"address {text!r}: the port {port_text!r} is not a number")
    return host, int(port_text)


class Address(BaseModel):
    """One remote broker to connect to; several make a bridge fail over (`round_robin`)."""

    model_config = {"extra": "forbid"}

    host: str = Field(..., description="host name or IP address of the remote broker")
    port: int = Field(1883, ge=1, le=65535, description="its MQTT port")

    @model_validator(mode="before")
    @classmethod
    def _from_text(cls, data: Any) -> Any:
        # `"host:port"` in a configuration file, as in Mosquitto's `address` option.
        if isinstance(data, str):
            host, port = parse_address(data)
            return {"host": host, "port": port}
        return data

    @field_validator("host")
    @classmethod
    def _host(cls, value: str) -> str:
        try:
            ipaddress.ip_address(value)
        except ValueError:
            if not _HOSTNAME.fullmatch(value):
                raise ValueError(f"{value!r} is not a host name or an IP address (an IPv6 address needs its port, "
                                 "as Mosquitto: `::1:1883` or `[::1]:1883`)") from None
        return value

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


class BridgeSettings(BaseModel):
    """One bridge: Mosquitto's `connection <name>` block, field for option.

    Validation errors name the bridge and the option. `model_validate(..., context={"structured": True})` keeps
    pydantic's per-field errors instead (the Mosquitto reader maps them to lines).
    """

    model_config = {"extra": "forbid"}

    name: str = Field(..., description="`connection <name>`: unique; letters, digits, '_', '.', '-'")
    addresses: list[Address] = Field(..., min_length=1, description="remote brokers, the first is the main one "
                                     "unless round_robin (`address host[:port] ...`)")
    topics: list[TopicRule] = Field(..., min_length=1, description="what crosses the bridge (`topic` lines)")
    bridge_protocol_version: ProtocolVersion = Field("mqttv311", description="MQTT version spoken to the remote")
    cleansession: bool = Field(False, description="clean session on the remote (and locally, unless "
                                                  "local_cleansession)")
    local_cleansession: bool | None = Field(None, description="clean session of the local side; None: cleansession")
    remote_clientid: str | None = Field(None, description="client id on the remote; None: `<hostname>.<name>` "
                                                          "(Mosquitto 2.0.11)")
    local_clientid: str | None = Field(None, description="client id on the local side; None: "
                                                         "`local.<remote client id>`")
    local_username: str | None = Field(None, description="user name of the local side (local ACLs)")
    local_password: str | None = Field(None, description="password of the local side; needs local_username")
    remote_username: str | None = Field(None, description="user name on the remote")
    remote_password: str | None = Field(None, description="password on the remote; needs remote_username")
    keepalive_interval: int = Field(60, ge=5, le=65535, description="s between PINGREQs to the remote when idle")
    restart_timeout: tuple[float, float] = Field((5.0, 30.0), description="reconnection delay (base, cap) in s, "
                                                 "decorrelated jitter; one number c: a constant delay, (c, c)")
    round_robin: bool = Field(False, description="false: return to the first address whenever it is back; true: "
                                                 "stay on whichever address works")
    start_type: Literal["automatic", "once"] = Field("automatic", description="automatic: reconnect after a "
                                                     "failure; once: never reconnect (lazy: not supported)")
    notifications: bool = Field(True, description="publish the bridge's state (1/0, retained; 0 as its will)")
    notifications_local_only: bool = Field(False, description="publish the state on the local side only")
    notification_topic: str | None = Field(None, description="state topic; None: "
                                           "`$SYS/broker/connection/<remote client id>/state`")
    try_private: bool = Field(True, description="tell the remote this is a bridge (3.1.1: protocol level | 0x80; "
                                                "MQTT 5: no local + retain as published)")
    bridge_attempt_unsubscribe: bool = Field(True, description="UNSUBSCRIBE out-only patterns on the remote "
                                                               "(an old in subscription of a persistent session)")
    bridge_outgoing_retain: bool = Field(True, description="false: clear the retain flag of every out message")
    bridge_max_packet_size: int = Field(0, ge=0, le=MAX_U32, description="largest packet sent to the remote "
                                                                         "(bytes); 0: no limit")
    bridge_bind_address: str | None = Field(None, description="local address the bridge's socket binds to")
    bridge_cafile: Path | None = Field(None, description="CA bundle (PEM) of the remote's certificate; turns TLS "
                                                         "on")
    bridge_capath: Path | None = Field(None, description="directory of CA certificates (c_rehash'd); turns TLS on")
    bridge_certfile: Path | None = Field(None, description="client certificate (PEM); needs bridge_keyfile")
    bridge_keyfile: Path | None = Field(None, description="private key of bridge_certfile (PEM)")
    bridge_insecure: bool = Field(False, description="do not check the remote certificate's host name")
    bridge_tls_version: str | None = Field(None, description="tlsv1.2 or tlsv1.3: the only version offered; None: "
                                           "1.2 and up")
    bridge_alpn: str | None = Field(None, description="ALPN protocol offered in the TLS handshake")
    bridge_session_expiry_interval: int | None = Field(None, ge=0, le=MAX_U32, description="MQTT 5 session expiry "
                                                       "asked of the remote (s); None: the protocol's default")
    max_inflight: int = Field(100, ge=1, le=65535, description="Tidewire's: QoS 1/2 out messages unacknowledged "
                                                               "by the remote at once")

    @model_validator(mode="before")
    @classmethod
    def _refused(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        if data.get("start_type") == "lazy":
            raise ValueError(REFUSED["start_type lazy"])
        for option in ("threshold", "idle_timeout", "bridge_identity", "bridge_psk"):
            if option in data:
                raise ValueError(f"{option}: {REFUSED[option]}")
        if "bridge_require_ocsp" in data:
            if data["bridge_require_ocsp"] not in (False, "false", 0):
                raise ValueError(f"bridge_require_ocsp: {REFUSED['bridge_require_ocsp']}")
            data = {k: v for k, v in data.items() if k != "bridge_require_ocsp"}
        return data

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not NAME_PATTERN.fullmatch(value):
            raise ValueError(f"the bridge name {value!r} may hold only letters, digits, '_', '.' and '-'")
        return value

    @field_validator("restart_timeout", mode="before")
    @classmethod
    def _one_number_is_constant(cls, value: Any) -> Any:
        if isinstance(value, int | float | str):
            return (value, value)
        if isinstance(value, list | tuple) and len(value) == 1:
            return (value[0], value[0])
        return value

    @field_validator("restart_timeout")
    @classmethod
    def _backoff(cls, value: tuple[float, float]) -> tuple[float, float]:
        base, cap = value
        if base <= 0:
            raise ValueError(f"the base delay {base:g} must be above 0 s")
        if cap < base:
            raise ValueError(f"the cap {cap:g} is lower than the base {base:g} (Mosquitto refuses it too)")
        return value

    @field_validator("remote_clientid", "local_clientid", "local_username", "remote_username", "bridge_bind_address",
                     "bridge_alpn")
    @classmethod
    def _not_empty(cls, value: str | None) -> str | None:
        if value is not None and not value:
            raise ValueError("empty (leave the option out for its default)")
        return value

    @field_validator("notification_topic")
    @classmethod
    def _topic(cls, value: str | None) -> str | None:
        if value is not None and not valid_topic_name(value):
            raise ValueError(f"{value!r} is not a topic name (no + or #, not empty)")
        return value

    @field_validator("bridge_tls_version")
    @classmethod
    def _tls_version(cls, value: str | None) -> str | None:
        if value is not None and value not in TLS_VERSIONS:
            raise ValueError(f"{value!r}: Tidewire offers tlsv1.2 or tlsv1.3 (TLS 1.1 and older are not "
                             "supported)")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> BridgeSettings:
        for side in ("remote", "local"):
            if getattr(self, f"{side}_password") is not None and getattr(self, f"{side}_username") is None:
                raise ValueError(f"{side}_password needs {side}_username (MQTT sends no password without a user "
                                 "name)")
        if (self.bridge_certfile is None) != (self.bridge_keyfile is None):
            raise ValueError("bridge_certfile and bridge_keyfile go together (a client certificate and its key)")
        if self.bridge_certfile is not None and not self.tls:
            raise ValueError("bridge_certfile without bridge_cafile or bridge_capath: TLS is on only when one of "
                             "them is set (as in Mosquitto), so the certificate would never be used")
        if self.bridge_session_expiry_interval is not None and self.bridge_protocol_version != "mqttv50":
            raise ValueError("bridge_session_expiry_interval needs bridge_protocol_version mqttv50 (MQTT 5 only)")
        return self

    @model_validator(mode="wrap")
    @classmethod
    def _name_the_bridge(cls, data: Any, handler: ModelWrapValidatorHandler[BridgeSettings],
                         info: ValidationInfo) -> BridgeSettings:
        # Defined last, so that it wraps the other validators. Pydantic's locations say `topics.0.pattern`; in a
        # list of bridges the operator also needs to read which bridge, so the errors become one message led by
        # its name.
        try:
            return handler(data)
        except ValidationError as exc:
            if info.context and info.context.get("structured"):
                raise
            name = data.get("name") if isinstance(data, dict) else getattr(data, "name", None)
            raise ValueError(f"bridge {name!r}: {describe_errors(exc)}") from None

    # -- derived values --------------------------------------------------------------------------------
    @property
    def protocol_level(self) -> int:
        """The CONNECT protocol level: 3 (3.1), 4 (3.1.1) or 5."""
        return PROTOCOL_LEVELS[self.bridge_protocol_version]

    @property
    def client_id(self) -> str:
        """The remote client id (`remote_clientid`, or `<hostname>.<name>` with this machine's hostname)."""
        return self.remote_clientid or default_client_id(self.name, socket.gethostname())

    @property
    def local_client_id(self) -> str:
        return self.local_clientid or f"local.{self.client_id}"

    @property
    def state_topic(self) -> str:
        """Where the bridge's state (1 connected, 0 not) is published when `notifications` is on."""
        return self.notification_topic or f"$SYS/broker/connection/{self.client_id}/state"

    @property
    def tls(self) -> bool:
        """TLS to the remote: on when bridge_cafile or bridge_capath is set (Mosquitto's rule)."""
        return self.bridge_cafile is not None or self.bridge_capath is not None

    @property
    def local_clean(self) -> bool:
        return self.cleansession if self.local_cleansession is None else self.local_cleansession

    def resolved(self, hostname: str) -> BridgeSettings:
        """A copy with the machine-dependent defaults written out for `hostname`: remote and local client ids and
        the state topic (the properties then no longer read this machine's hostname)."""
        client_id = self.remote_clientid or default_client_id(self.name, hostname)
        return self.model_copy(update={
            "remote_clientid": client_id,
            "local_clientid": self.local_clientid or f"local.{client_id}",
            "notification_topic": self.notification_topic or f"$SYS/broker/connection/{client_id}/state",
        })

    # -- routing over every rule -------------------------------------------------------------------------
    def remote_topic(self, local_topic: str) -> str | None:
        """The remote topic of a local message, or None when no out rule takes it.

        Mosquitto's order (`send__publish`): the first out rule with a prefix whose local filter matches maps the
        topic; a message taken only by rules without a prefix keeps its topic.
        """
        return self._route(local_topic, [(r.local_filter, r) for r in self.topics if r.outgoing], out=True)

    def sent_as(self, remote_topic: str) -> str | None:
        """A local topic this bridge sends out as `remote_topic` (the inverse of `remote_topic`), or None: where a
        rule publishes what it wants to go over the bridge."""
        for rule in self.topics:
            if rule.outgoing and remote_topic.startswith(rule.remote_prefix):
                local = rule.local_prefix + remote_topic[len(rule.remote_prefix):]
                if local and self.remote_topic(local) == remote_topic:
                    return local
        return None

    def local_topic(self, remote_topic: str) -> str | None:
        """The local topic of a remote message, or None when no in rule takes it (`bridge__remap_topic_in`)."""
        return self._route(remote_topic, [(r.remote_filter, r) for r in self.topics if r.incoming], out=False)

    @staticmethod
    def _route(topic: str, rules: list[tuple[str, TopicRule]], *, out: bool) -> str | None:
        taken = [rule for topic_filter, rule in rules if matches(topic_filter, topic)]
        for rule in taken:
            if rule.local_prefix or rule.remote_prefix:
                return rule.to_remote(topic) if out else rule.to_local(topic)
        return topic if taken else None


def describe_errors(exc: ValidationError) -> str:
    """Pydantic's errors as `option: problem; ...` (`topics[0].qos: ...`), without its `Value error, ` prefix."""
    parts = []
    for error in exc.errors():
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error["loc"]).lstrip(".")
        message = error["msg"].removeprefix("Value error, ")
        parts.append(f"{where}: {message}" if where else message)
    return "; ".join(parts)


def check_unique(bridges: Sequence[BridgeSettings], hostname: str) -> None:
    """Refuse two bridges with one name, or with one local client id (Mosquitto's `config__check`): on the local
    side the second would take over the first's session."""
    names: set[str] = set()
    local_ids: dict[str, str] = {}
    for bridge in bridges:
        if bridge.name in names:
            raise ConfigError(f"two bridges are named {bridge.name!r}")
        names.add(bridge.name)
        local_id = bridge.resolved(hostname).local_client_id
        if local_id in local_ids:
            raise ConfigError(f"bridges {local_ids[local_id]!r} and {bridge.name!r} have the same local client id "
                              f"{local_id!r}: set local_clientid on one of them")
        local_ids[local_id] = bridge.name
