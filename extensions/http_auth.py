"""HTTP authentication hook: ask an external service (EMQX-style) whether a client may connect, and with what.

For each request we POST JSON ``{"clientid", "username", "password", "peerhost", "peerport", "protocol",
"listener", "cert_subject", "cert_common_name"}`` through one pooled `httpx.AsyncClient`. The password is sent
as UTF-8 text; when it is not valid UTF-8 it is base64-encoded and ``"password_encoding": "base64"`` is added.

Answers:

* HTTP 204: allow. HTTP 401: deny (bad credentials). HTTP 403: deny (not authorized).
* HTTP 200 with a JSON object: ``result`` is ``"allow"``, ``"deny"`` (not authorized) or ``"ignore"`` (the next
  source decides); for ``allow`` the optional ``is_superuser`` (bool), ``username`` (the identity to use
  instead of the claimed one), ``expire_at`` (epoch seconds; the connection is closed then; an allow that is
  already expired is a deny), ``tenant`` (the client's tenant: docs/tenants.md) and ``acl`` are honoured.
* ``acl`` replaces the ACL file for this client and grants exactly what it lists, everything else denied.
  Two forms: EMQX 5's rule list ``[{"permission": "allow"|"deny", "action": "publish"|"subscribe"|"all",
  "topic": "t/#"}]`` (``"topics": [...]`` also accepted) and ``{"pub": [...], "sub": [...], "all": [...]}``
  (allow lists). ``${clientid}``/``${username}`` (and ``%c``/``%u``) are substituted per client.
  **Deny wins, and a deny is total:** rule order does not matter (unlike EMQX's first match), any matching
  ``deny`` refuses access whatever rule allows it, and a deny refuses every action on its topics (a
  ``deny publish`` rule also refuses subscribe/read). ``qos``/``retain`` conditions are not supported: on a
  deny rule they are dropped (the deny becomes broader), on an allow rule the answer is malformed (it would
  otherwise grant more than the service meant).
* Anything else (connection refused, timeout, 3xx/4xx other than 401/403, 5xx, bad JSON, unknown result,
  bad acl, an answer over `max_answer_bytes`) is a service error, answered by `on_error`: "deny" refuses
  with Failure.UNAVAILABLE, "ignore" passes to the next source. Failures are logged, at most one line per
  `error_log_interval` seconds (with the number suppressed), so a down service under a connect storm does
  not flood the log.

Answers (not errors) are cached for `cache_ttl` seconds in a bounded LRU keyed by an HMAC-SHA-256 (random
per-process key) of (client id, user name, password, peer host, protocol, listener, certificate subject),
so neither the password nor an offline-guessable hash of it is kept. The peer port is not part of the key:
a reconnecting client gets a new port. Concurrent identical requests share one HTTP call (single-flight).
Environment proxies and ``.netrc`` are not used (``trust_env=False``): they would silently reroute requests
carrying passwords or add credentials. The password is never logged nor put into a reason.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import logging
import math
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, Literal

from tidewire.extensions.acl import AclFile
from tidewire.extensions.authentication import AuthDecision, AuthRequest, Failure, Outcome
from tidewire.gateway.config import Settings

log = logging.getLogger("tidewire.auth.http")

OnError = Literal["deny", "ignore"]
_JSON_HEADERS = {"content-type": "application/json", "accept": "application/json"}
_RULE_KEYS = frozenset({"permission", "action", "topic", "topics", "qos", "retain"})
_ACTIONS = {"publish": "write", "subscribe": "read", "all": "readwrite"}
_FORM_KEYS = {"pub": "write", "sub": "read", "all": "readwrite"}


class _ServiceError(Exception):
    """The service could not give a usable answer; `kind` is safe to log (no client data, no URL)."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


class _FailureLog:
    """At most one log line per `interval` seconds; the next line says how many were suppressed."""

    __slots__ = ("_clock", "_interval", "_last", "_suppressed")

    def __init__(self, interval: float, clock: Callable[[], float]) -> None:
        self._interval = interval
        self._clock = clock
        self._last: float | None = None
        self._suppressed = 0

    def report(self, kind: str, client_id: str, service: str, on_error: str) -> None:
        now = self._clock()
        if self._last is not None and now - self._last < self._interval:
            self._suppressed += 1
            return
        log.warning("auth.http_unavailable", extra={"source": "http", "service": service, "error": kind,
                                                    "client_id": client_id, "on_error": on_error,
                                                    "suppressed": self._suppressed})
        self._last = now
        self._suppressed = 0


