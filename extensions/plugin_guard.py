"""What a plugin may cost the node: each call is bounded by its timeout, and a raise, a timeout or an answer of
the wrong kind becomes a counted error (`PluginErrors`: `tidewire_plugin_errors_total{plugin,kind}`), one log line
per failure streak, and the plugin's configured default answer. Nothing a plugin does reaches the node as an
exception.

Kinds: `error` (it raised), `timeout` (no answer within its timeout), `invalid` (an answer of the wrong type, or a
rewrite to a topic that is not a valid topic name). Defaults: authentication sources `ignore` (the next source
decides) or `deny` (refused, as an unavailable service); authorizers and publish hooks `allow` or `deny`.

An async call is cancelled at its timeout. A synchronous one (an `Authorizer`'s methods are called on the hot
path and cannot be awaited) cannot be interrupted: its time is measured with the clock, and an answer later than
the timeout is discarded for the default, and counted, but the event loop was blocked meanwhile. So is it by an
async plugin that blocks without awaiting (the same measure applies to it).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from tidewire.extensions.authentication import AuthDecision, Authenticator, AuthRequest, Failure, Outcome
from tidewire.extensions.hooks import Authorizer, ClientInfo, SubscribeAccess
from tidewire.extensions.plugins import ALLOW, PublishDecision, PublishHook, deny
from tidewire.gateway.core.clock import Clock
from tidewire.store.base import Message

log = logging.getLogger("tidewire.plugins")

ERROR, TIMEOUT, INVALID = "error", "timeout", "invalid"
Default = Literal["allow", "deny", "ignore"]
DEFAULTS: dict[str, Default] = {"auth": "ignore", "authz": "deny", "publish_hook": "allow"}
ALLOWED_DEFAULTS: dict[str, tuple[Default, ...]] = {"auth": ("ignore", "deny"), "authz": ("allow", "deny"),
                                                    "publish_hook": ("allow", "deny")}
_FAILED: Any = object()  # what `Guard.call` returns instead of an answer


class PluginErrors:
    """Failed plugin calls by (plugin name, kind), for the metrics. One per node."""

    __slots__ = ("counts",)

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str], int] = {}

    def add(self, plugin: str, kind: str) -> None:
        key = (plugin, kind)
        self.counts[key] = self.counts.get(key, 0) + 1


class Guard:
    """One plugin's calls: timeout, counting, a log line per failure streak (its first failure, then its recovery)."""

    __slots__ = ("_failing", "clock", "default", "errors", "name", "timeout")

    def __init__(self, name: str, timeout: float, default: Default, errors: PluginErrors, clock: Clock) -> None:
        self.name = name
        self.timeout = timeout
        self.default = default
        self.errors = errors
        self.clock = clock
        self._failing = False

    def failed(self, kind: str, exc: BaseException | None = None, detail: str = "") -> None:
        self.errors.add(self.name, kind)
        if self._failing:
            return  # the streak was logged at its first failure
        self._failing = True
        log.warning("plugin.failed", exc_info=exc if kind == ERROR else None,
                    extra={"plugin": self.name, "kind": kind, "default": self.default,
                           "detail": detail or (f"{type(exc).__name__}: {exc}" if exc is not None else "")})

    def succeeded(self) -> None:
        if self._failing:
            self._failing = False
            log.info("plugin.recovered", extra={"plugin": self.name})

    async def call(self, start: Callable[[], Awaitable[Any]]) -> Any:
        """`await start()` within the timeout; `_FAILED` (counted and logged) if it raises or is late."""
        began = self.clock.monotonic()
        try:
            async with asyncio.timeout(self.timeout) as scope:
                result = await start()
        except TimeoutError as exc:
            self.failed(TIMEOUT if scope.expired() else ERROR, exc)
            return _FAILED
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # our own task is being cancelled (the node stops): not the plugin's doing
            self.failed(ERROR, exc)
            return _FAILED
        except Exception as exc:
            self.failed(ERROR, exc)
            return _FAILED
        if self.clock.monotonic() - began > self.timeout:  # it blocked the loop instead of awaiting
            self.failed(TIMEOUT, detail="answered after its timeout without yielding to the event loop")
            return _FAILED
        return result

    def call_sync(self, method: Callable[..., Any], *args: Any) -> Any:
        """A synchronous call: `_FAILED` if it raises or answers after its timeout (it cannot be interrupted)."""
        clock = self.clock
        began = clock.monotonic()
        try:
            result = method(*args)
        except Exception as exc:
            self.failed(ERROR, exc)
            return _FAILED
        if clock.monotonic() - began > self.timeout:
            self.failed(TIMEOUT, detail="a synchronous call took longer than its timeout")
            return _FAILED
        return result

    async def close(self, plugin: object) -> None:
        closing = getattr(plugin, "close", None)
        if callable(closing):
            await self.call(closing)


