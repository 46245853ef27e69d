"""Authentication: who a client is, decided by a chain of sources (EMQX's model), for every protocol.

A request carries what the client *claims* (user name, password or token) and what the transport *proved*
(peer address after PROXY protocol, verified client certificate). Each source answers ALLOW, DENY or IGNORE;
the first definite answer wins and IGNORE passes to the next source. What comes out is a `Identity`: the
user name that a credential proved (never the one a client merely claimed), whether it is a superuser, and
optional per-client grants that replace the ACL file for that client (JWT claims, HTTP hook rules).

MQTT uses this for CONNECT user name/password and the AMQP adapter for SASL PLAIN. RocketMQ's signatures are
checked against `rocketmq_credentials_file` instead (an HMAC needs the secret itself). Sources must never raise
on client input and must never put a password into a log line or a reason.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from tidewire.extensions.hooks import Authorizer

log = logging.getLogger("tidewire.auth")


class Outcome(Enum):
    ALLOW = "allow"
    DENY = "deny"
    IGNORE = "ignore"  # this source has no opinion: the next one decides


class Failure(Enum):
    """Why a connection was refused; each protocol maps it to its own code."""

    BAD_CREDENTIALS = "bad credentials"  # MQTT 3.1.1 code 4, 5.0 0x86
    NOT_AUTHORIZED = "not authorized"  # no credentials where required, or a source refused: 5 / 0x87
    UNAVAILABLE = "auth service unavailable"  # 3 / 0x88 when a source is down and configured to say so


@dataclass(frozen=True, slots=True)
class AuthRequest:
    client_id: str
    username: str | None  # as claimed by the client
    password: bytes | None  # password, token or secret key; never logged
    peer: str = ""  # "host:port" of the real client (after PROXY protocol)
    protocol: str = "mqtt"  # "mqtt", "amqp", "rocketmq"
    listener: str = "mqtt"  # "mqtt", "mqtts", "ws", "wss", ...
    cert_subject: str | None = None  # RFC 4514 subject of a verified client certificate
    cert_common_name: str | None = None


@dataclass(frozen=True, slots=True)
class AuthDecision:
    """One source's answer."""

    outcome: Outcome
    username: str | None = None  # the identity proved (ALLOW); None keeps the claimed user name
    superuser: bool = False
    acl: Authorizer | None = None  # grants exactly these (replaces the ACL file for this client)
    expires_at: float | None = None  # epoch seconds after which the connection must be closed (token exp)
    failure: Failure = Failure.BAD_CREDENTIALS  # for DENY
    reason: str = ""  # for the log line; says nothing about whether a user exists
    tenant: str | None = None  # the tenant the client belongs to (its mount point); None: the default tenant


IGNORE = AuthDecision(Outcome.IGNORE)


class Authenticator(Protocol):
    """One source of the chain."""

    name: str  # "file", "jwt", "http", ... (logs and metrics)

    async def authenticate(self, request: AuthRequest) -> AuthDecision: ...

    def reload(self) -> None:
        """Re-read files (SIGHUP). On error keep the previous state and raise ValueError saying why."""
        ...

    async def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Identity:
    """The outcome of the whole chain for an accepted client."""

    username: str | None  # proved identity; None only for an anonymous client
    superuser: bool = False
    acl: Authorizer | None = None
    expires_at: float | None = None
    source: str = ""  # which source accepted, "anonymous" or "certificate"
    tenant: str | None = None  # the tenant the client belongs to (its mount point); None: the default tenant


@dataclass(frozen=True, slots=True)
class Refused:
    failure: Failure
    source: str
    reason: str


class AuthChain:
    """Sources in the configured order; the first ALLOW or DENY wins.

    When every source ignores the request: a client that presented no credentials is anonymous (accepted only
    when `allow_anonymous`); one that presented credentials nobody accepted is refused as bad credentials,
    since accepting them would make a claimed user name look proved.

    `results` counts the answers by (deciding source, "success" | "failure") for the metrics; a chain without
    sources counts nothing (its answer depends on `allow_anonymous` alone and callers keep it).
    """

    __slots__ = ("allow_anonymous", "results", "sources")

    def __init__(self, sources: Sequence[Authenticator], allow_anonymous: bool) -> None:
        self.sources = tuple(sources)
        self.allow_anonymous = allow_anonymous
        self.results: dict[tuple[str, str], int] = {}

    async def authenticate(self, request: AuthRequest) -> Identity | Refused:
        result = await self._decide(request)
        if self.sources:
            self.record(result)
        return result

    def record(self, result: Identity | Refused) -> None:
        """Count an answer (also one decided outside the chain: a certificate's name, MQTT 5 enhanced auth)."""
        key = (result.source, "success" if isinstance(result, Identity) else "failure")
        self.results[key] = self.results.get(key, 0) + 1

    async def _decide(self, request: AuthRequest) -> Identity | Refused:
        for source in self.sources:
            try:
                decision = await source.authenticate(request)
            except Exception:  # a bug in a source must not let a client in, nor take the node down
                log.exception("auth.source_failed", extra={"source": source.name})
                return Refused(Failure.UNAVAILABLE, source.name, "source failed")
            if decision.outcome is Outcome.ALLOW:
                username = decision.username if decision.username is not None else request.username
                return Identity(username, decision.superuser, decision.acl, decision.expires_at, source.name,
                                decision.tenant)
            if decision.outcome is Outcome.DENY:
                return Refused(decision.failure, source.name, decision.reason or "denied")
        if request.username is None and request.password is None:
            if self.allow_anonymous:
                return Identity(None, source="anonymous")
            return Refused(Failure.NOT_AUTHORIZED, "chain", "no credentials and anonymous access is off")
        if not self.sources and self.allow_anonymous:
            # Nothing can verify credentials: the client is anonymous whatever user name it claims.
            return Identity(None, source="anonymous")
        return Refused(Failure.BAD_CREDENTIALS, "chain", "no source accepted the credentials")

    def reload(self) -> list[str]:
        """Reload every source; returns the errors (each source keeps its previous state on error)."""
        errors: list[str] = []
        for source in self.sources:
            try:
                source.reload()
            except (OSError, ValueError) as exc:
                errors.append(f"{source.name}: {exc}")
        return errors

    async def close(self) -> None:
        for source in self.sources:
            await source.close()