class HttpAuthenticator:
    """`Authenticator` asking an HTTP service; see the module docstring for the wire format and semantics."""

    name = "http"

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 5.0,
        cache_ttl: float = 60.0,
        on_error: OnError = "deny",
        headers: Mapping[str, str] | None = None,
        max_connections: int = 32,
        cache_size: int = 100_000,
        max_answer_bytes: int = 65_536,
        error_log_interval: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        import httpx  # here: a node without an HTTP auth service does not pay for importing it at start

        parsed = httpx.URL(url)
        if parsed.scheme not in ("http", "https") or not parsed.host:
            raise ValueError("http_auth_url must be an http:// or https:// URL with a host")
        if not timeout > 0 or cache_ttl < 0 or max_connections < 1 or cache_size < 1 or max_answer_bytes < 1:
            raise ValueError("timeout, max_connections, cache_size, max_answer_bytes must be > 0; cache_ttl >= 0")
        if on_error not in ("deny", "ignore"):
            raise ValueError("on_error must be 'deny' or 'ignore'")
        self._url = url
        # For log lines: no user info, no query string (either may hold a secret).
        self._service = f"{parsed.scheme}://{parsed.host}{':' if parsed.port else ''}{parsed.port or ''}{parsed.path}"
        self._timeout = timeout
        self._cache_ttl = cache_ttl
        self._on_error: OnError = on_error
        self._cache_size = cache_size
        self._max_answer = max_answer_bytes
        self._clock = clock
        self._client = httpx.AsyncClient(
            headers=dict(headers or {}),
            timeout=httpx.Timeout(timeout),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
            follow_redirects=False,
            trust_env=False,
        )
        self._key = secrets.token_bytes(32)
        self._cache: OrderedDict[bytes, tuple[float, AuthDecision]] = OrderedDict()
        self._inflight: dict[bytes, asyncio.Task[AuthDecision]] = {}
        self._failures = _FailureLog(error_log_interval, clock)
        self._closed = False

    @classmethod
    def from_settings(cls, settings: Settings) -> HttpAuthenticator | None:
        """The configured hook, or None when `http_auth_url` is not set."""
        if not settings.http_auth_url:
            return None
        return cls(
            settings.http_auth_url,
            timeout=settings.http_auth_timeout,
            cache_ttl=settings.http_auth_cache_ttl,
            on_error=settings.http_auth_on_error,
            headers=settings.http_auth_headers,
            max_connections=settings.http_auth_max_connections,
        )

    async def authenticate(self, request: AuthRequest) -> AuthDecision:
        if self._closed:
            return self._error_decision("closed")
        key = self._cache_key(request)
        cached = self._cache_get(key)
        if cached is not None:
            return cached
        task = self._inflight.get(key)
        if task is None:
            task = asyncio.create_task(self._ask(key, request), name="tidewire-http-auth")
            self._inflight[key] = task
            task.add_done_callback(lambda _t: self._inflight.pop(key, None))
        try:
            # Shielded: a client that gives up (disconnects) must not cancel the call others wait on.
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if task.cancelled() and not (current is not None and current.cancelling()):
                return self._error_decision("closed")  # close() cancelled the call, not our caller
            raise

    def reload(self) -> None:
        """Nothing to re-read: the service is asked on every (uncached) request."""

    async def close(self) -> None:
        self._closed = True
        tasks = list(self._inflight.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        self._cache.clear()
        await self._client.aclose()

    # -- the call ---------------------------------------------------------------------------------------------

    async def _ask(self, key: bytes, request: AuthRequest) -> AuthDecision:
        import httpx

        try:
            async with asyncio.timeout(self._timeout):  # one deadline for pool wait, connect, send and read
                status, body = await self._post(_request_body(request))
            decision = _decide(status, body, time.time())
        except _ServiceError as exc:
            return self._failed(exc.kind, request)
        except (TimeoutError, httpx.TimeoutException):
            return self._failed("timeout", request)
        except httpx.ConnectError:
            return self._failed("connect failed", request)
        except (httpx.HTTPError, OSError) as exc:
            return self._failed(type(exc).__name__, request)
        if self._cache_ttl > 0 and not self._closed:
            self._cache_put(key, decision)
        return decision

    async def _post(self, body: bytes) -> tuple[int, bytes]:
        async with self._client.stream("POST", self._url, content=body, headers=_JSON_HEADERS) as response:
            status = response.status_code
            if status != 200:
                return status, b""  # no other status carries a body we use
            data = bytearray()
            async for chunk in response.aiter_bytes():
                data += chunk
                if len(data) > self._max_answer:
                    raise _ServiceError("answer too large")
            return status, bytes(data)

    def _failed(self, kind: str, request: AuthRequest) -> AuthDecision:
        self._failures.report(kind, request.client_id, self._service, self._on_error)
        return self._error_decision(kind)

    def _error_decision(self, kind: str) -> AuthDecision:
        if self._on_error == "ignore":
            return AuthDecision(Outcome.IGNORE, reason=f"auth service unavailable ({kind})")
        return AuthDecision(Outcome.DENY, failure=Failure.UNAVAILABLE, reason=f"auth service unavailable ({kind})")

    # -- cache ------------------------------------------------------------------------------------------------

    def _cache_key(self, request: AuthRequest) -> bytes:
        mac = hmac.new(self._key, digestmod=hashlib.sha256)
        host, _ = _split_peer(request.peer)
        for field in (request.client_id, request.username, request.password, host, request.protocol,
                      request.listener, request.cert_subject):
            if field is None:
                mac.update(b"\x00")
                continue
            raw = field.encode("utf-8", "surrogatepass") if isinstance(field, str) else field
            mac.update(b"\x01" + len(raw).to_bytes(4, "big") + raw)  # length-prefixed: fields cannot run together
        return mac.digest()

    def _cache_get(self, key: bytes) -> AuthDecision | None:
        entry = self._cache.get(key)
        if entry is None:
            return None
        until, decision = entry
        if until <= self._clock() or (decision.expires_at is not None and decision.expires_at <= time.time()):
            del self._cache[key]
            return None
        self._cache.move_to_end(key)
        return decision

    def _cache_put(self, key: bytes, decision: AuthDecision) -> None:
        self._cache[key] = (self._clock() + self._cache_ttl, decision)
        self._cache.move_to_end(key)
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)


