"""Operator code without forking: the plugin interfaces, the entry point groups they are found in, and how a name
from the settings becomes a plugin object.

Four groups of Python entry points (`importlib.metadata`), each entry point a *factory* called with the plugin's
options (the table `[plugins.options.<name>]`, a dict) that returns the object:

    tidewire.auth           an `Authenticator` (extensions/authentication.py): a source of `auth_chain`
    tidewire.authz          an `Authorizer` (extensions/hooks.py): one of `authorizers`, every one must allow
    tidewire.publish_hooks  a `PublishHook` (below): one of `publish_hooks`, run in order before the append
    tidewire.sinks          a `Sink` (below): where a rule's results go (a rule's `sink` action)

The built-in sources (`file`, `jwt`, `http`; the authorizer `acl`) are a registry consulted *before* the entry
points (`PluginCatalog(builtins=...)`), under the same names, so a chain mixes them (`auth_chain = ["file",
"ldap"]`). Why a registry and not entry points in Tidewire's own metadata: the built-ins are configured by the
node's settings (files, keys, URLs), not by an options table; they must exist whenever the code does, also in a
checkout run from its folder whose installed metadata is stale or absent; and no installed distribution can
take one of their names and so change what `auth_chain = ["file"]` means (it is logged and ignored).

What a plugin may cost the node is bounded elsewhere (`extensions/plugin_guard.py`): a timeout per call, and a
counted error and the plugin's configured default when it raises or hangs.
"""

from __future__ import annotations

import importlib.metadata
import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, Protocol

from tidewire.errors import ConfigError, TidewireError

if TYPE_CHECKING:
    from tidewire.extensions.hooks import ClientInfo
    from tidewire.store.base import Message
    from tidewire.store.properties import Properties

log = logging.getLogger("tidewire.plugins")

AUTH_GROUP = "tidewire.auth"
AUTHZ_GROUP = "tidewire.authz"
PUBLISH_HOOK_GROUP = "tidewire.publish_hooks"
SINK_GROUP = "tidewire.sinks"

# What each group's objects must have (checked when a plugin is created, so a wrong one stops the start).
REQUIRED_METHODS: dict[str, tuple[str, ...]] = {
    AUTH_GROUP: ("authenticate",),
    AUTHZ_GROUP: ("allow_publish", "subscribe_access", "allow_read"),
    PUBLISH_HOOK_GROUP: ("on_publish",),
    SINK_GROUP: ("write",),
}
# How an error names a group's members.
KINDS = {AUTH_GROUP: "authentication source", AUTHZ_GROUP: "authorizer", PUBLISH_HOOK_GROUP: "publish hook",
         SINK_GROUP: "sink"}


class Action(Enum):
    ALLOW = "allow"
    DENY = "deny"
    REWRITE = "rewrite"


@dataclass(frozen=True, slots=True)
class PublishDecision:
    """A publish hook's answer. REWRITE replaces what is given (not None): `topic` (checked against the ACL again),
    `payload`, `properties` (all of them, message expiry included: `Properties.expiry_interval`)."""

    action: Action
    reason: str = ""  # DENY: for the log line
    topic: str | None = None
    payload: bytes | None = None
    properties: Properties | None = None


ALLOW = PublishDecision(Action.ALLOW)


def deny(reason: str = "") -> PublishDecision:
    return PublishDecision(Action.DENY, reason)


def rewrite(topic: str | None = None, payload: bytes | None = None,
            properties: Properties | None = None) -> PublishDecision:
    return PublishDecision(Action.REWRITE, topic=topic, payload=payload, properties=properties)


class PublishHook(Protocol):
    """Sees every publish of every protocol after the ACL and before the append; hooks run in the configured
    order, each on what the previous one let through. `message` is the node's: read it, change it only by
    returning a rewrite. Optional: `async def close(self) -> None`, called when the node stops."""

    async def on_publish(self, client: ClientInfo, message: Message) -> PublishDecision: ...


class SinkRefused(TidewireError):
    """A sink's permanent refusal of what it was given: retrying cannot help (the rule dead-letters it)."""


