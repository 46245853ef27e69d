"""Mosquitto's bridge configuration read as Mosquitto 2.0 reads it: `connection` blocks into `BridgeSettings`.

The syntax is Mosquitto 2.0.11's (`config__read_file_core` in its src/conf.c), so that an operator's file reads the
same here as there, line for line:

- a line whose first character is `#` is a comment, and so is a blank line; an indented `#` is not (Mosquitto
  refuses it as an unknown option `#`, so does this reader). Words are separated by spaces only: a tab is part of
  a word.
- `connection <name>` opens a block. Every bridge option after it belongs to it, even past other options (a
  `listener` ...), until the next `connection`. A bridge option before any `connection` is an error.
- A string option takes the rest of its line, trimmed (a `#` there is part of the value) and may be given once
  per block; `clientid`, `username` and `password` are the old names of the `remote_` ones. Booleans (`true`,
  `false`, `1`, `0`), numbers and keywords take one word, and the last one given wins. `address` (or
  `addresses`) is given once per block, with every `host[:port]` on it; `topic` lines accumulate.
- Numbers are read as C's `atoi` reads them (`60s` is 60), and clamped where Mosquitto clamps them
  (`keepalive_interval 2` is 5): each such reading is listed in `notices`, where Mosquitto logs one.
- `include_dir` in the main text reads that directory's `*.conf` files in Mosquitto's order, each a file of its own
  (a block does not continue into or out of one).

The options of a whole mosquitto.conf that are not bridge options (listeners, persistence, logging ...) are listed in
`ignored`; an option Mosquitto does not know is an error, as there. Errors are `ConfigError`s that name the source,
the line and the bridge. Where Tidewire's bridge differs it says so instead of reading past: `start_type lazy`
(with `threshold`, `idle_timeout`), TLS-PSK and OCSP are refused; `bridge_session_expiry_interval` (a Mosquitto 2.1
option) is read.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from tidewire.bridges.mqtt.settings import (
    MAX_U32,
    NAME_PATTERN,
    REFUSED,
    Address,
    BridgeSettings,
    TopicRule,
    describe_errors,
)
from tidewire.errors import ConfigError

# Every option Mosquitto 2.0.11 knows (its src/conf.c); `auth_opt_*` and `plugin_opt_*` besides.
MOSQUITTO_OPTIONS = frozenset({"acl_file", "address", "addresses", "allow_anonymous", "allow_duplicate_messages",
                               "allow_zero_length_clientid", "auth_plugin", "auth_plugin_deny_special_chars",
                               "auto_id_prefix", "autosave_interval", "autosave_on_changes", "bind_address",
                               "bind_interface", "bridge_alpn", "bridge_attempt_unsubscribe", "bridge_bind_address",
                               "bridge_cafile", "bridge_capath", "bridge_certfile", "bridge_identity",
                               "bridge_insecure", "bridge_keyfile", "bridge_max_packet_size", "bridge_outgoing_retain",
                               "bridge_protocol_version", "bridge_psk", "bridge_require_ocsp", "bridge_tls_version",
                               "cafile", "capath", "certfile", "check_retain_source", "ciphers", "ciphers_tls1.3",
                               "cleansession", "clientid", "clientid_prefixes", "connection", "connection_messages",
                               "crlfile", "dhparamfile", "http_dir", "idle_timeout", "include_dir",
                               "keepalive_interval", "keyfile", "listener", "local_cleansession", "local_clientid",
                               "local_password", "local_username", "log_dest", "log_facility", "log_timestamp",
                               "log_timestamp_format", "log_type", "max_connections", "max_inflight_bytes",
                               "max_inflight_messages", "max_keepalive", "max_packet_size", "max_qos",
                               "max_queued_bytes", "max_queued_messages", "max_topic_alias", "maximum_qos",
                               "memory_limit", "message_size_limit", "mount_point", "notification_topic",
                               "notifications", "notifications_local_only", "password", "password_file",
                               "per_listener_settings", "persistence", "persistence_file", "persistence_location",
                               "persistent_client_expiration", "pid_file", "plugin", "port", "protocol", "psk_file",
                               "psk_hint", "queue_qos0_messages", "remote_clientid", "remote_password",
                               "remote_username", "require_certificate", "restart_timeout", "retain_available",
                               "retained_persistence", "retry_interval", "round_robin", "set_tcp_nodelay",
                               "socket_domain", "start_type", "sys_interval", "threshold", "tls_engine",
                               "tls_engine_kpass_sha1", "tls_keyform", "tls_version", "topic", "try_private",
                               "upgrade_outgoing_qos", "use_identity_as_username", "use_subject_as_username",
                               "use_username_as_clientid", "user", "username", "websockets_headers_size",
                               "websockets_log_level"})
PLUGIN_OPTION_PREFIXES = ("auth_opt_", "plugin_opt_")

# String options (the rest of the line): option -> field.
_STRINGS = {
    "bridge_alpn": "bridge_alpn", "bridge_bind_address": "bridge_bind_address", "bridge_cafile": "bridge_cafile",
    "bridge_capath": "bridge_capath", "bridge_certfile": "bridge_certfile", "bridge_keyfile": "bridge_keyfile",
    "bridge_tls_version": "bridge_tls_version", "clientid": "remote_clientid", "remote_clientid": "remote_clientid",
    "local_clientid": "local_clientid", "local_password": "local_password", "local_username": "local_username",
    "notification_topic": "notification_topic", "password": "remote_password", "remote_password": "remote_password",
    "username": "remote_username", "remote_username": "remote_username",
}
_BOOLEANS = frozenset({"bridge_attempt_unsubscribe", "bridge_insecure", "bridge_outgoing_retain", "cleansession",
                       "local_cleansession", "notifications", "notifications_local_only", "round_robin",
                       "try_private"})
_BOOLEAN_WORDS = {"true": True, "1": True, "false": False, "0": False}
_OTHER_BRIDGE_OPTIONS = frozenset({"address", "addresses", "bridge_identity", "bridge_max_packet_size",
                                   "bridge_protocol_version", "bridge_psk", "bridge_require_ocsp",
                                   "bridge_session_expiry_interval", "idle_timeout", "keepalive_interval",
                                   "restart_timeout", "start_type", "threshold", "topic"})
BRIDGE_OPTIONS = frozenset(_STRINGS) | _BOOLEANS | _OTHER_BRIDGE_OPTIONS
# Bridge options of later Mosquitto versions (2.1) that Mosquitto 2.0 refuses as unknown, and so does Tidewire.
_LATER_BRIDGE_OPTIONS = frozenset({"bridge_ciphers", "bridge_max_topic_alias", "bridge_receive_maximum",
                                   "bridge_reload_type", "bridge_tcp_keepalive", "bridge_tcp_keepalive_counter",
                                   "bridge_tcp_keepalive_idle", "bridge_tcp_keepalive_interval",
                                   "bridge_tcp_user_timeout", "bridge_tls_use_os_certs"})
_PROTOCOL_VERSIONS = ("mqttv31", "mqttv311", "mqttv50")
_DIRECTIONS = ("out", "in", "both")
_C_SPACE = " \t\n\v\f\r"  # C's isspace, which Mosquitto trims string values with
_ATOI = re.compile(r"[ \t\n\v\f\r]*([+-]?[0-9]+)")
_EMPTY_MARKER = '""'


@dataclass
class MosquittoBridges:
    """What a Mosquitto configuration holds for Tidewire: its bridges, and what was read past (for the log)."""

    bridges: list[BridgeSettings] = field(default_factory=list)
    """Every bridge, in Mosquitto's order (those of included files where their `include_dir` stands)."""
    ignored: list[tuple[int, str]] = field(default_factory=list)
    """(line, option) of each option that is not a bridge option (a listener, persistence, logging ...)."""
    notices: list[tuple[int, str]] = field(default_factory=list)
    """(line, what) where Mosquitto reads a value other than written (clamped, or a number read by atoi)."""
    included: dict[Path, MosquittoBridges] = field(default_factory=dict)
    """The files read through `include_dir`: each with its own bridges, ignored options and notices."""