class GuardedAuthenticator:
    """An authentication plugin as a source of the chain; its default: `ignore` or `deny` (unavailable)."""

    __slots__ = ("_on_failure", "guard", "name", "plugin")

    def __init__(self, plugin: Authenticator, guard: Guard) -> None:
        self.plugin = plugin
        self.guard = guard
        self.name = guard.name
        self._on_failure = (AuthDecision(Outcome.DENY, failure=Failure.UNAVAILABLE, reason=f"plugin {self.name} failed")
                            if guard.default == "deny" else AuthDecision(Outcome.IGNORE))

    async def authenticate(self, request: AuthRequest) -> AuthDecision:
        guard = self.guard
        decision = await guard.call(lambda: self.plugin.authenticate(request))
        if decision is _FAILED:
            return self._on_failure
        if not isinstance(decision, AuthDecision):
            guard.failed(INVALID, detail=f"answered a {type(decision).__name__}, not an AuthDecision")
            return self._on_failure
        guard.succeeded()
        return decision

    def reload(self) -> None:
        reload = getattr(self.plugin, "reload", None)
        if not callable(reload):
            return
        try:
            reload()
        except Exception as exc:  # the chain reports ValueError/OSError; any other must not end the SIGHUP handler
            raise ValueError(f"{type(exc).__name__}: {exc}") from exc

    async def close(self) -> None:
        await self.guard.close(self.plugin)


class GuardedAuthorizer:
    """An authorization plugin; its default (`allow` or `deny`) answers every call it fails."""

    __slots__ = ("_access", "_allowed", "guard", "plugin")

    def __init__(self, plugin: Authorizer, guard: Guard) -> None:
        self.plugin = plugin
        self.guard = guard
        self._allowed = guard.default == "allow"
        self._access = SubscribeAccess.GRANTED if self._allowed else SubscribeAccess.DENIED

    def _check(self, answer: Any) -> bool:
        if answer is _FAILED:
            return self._allowed
        if not isinstance(answer, bool):
            self.guard.failed(INVALID, detail=f"answered a {type(answer).__name__}, not a bool")
            return self._allowed
        self.guard.succeeded()
        return answer

    def allow_publish(self, client: ClientInfo, topic: str) -> bool:
        return self._check(self.guard.call_sync(self.plugin.allow_publish, client, topic))

    def allow_read(self, client: ClientInfo, topic: str) -> bool:
        return self._check(self.guard.call_sync(self.plugin.allow_read, client, topic))

    def subscribe_access(self, client: ClientInfo, topic_filter: str) -> SubscribeAccess:
        answer = self.guard.call_sync(self.plugin.subscribe_access, client, topic_filter)
        if answer is _FAILED:
            return self._access
        try:
            access = SubscribeAccess(answer)
        except (TypeError, ValueError):
            self.guard.failed(INVALID, detail=f"answered {answer!r}, not a SubscribeAccess")
            return self._access
        self.guard.succeeded()
        return access

    async def close(self) -> None:
        await self.guard.close(self.plugin)


class GuardedHook:
    """A publish hook; its default (`allow` or `deny`) answers every call it fails."""

    __slots__ = ("_on_failure", "guard", "name", "plugin")

    def __init__(self, plugin: PublishHook, guard: Guard) -> None:
        self.plugin = plugin
        self.guard = guard
        self.name = guard.name
        self._on_failure = ALLOW if guard.default == "allow" else deny(f"publish hook {self.name} failed")

    @property
    def on_failure(self) -> PublishDecision:
        """The default answer (also for a rewrite the node cannot apply)."""
        return self._on_failure

    async def on_publish(self, client: ClientInfo, message: Message) -> PublishDecision:
        guard = self.guard
        decision = await guard.call(lambda: self.plugin.on_publish(client, message))
        if decision is _FAILED:
            return self._on_failure
        if not isinstance(decision, PublishDecision):
            guard.failed(INVALID, detail=f"answered a {type(decision).__name__}, not a PublishDecision")
            return self._on_failure
        guard.succeeded()
        return decision

    async def close(self) -> None:
        await self.guard.close(self.plugin)