# -- wire format (pure) -----------------------------------------------------------------------------------------


def _split_peer(peer: str) -> tuple[str, int | None]:
    """"host:port", "[v6]:port" or "v6:port" (as asyncio's peername is formatted) -> (host, port)."""
    if peer.startswith("["):
        host, _, rest = peer[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif ":" in peer:
        host, _, port = peer.rpartition(":")
    else:
        return peer, None
    return host, int(port) if port.isdigit() and len(port) <= 5 else None


def _request_body(request: AuthRequest) -> bytes:
    host, port = _split_peer(request.peer)
    body: dict[str, Any] = {
        "clientid": request.client_id, "username": request.username, "password": None,
        "peerhost": host, "peerport": port, "protocol": request.protocol, "listener": request.listener,
        "cert_subject": request.cert_subject, "cert_common_name": request.cert_common_name,
    }
    if request.password is not None:
        try:
            body["password"] = request.password.decode("utf-8")
        except UnicodeDecodeError:
            body["password"] = base64.b64encode(request.password).decode("ascii")
            body["password_encoding"] = "base64"
    # Client ids and user names may hold lone surrogates or other oddities; json escapes them all.
    return json.dumps(body, ensure_ascii=True).encode("ascii")


def _decide(status: int, body: bytes, now: float) -> AuthDecision:
    """One HTTP answer -> decision; `_ServiceError` when it is not a valid answer."""
    if status == 204:
        return AuthDecision(Outcome.ALLOW)
    if status == 401:
        return AuthDecision(Outcome.DENY, failure=Failure.BAD_CREDENTIALS, reason="http: bad credentials")
    if status == 403:
        return AuthDecision(Outcome.DENY, failure=Failure.NOT_AUTHORIZED, reason="http: not authorized")
    if status != 200:
        raise _ServiceError(f"status {status}")
    try:
        answer = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise _ServiceError("malformed answer: not JSON") from None
    if not isinstance(answer, dict):
        raise _ServiceError("malformed answer: not an object")
    result = answer.get("result")
    if result == "ignore":
        return AuthDecision(Outcome.IGNORE)
    if result == "deny":
        return AuthDecision(Outcome.DENY, failure=Failure.NOT_AUTHORIZED, reason="http: denied")
    if result != "allow":
        raise _ServiceError("malformed answer: unknown result")
    superuser = answer.get("is_superuser", False)
    if not isinstance(superuser, bool):
        raise _ServiceError("malformed answer: is_superuser")
    username = answer.get("username")
    if username is not None and (not isinstance(username, str) or not username):
        raise _ServiceError("malformed answer: username")
    expires_at = answer.get("expire_at")
    if expires_at is not None:
        if isinstance(expires_at, bool) or not isinstance(expires_at, int | float) or not math.isfinite(expires_at):
            raise _ServiceError("malformed answer: expire_at")
        expires_at = float(expires_at)
        if expires_at <= now:
            return AuthDecision(Outcome.DENY, failure=Failure.BAD_CREDENTIALS, reason="http: authorization expired")
    acl = None
    if "acl" in answer and answer["acl"] is not None:
        try:
            acl = AclFile.from_grants(_grants(answer["acl"]))
        except ValueError as exc:
            raise _ServiceError(f"malformed answer: acl: {exc}") from None
    tenant = answer.get("tenant")
    if tenant is not None and (not isinstance(tenant, str) or not tenant):
        raise _ServiceError("malformed answer: tenant")  # the node checks the name itself (a topic level)
    return AuthDecision(Outcome.ALLOW, username=username, superuser=superuser, acl=acl, expires_at=expires_at,
                        tenant=tenant)


def _grants(acl: object) -> list[tuple[str, str]]:
    """EMQX acl (rule list or pub/sub/all object) -> `AclFile.from_grants` pairs; ValueError when malformed."""
    grants: list[tuple[str, str]] = []
    if isinstance(acl, dict):
        for form, topics in acl.items():
            word = _FORM_KEYS.get(form)
            if word is None:
                raise ValueError(f"unknown key {form!r} (pub|sub|all)")
            grants += [(word, _topic(t)) for t in _topic_list(topics)]
        return grants
    if not isinstance(acl, list):
        raise ValueError("neither a rule list nor a pub/sub/all object")
    for number, rule in enumerate(acl, start=1):
        if not isinstance(rule, dict) or not rule.keys() <= _RULE_KEYS:
            raise ValueError(f"rule {number}: not an object of {sorted(_RULE_KEYS)}")
        permission, action = rule.get("permission"), rule.get("action")
        if permission not in ("allow", "deny") or action not in _ACTIONS:
            raise ValueError(f"rule {number}: permission allow|deny and action publish|subscribe|all required")
        if permission == "allow" and ("qos" in rule or "retain" in rule):
            raise ValueError(f"rule {number}: qos/retain conditions are not supported on allow rules")
        if ("topic" in rule) == ("topics" in rule):
            raise ValueError(f"rule {number}: exactly one of topic or topics required")
        topics = [rule["topic"]] if "topic" in rule else _topic_list(rule["topics"])
        word = "deny" if permission == "deny" else _ACTIONS[action]
        grants += [(word, _topic(t)) for t in topics]
    return grants


def _topic_list(topics: object) -> list[object]:
    if not isinstance(topics, list):
        raise ValueError("topics must be a list")
    return topics


def _topic(topic: object) -> str:
    if not isinstance(topic, str):
        raise ValueError("topic must be a string")
    if topic.startswith("eq "):
        raise ValueError("'eq' topics are not supported")
    return topic.replace("${clientid}", "%c").replace("${username}", "%u")