def read_bridges(text: str, *, source: str = "<text>", hostname: str) -> MosquittoBridges:
    """The bridges of a Mosquitto configuration (a whole mosquitto.conf, or only `connection` blocks).

    `hostname` is the one Mosquitto would read (`gethostname`): the default client ids depend on it, and two
    bridges may not end up with one local client id. The settings keep what the file says (None where it says
    nothing); `BridgeSettings.resolved(hostname)` writes the defaults out.
    """
    reader = _Reader()
    result = reader.read(text, source, level=0)
    built = reader.build(hostname)
    result.bridges = [bridge for bridge, _ in built]
    for path, included in result.included.items():
        included.bridges = [bridge for bridge, block in built if block.source == str(path)]
    return result


def read_bridge_file(path: Path | str, *, hostname: str) -> MosquittoBridges:
    """`read_bridges` on a file; errors name the file."""
    return read_bridges(_read_text(Path(path)), source=str(path), hostname=hostname)


def _read_text(path: Path) -> str:
    # Bytes that are not UTF-8 survive (a comment may hold anything); a string value holding them is refused, as
    # Mosquitto refuses malformed UTF-8 in one.
    if path.is_dir():
        raise ConfigError(f"{path}: a directory, not a configuration file")
    try:
        return path.read_bytes().decode("utf-8", "surrogateescape")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read it: {exc.strerror or exc}") from None