class Sink(Protocol):
    """Where a rule's results go (group `tidewire.sinks`, chosen by a rule's `sink` action). The rule engine's own
    actions (republish, AMQP, RocketMQ, bridge, webhook: `bridges/rules/actions.py`) are sinks too."""

    async def write(self, results: Sequence[dict[str, Any]], messages: Sequence[Message]) -> None:
        """Deliver these results (the rule's SELECT of each message, and the messages). Return once they are
        delivered; raise `SinkRefused` for a permanent refusal, anything else to have them retried."""

    async def close(self) -> None: ...


Factory = Callable[[dict[str, Any]], object]


class PluginCatalog:
    """The plugins this process can create: built-in names first, then the installed entry points.

    `builtins` names the built-in members of each group (the caller makes those itself, from the settings);
    `discover` is `importlib.metadata.entry_points` (a test may pass its own)."""

    def __init__(self, builtins: Mapping[str, Collection[str]] | None = None,
                 discover: Callable[..., Any] = importlib.metadata.entry_points) -> None:
        self.builtins = {group: tuple(names) for group, names in (builtins or {}).items()}
        self._discover = discover

    def _entry_points(self, group: str) -> list[importlib.metadata.EntryPoint]:
        return list(self._discover(group=group))

    def installed(self, group: str) -> list[str]:
        """Every name `create` knows in `group`: the built-ins in their order, then the entry points, sorted."""
        builtin = self.builtins.get(group, ())
        return [*builtin, *sorted({ep.name for ep in self._entry_points(group)} - set(builtin))]

    def is_builtin(self, group: str, name: str) -> bool:
        return name in self.builtins.get(group, ())

    def create(self, group: str, name: str, options: Mapping[str, Any] | None = None) -> object:
        """Load the entry point `name` of `group` and call its factory with `options`. ConfigError, naming the
        installed ones, for an unknown name; naming the plugin and why, when it cannot be loaded or made."""
        kind = KINDS.get(group, group)
        if self.is_builtin(group, name):
            raise ConfigError(f"{kind} {name!r} is built in: it is configured by its own settings")
        found = [ep for ep in self._entry_points(group) if ep.name == name]
        if not found:
            installed = ", ".join(self.installed(group)) or "none"
            raise ConfigError(f"no {kind} named {name!r} (entry point group {group}); installed: {installed}")
        if len({ep.value for ep in found}) > 1:
            where = ", ".join(f"{ep.value} ({_distribution(ep)})" for ep in found)
            raise ConfigError(f"{kind} {name!r} is declared by more than one distribution: {where}")
        entry = found[0]
        origin = f"{kind} {name!r} ({entry.value} from {_distribution(entry)})"
        try:
            factory = entry.load()
        except Exception as exc:  # an ImportError, or whatever the plugin's module raises on import
            raise ConfigError(f"{origin} cannot be loaded: {type(exc).__name__}: {exc}") from exc
        if not callable(factory):
            raise ConfigError(f"{origin} is not a factory (a callable taking the options)")
        try:
            made = factory(dict(options or {}))
        except Exception as exc:
            raise ConfigError(f"{origin} refused its options: {type(exc).__name__}: {exc}") from exc
        missing = [method for method in REQUIRED_METHODS.get(group, ()) if not callable(getattr(made, method, None))]
        if missing:
            raise ConfigError(f"{origin} made a {type(made).__name__}, which has no {', '.join(missing)}")
        log.info("plugin.loaded", extra={"plugin": name, "group": group, "entry_point": entry.value})
        return made

    def shadowed(self, group: str) -> list[str]:
        """Entry points of `group` that take a built-in's name (and are ignored): for a warning at start."""
        builtin = set(self.builtins.get(group, ()))
        return sorted({f"{ep.name} ({_distribution(ep)})" for ep in self._entry_points(group) if ep.name in builtin})


def _distribution(entry: importlib.metadata.EntryPoint) -> str:
    dist = getattr(entry, "dist", None)
    if dist is None:
        return "an unknown distribution"
    return f"{dist.name} {dist.version}"
