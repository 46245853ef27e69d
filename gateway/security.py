"""Authentication and authorization as configured: the chain of sources (password file, JWT, HTTP hook and
authentication plugins), MQTT 5 enhanced authentication (SCRAM-SHA-256 from the same password file), the ACL file
and authorizer plugins, the publish hooks; and their reload on SIGHUP, each keeping its previous state when its
new files are bad."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tidewire.errors import ConfigError
from tidewire.extensions.acl import AclFile
from tidewire.extensions.authentication import AuthChain, Authenticator
from tidewire.extensions.dynsec.source import ControlTopicGuard, DynsecAuthenticator, DynsecState
from tidewire.extensions.hooks import AllowAll, Authorizer
from tidewire.extensions.http_auth import HttpAuthenticator
from tidewire.extensions.password_file import PasswordFileAuthenticator
from tidewire.extensions.plugin_guard import (
    ALLOWED_DEFAULTS,
    DEFAULTS,
    Guard,
    GuardedAuthenticator,
    GuardedAuthorizer,
    GuardedHook,
    PluginErrors,
)
from tidewire.extensions.plugins import AUTH_GROUP, AUTHZ_GROUP, PUBLISH_HOOK_GROUP, PluginCatalog
from tidewire.extensions.scram import ScramSha256
from tidewire.gateway.config import Settings
from tidewire.gateway.core.clock import SYSTEM_CLOCK, Clock

if TYPE_CHECKING:
    from tidewire.gateway.node import Node

log = logging.getLogger("tidewire.plugins")

# The built-in members of each entry point group: made from the settings here, found before any entry point.
BUILTIN_AUTH = ("file", "jwt", "http", "dynsec")
BUILTIN_AUTHZ = ("acl",)
BUILTINS = {AUTH_GROUP: BUILTIN_AUTH, AUTHZ_GROUP: BUILTIN_AUTHZ}


@dataclass(slots=True)
class Security:
    chain: AuthChain
    authorizer: Authorizer  # the ACL file, or allow-all
    enhanced: ScramSha256 | None
    passwords: PasswordFileAuthenticator | None
    authorizers: list[GuardedAuthorizer] = field(default_factory=list)  # plugins, after the ACL (`Narrowed`)
    hooks: list[GuardedHook] = field(default_factory=list)
    plugin_errors: PluginErrors = field(default_factory=PluginErrors)
    dynsec: DynsecAuthenticator | None = None  # dynamic security (`dynsec_enabled`; gateway.ops.dynsec runs it)
    guards: list[Authorizer] = field(default_factory=list)  # built-in narrowing authorizers, after the plugins

    @classmethod
    def build(cls, settings: Settings, catalog: PluginCatalog | None = None, clock: Clock = SYSTEM_CLOCK) -> Security:
        """ValueError (naming the file and line, or the plugin) when a configured file or plugin cannot be used:
        refuse to start rather than run with less protection than the operator asked for. `catalog`: where
        plugins are found (default: the installed entry points)."""
        catalog = catalog if catalog is not None else PluginCatalog(BUILTINS)
        passwords = None
        if settings.password_file is not None or settings.auth_file is not None:
            passwords = PasswordFileAuthenticator([settings.password_file, settings.auth_file],
                                                  settings.password_hash_threads,
                                                  inline_iterations=settings.password_inline_iterations)
        jwt: Authenticator | None = None
        if settings.jwt_configured:  # PyJWT and cryptography (tidewire[jwt]) are imported only then
            from tidewire.extensions.jwt_auth import JwtAuthenticator

            jwt = JwtAuthenticator.from_settings(settings)
        dynsec = None
        if settings.dynsec_enabled:
            dynsec = DynsecAuthenticator(DynsecState(settings.dynsec_password_iterations),
                                         settings.password_inline_iterations)
        available: dict[str, Authenticator | None] = {
            "file": passwords, "jwt": jwt, "http": HttpAuthenticator.from_settings(settings), "dynsec": dynsec}
        missing = [name for name, source in available.items() if source is not None and name not in settings.auth_chain]
        if missing:
            raise ValueError(f"configured but not in auth_chain: {', '.join(missing)}")
        if settings.acl_file is not None and "acl" not in settings.authorizers:
            raise ValueError("acl_file is set but `acl` is not in authorizers")
        plugins = _Plugins(settings, catalog, clock)
        sources: list[Authenticator] = []
        for name in _unique("auth_chain", settings.auth_chain):
            if name in available:
                if (builtin := available[name]) is not None:
                    sources.append(builtin)
            else:
                sources.append(GuardedAuthenticator(plugins.make(AUTH_GROUP, name), plugins.guard(name, "auth")))
        authorizers = [GuardedAuthorizer(plugins.make(AUTHZ_GROUP, name), plugins.guard(name, "authz"))
                       for name in _unique("authorizers", settings.authorizers) if name != "acl"]
        hooks = [GuardedHook(plugins.make(PUBLISH_HOOK_GROUP, name), plugins.guard(name, "publish_hook"))
                 for name in _unique("publish_hooks", settings.publish_hooks)]
        plugins.check_unused()
        allow_anonymous = settings.allow_anonymous
        if allow_anonymous is None:  # Mosquitto 2: anonymous only while nothing can authenticate anyone
            allow_anonymous = not sources and not (settings.use_identity_as_username
                                                   or settings.use_subject_as_username)
        enhanced = None
        if passwords is not None and len(passwords.scram_credentials):
            enhanced = ScramSha256(passwords.scram_credentials)
        authorizer: Authorizer = AclFile.load(settings.acl_file) if settings.acl_file else AllowAll()
        # Without an ACL file every client may do anything: the dynamic-security control topics need a guard then.
        guards: list[Authorizer] = [ControlTopicGuard()] if dynsec is not None and settings.acl_file is None else []
        return cls(AuthChain(sources, allow_anonymous), authorizer, enhanced, passwords, authorizers, hooks,
                   plugins.errors, dynsec, guards)

    def reload(self, settings: Settings, node: Node) -> list[str]:
        """Re-read every file; returns what failed (that part keeps its previous state)."""
        errors = self.chain.reload()
        if self.passwords is not None:
            if self.enhanced is None:
                self.enhanced = ScramSha256(self.passwords.scram_credentials)
                node.enhanced_auth = self.enhanced
            else:
                self.enhanced.set_credentials(self.passwords.scram_credentials)
        if settings.acl_file is not None:
            try:
                self.authorizer = AclFile.load(settings.acl_file)
                node.authorizer.base = self.authorizer
            except (OSError, ValueError) as exc:
                errors.append(f"acl: {exc}")
        return errors

    async def close(self) -> None:
        await self.chain.close()
        for authorizer in self.authorizers:
            await authorizer.close()
        for hook in self.hooks:
            await hook.close()


def _unique(setting: str, names: Sequence[str]) -> list[str]:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ConfigError(f"{setting} names {name!r} twice")
        seen.add(name)
    return list(names)


class _Plugins:
    """The plugins the settings name: created with their options, guarded with their timeout and default."""

    def __init__(self, settings: Settings, catalog: PluginCatalog, clock: Clock) -> None:
        self.settings = settings
        self.catalog = catalog
        self.clock = clock
        self.errors = PluginErrors()
        self.made: set[str] = set()
        for group in (AUTH_GROUP, AUTHZ_GROUP, PUBLISH_HOOK_GROUP):
            if shadowed := catalog.shadowed(group):
                log.warning("plugin.shadowed", extra={"group": group, "ignored": ", ".join(shadowed)})

    def make(self, group: str, name: str) -> Any:  # checked against the group's interface
        if name in self.made:
            raise ConfigError(f"plugin {name!r} is named in more than one setting (one role per plugin name)")
        self.made.add(name)
        return self.catalog.create(group, name, self.settings.plugin_options.get(name, {}))

    def guard(self, name: str, role: str) -> Guard:
        default = self.settings.plugin_defaults.get(name, DEFAULTS[role])
        if default not in ALLOWED_DEFAULTS[role]:
            allowed = " or ".join(repr(d) for d in ALLOWED_DEFAULTS[role])
            raise ConfigError(f"plugin_defaults: {name} is a {role.replace('_', ' ')}: its default is {allowed}, "
                              f"not {default!r}")
        timeout = self.settings.plugin_timeouts.get(name, self.settings.plugin_timeout)
        return Guard(name, timeout, default, self.errors, self.clock)

    def check_unused(self) -> None:
        """Options, defaults or timeouts for a name no setting chose: a typo would otherwise go unnoticed."""
        settings = self.settings
        for setting, given in (("plugin_options", settings.plugin_options),
                               ("plugin_defaults", settings.plugin_defaults),
                               ("plugin_timeouts", settings.plugin_timeouts)):
            stray = sorted(set(given) - self.made)
            if stray:
                builtin = [name for name in stray if name in BUILTIN_AUTH or name in BUILTIN_AUTHZ]
                why = (f" ({', '.join(builtin)}: built in, configured by its own settings)" if builtin else
                       " (not in auth_chain, authorizers or publish_hooks)")
                raise ConfigError(f"{setting} for {', '.join(stray)}, which is no plugin in use{why}")