def _mosquitto_order(name: str) -> list[tuple[int, int]]:
    """The sort key of Mosquitto's `scmp_p` (include_dir): letter case ignored, except to break a tie at the first
    place where two names differ only in case (`B.conf` before `b.conf` before `C.conf`); C's signed chars."""
    key = []
    for byte in name.encode("utf-8", "surrogateescape"):
        char = byte - 256 if byte >= 128 else byte
        key.append((char - 32 if 97 <= char <= 122 else char, char))
    return key


class _Words:
    """A line cut as Mosquitto cuts it: `next()` is strtok_r(" ") (runs of spaces skipped), `rest()` is
    strtok_r("") (the remainder after the one space that ended the last word, untrimmed)."""

    def __init__(self, line: str) -> None:
        self.line = line
        self.pos = 0

    def next(self) -> str | None:
        line, start = self.line, self.pos
        while start < len(line) and line[start] == " ":
            start += 1
        if start >= len(line):
            self.pos = len(line)
            return None
        end = line.find(" ", start)
        if end < 0:
            self.pos = len(line)
            return line[start:]
        self.pos = end + 1
        return line[start:end]

    def rest(self) -> str | None:
        if self.pos >= len(self.line):
            return None
        rest, self.pos = self.line[self.pos:], len(self.line)
        return rest


@dataclass
class _Block:
    """One `connection` block as read so far: its values by field, and the line that set each."""

    name: str
    source: str
    line: int
    values: dict[str, Any] = field(default_factory=dict)
    lines: dict[str, int] = field(default_factory=dict)
    addresses: list[Address] = field(default_factory=list)
    topics: list[TopicRule] = field(default_factory=list)

    def set(self, name: str, value: Any, line: int) -> None:
        self.values[name] = value
        self.lines[name] = line


@dataclass
class _Line:
    """Where a line is: for errors and notices."""

    source: str
    number: int
    block: _Block | None
    result: MosquittoBridges

    def error(self, message: str) -> ConfigError:
        where = f"{self.source}:{self.number}: "
        if self.block is not None:
            where += f"connection {self.block.name}: "
        return ConfigError(where + message)

    def notice(self, message: str) -> None:
        self.result.notices.append((self.number, message))

    def atoi(self, option: str, word: str) -> int:
        """C's atoi, as Mosquitto reads numbers; a word that is not a plain number makes a notice."""
        match = _ATOI.match(word)
        value = int(match.group(1)) if match else 0
        if match is None or match.end() != len(word):
            self.notice(f"{option} {word!r} read as {value}, as Mosquitto reads it")
        return value


class _Reader:
    """Reads one configuration and the files it includes; `build` then makes the settings of every block."""

    def __init__(self) -> None:
        self.blocks: list[_Block] = []

    def read(self, text: str, source: str, level: int) -> MosquittoBridges:
        result = MosquittoBridges()
        block: _Block | None = None
        for number, raw in enumerate(text.split("\n"), start=1):
            # Mosquitto skips a line that starts with `#`, CR or LF, before anything else.
            if not raw or raw[0] in "#\r":
                continue
            words = _Words(raw.rstrip("\r"))
            option = words.next()
            if option is None:
                continue
            line = _Line(source, number, None if option == "connection" else block, result)
            if option == "connection":
                block = self._connection(line, words)
            elif option == "include_dir":
                if level == 0:
                    self._include(line, words)
                else:
                    result.ignored.append((number, option))  # Mosquitto follows include_dir in the main file only
            elif option in BRIDGE_OPTIONS:
                if block is None:
                    raise line.error(f"{option} before any `connection <name>` line: bridge options belong to the "
                                     "block a `connection` line opens (Mosquitto: Invalid bridge configuration)")
                self._bridge_option(line, block, option, words)
            elif option in MOSQUITTO_OPTIONS or option.startswith(PLUGIN_OPTION_PREFIXES):
                result.ignored.append((number, option))
            elif option in _LATER_BRIDGE_OPTIONS:
                raise line.error(f"{option} is an option of later Mosquitto versions (2.1) that Tidewire's bridge "
                                 "does not support (Mosquitto 2.0 does not know it either)")
            else:
                raise line.error(f"unknown option {option!r} (Mosquitto refuses it too)")
        return result

    def _connection(self, line: _Line, words: _Words) -> _Block:
        name = words.next()
        if name is None:
            raise line.error("`connection` without a name")
        if not NAME_PATTERN.fullmatch(name):
            raise line.error(f"the bridge name {name!r} may hold only letters, digits, '_', '.' and '-'")
        for other in self.blocks:
            if other.name == name:
                raise line.error(f"a second bridge named {name!r} (the first: {other.source}:{other.line})")
        block = _Block(name, line.source, line.number)
        self.blocks.append(block)
        return block

    def _include(self, line: _Line, words: _Words) -> None:
        directory = words.rest()  # untrimmed, as Mosquitto takes it
        if directory is None:
            raise line.error("include_dir without a directory")
        try:
            names = os.listdir(directory)
        except OSError as exc:
            raise line.error(f"include_dir: cannot open the directory {directory!r}: {exc.strerror}") from None
        for name in sorted((n for n in names if len(n) > 5 and n.endswith(".conf")), key=_mosquitto_order):
            path = Path(f"{directory}/{name}")
            line.result.included[path] = self.read(_read_text(path), str(path), level=1)

    def _bridge_option(self, line: _Line, block: _Block, option: str, words: _Words) -> None:
        if option in _BOOLEANS:
            block.set(option, self._boolean(line, option, words), line.number)
        elif option in _STRINGS:
            self._string(line, block, option, words)
        elif option in ("address", "addresses"):
            self._addresses(line, block, option, words)
        elif option == "topic":
            block.topics.append(self._topic(line, words))  # checked here: a topic's errors name its own line
        elif option == "keepalive_interval":
            seconds = line.atoi(option, self._word(line, option, words))
            if seconds > 65535:
                raise line.error(f"keepalive_interval {seconds} is above 65535 (Mosquitto refuses it too)")
            if seconds < 5:
                line.notice(f"keepalive_interval {seconds} is too low: 5 s, as Mosquitto")
                seconds = 5
            block.set(option, seconds, line.number)
        elif option == "restart_timeout":
            block.set(option, self._restart_timeout(line, words), line.number)
        elif option == "start_type":
            self._start_type(line, block, words)
        elif option == "bridge_protocol_version":
            version = words.rest()  # the rest of the line, untrimmed: `mqttv311 ` is refused, as by Mosquitto
            if version is None:
                raise line.error("bridge_protocol_version without a value")
            if version not in _PROTOCOL_VERSIONS:
                raise line.error(f"bridge_protocol_version {version!r} is not mqttv31, mqttv311 or mqttv50")
            block.set(option, version, line.number)
        elif option == "bridge_max_packet_size":
            size = line.atoi(option, self._word(line, option, words))
            if size < 0:
                line.notice(f"bridge_max_packet_size {size} is below 0: 0 (no limit), as Mosquitto")
                size = 0
            block.set(option, size, line.number)
        elif option == "bridge_session_expiry_interval":
            seconds = line.atoi(option, self._word(line, option, words))
            if not 0 <= seconds <= MAX_U32:
                raise line.error(f"bridge_session_expiry_interval {seconds} is not between 0 and {MAX_U32}")
            line.notice("bridge_session_expiry_interval is a Mosquitto 2.1 option: Mosquitto 2.0 refuses it")
            block.set(option, seconds, line.number)
        elif option == "bridge_require_ocsp":
            if self._boolean(line, option, words):
                raise line.error(f"{option}: {REFUSED[option]}")
        else:  # threshold, idle_timeout, bridge_identity, bridge_psk
            raise line.error(f"{option}: {REFUSED[option]}")

    @staticmethod
    def _word(line: _Line, option: str, words: _Words) -> str:
        word = words.next()
        if word is None:
            raise line.error(f"{option} without a value")
        return word

    def _boolean(self, line: _Line, option: str, words: _Words) -> bool:
        word = self._word(line, option, words)
        if word not in _BOOLEAN_WORDS:
            raise line.error(f"{option} {word!r} is not true, false, 1 or 0")
        return _BOOLEAN_WORDS[word]

    @staticmethod
    def _string(line: _Line, block: _Block, option: str, words: _Words) -> None:
        name = _STRINGS[option]
        value = words.rest()
        if value is None:
            raise line.error(f"{option} without a value")
        if name in block.values:
            raise line.error(f"{option} given twice in one block (first at line {block.lines[name]}; Mosquitto "
                             "refuses it too)")
        value = value.strip(_C_SPACE)
        if not value:
            raise line.error(f"{option} without a value")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise line.error(f"{option}: its value is not UTF-8") from None
        block.set(name, value, line.number)

    @staticmethod
    def _addresses(line: _Line, block: _Block, option: str, words: _Words) -> None:
        if block.addresses:
            raise line.error(f"{option} given twice in one block (first at line {block.lines['addresses']}): put "
                             "every host[:port] on one line (Mosquitto: Invalid bridge configuration)")
        while (word := words.next()) is not None and not word.startswith("#"):
            host, colon, port_text = word.rpartition(":")
            port = line.atoi(option, port_text) if colon else 1883
            if not colon:
                host = word
            elif not 1 <= port <= 65535:
                raise line.error(f"{option} {word!r}: the port {port} is not between 1 and 65535")
            if host.startswith("[") and host.endswith("]"):
                host = host[1:-1]  # `[::1]:1883`; Mosquitto itself takes the last colon: `::1:1883`
            try:
                block.addresses.append(Address(host=host, port=port))
            except ValidationError as exc:
                raise line.error(f"{option} {word!r}: {describe_errors(exc)}") from None
        if not block.addresses:
            raise line.error(f"{option} without a host")
        block.lines["addresses"] = line.number

    @staticmethod
    def _topic(line: _Line, words: _Words) -> TopicRule:
        # topic pattern [[[ out | in | both ] qos-level] local-prefix remote-prefix], with Mosquitto's quirks: a
        # third or fourth word starting with `#` ends the line (a comment), a fifth is taken as `""`.
        pattern = words.next()
        if pattern is None:
            raise line.error("topic without a pattern")
        direction, qos, local_prefix, remote_prefix = "out", 0, "", ""
        word = words.next()
        if word is not None:
            direction = word.lower()
            if direction not in _DIRECTIONS:
                raise line.error(f"topic: the direction {word!r} is not out, in or both")
            word = words.next()
            if word is not None:
                if word.startswith("#"):
                    words.rest()
                    qos = 0
                else:
                    qos = line.atoi("topic qos", word)
                if not 0 <= qos <= 2:
                    raise line.error(f"topic: the QoS {word!r} is not 0, 1 or 2")
                word = words.next()
                if word is not None:
                    if word.startswith("#"):
                        words.rest()
                    elif word != _EMPTY_MARKER:
                        local_prefix = word
                    word = words.next()
                    if word is not None and word != _EMPTY_MARKER and not word.startswith("#"):
                        remote_prefix = word
        try:
            return TopicRule(pattern="" if pattern == _EMPTY_MARKER else pattern, direction=direction, qos=qos,
                             local_prefix=local_prefix, remote_prefix=remote_prefix)
        except ValidationError as exc:
            raise line.error(f"topic: {describe_errors(exc)}") from None

    def _restart_timeout(self, line: _Line, words: _Words) -> tuple[float, float]:
        base = line.atoi("restart_timeout", self._word(line, "restart_timeout", words))
        if base < 1:
            line.notice(f"restart_timeout {base} is too low: 1 s, as Mosquitto")
            base = 1
        word = words.next()
        if word is None:
            return (float(base), float(base))
        cap = line.atoi("restart_timeout", word)
        if cap < base:
            raise line.error(f"restart_timeout: the cap {cap} is lower than the base {base} (Mosquitto refuses it "
                             "too)")
        return (float(base), float(cap))

    def _start_type(self, line: _Line, block: _Block, words: _Words) -> None:
        word = self._word(line, "start_type", words)
        if word == "lazy":
            raise line.error(REFUSED["start_type lazy"])
        if word == "manual":
            raise line.error("start_type manual is not supported (Mosquitto refuses it too)")
        if word not in ("automatic", "once"):
            raise line.error(f"start_type {word!r} is not automatic or once")
        block.set("start_type", word, line.number)

    def build(self, hostname: str) -> list[tuple[BridgeSettings, _Block]]:
        """The settings of every block, checked as Mosquitto checks them once every file is read."""
        built = []
        for block in self.blocks:
            where = f"{block.source}:{block.line}: connection {block.name}"
            if not block.addresses:
                raise ConfigError(f"{where}: no `address` line (every bridge needs a remote broker)")
            if not block.topics:
                raise ConfigError(f"{where}: no `topic` line (every bridge needs one)")
            data = {"name": block.name, "addresses": block.addresses, "topics": block.topics, **block.values}
            try:
                bridge = BridgeSettings.model_validate(data, context={"structured": True})
            except ValidationError as exc:
                raise ConfigError("\n".join(self._located(block, error) for error in exc.errors())) from None
            built.append((bridge, block))
        local_ids: dict[str, _Block] = {}
        for bridge, block in built:
            local_id = bridge.resolved(hostname).local_client_id
            first = local_ids.setdefault(local_id, block)
            if first is not block:
                raise ConfigError(f"{block.source}:{block.line}: connection {block.name}: the local client id "
                                  f"{local_id!r} is also that of connection {first.name} ({first.source}:"
                                  f"{first.line}): set local_clientid on one of them (Mosquitto refuses it too)")
        return built

    @staticmethod
    def _located(block: _Block, error: Any) -> str:
        """One pydantic error as `source:line: connection name: option: problem`, at the line that set the option.
        A problem between options (`remote_password needs remote_username`) is placed at the line of the first
        option its message names that the block sets, else at the `connection` line."""
        loc = error["loc"]
        message = error["msg"].removeprefix("Value error, ")
        named = [str(loc[0])] if loc else re.findall(r"[a-z_]+", message)
        number = next((block.lines[name] for name in named if name in block.lines), block.line)
        prefix = f"{loc[0]}: " if loc else ""
        return f"{block.source}:{number}: connection {block.name}: {prefix}{message}"
