"""Dynamic security as the node sees it: `DynsecState` (the configuration in force on this node, swapped whole on
every change), the `dynsec` authentication source and the authorizer its clients get (`ClientInfo.acl`), which reads
the configuration in force at each check, so a change applies to connected clients at once.

Authentication follows Mosquitto's plugin (auth.c): no user name or password, an unknown user, or one without a
password: no opinion (the next source decides); a disabled client, or one bound to another client id: refused; else
the password decides. An unknown user costs the same hash work as a known one, so timing does not tell which exist.
"""

from __future__ import annotations

import asyncio
import hmac
import secrets

from tidewire.extensions.authentication import IGNORE, AuthDecision, AuthRequest, Outcome
from tidewire.extensions.dynsec.grants import Grants
from tidewire.extensions.dynsec.model import Config
from tidewire.extensions.hooks import ClientInfo, SubscribeAccess
from tidewire.extensions.password_file import (
    DEFAULT_ITERATIONS,
    HASH_LEN,
    MAX_PASSWORD,
    SALT_LEN,
    HashKind,
    MosquittoEntry,
    mosquitto_hash,
    parse_mosquitto,
    verify_mosquitto,
)

_BAD = "bad user name or password"


class DynsecState:
    """The configuration in force here and its store version (0: none stored yet)."""

    __slots__ = ("grants", "iterations", "version")

    def __init__(self, iterations: int = DEFAULT_ITERATIONS) -> None:
        self.grants = Grants(Config())
        self.version = 0
        self.iterations = iterations  # PBKDF2 iterations of a new password hash

    def install(self, config: Config, version: int) -> None:
        self.grants = Grants(config)
        self.version = version

    def hash_password(self, password: str) -> str:
        return mosquitto_hash(password, HashKind.PBKDF2_SHA512, self.iterations)


class DynsecAuthorizer:
    """The grants of a client the `dynsec` source accepted: its roles as configured now. A client no longer in the
    configuration (deleted, about to be disconnected) may do nothing."""

    __slots__ = ("state",)
    # A subscription these grants no longer allow is removed (`SubscriptionRegistry.recheck`), also when a stored
    # session comes back: a revoked subscribe grant never delivers again, whatever publishClientReceive says.
    revokes_subscriptions = True

    def __init__(self, state: DynsecState) -> None:
        self.state = state

    def allow_publish(self, client: ClientInfo, topic: str) -> bool:
        grants = self.state.grants
        username = client.username
        return username is not None and grants.known(username) and grants.may_publish(username, client.client_id,
                                                                                        topic)

    def subscribe_access(self, client: ClientInfo, topic_filter: str) -> SubscribeAccess:
        grants = self.state.grants
        username = client.username
        if username is None or not grants.known(username) or not grants.may_subscribe(username, client.client_id,
                                                                                       topic_filter):
            return SubscribeAccess.DENIED
        if grants.receive_may_deny(username, client.client_id):
            return SubscribeAccess.FILTERED  # each delivery is checked against publishClientReceive
        return SubscribeAccess.GRANTED

    def allow_read(self, client: ClientInfo, topic: str) -> bool:
        grants = self.state.grants
        username = client.username
        return username is not None and grants.known(username) and grants.may_receive(username, client.client_id,
                                                                                        topic)


class DynsecAuthenticator:
    """The `dynsec` source of the auth chain."""

    __slots__ = ("_decoy_secret", "authorizer", "inline_iterations", "name", "state")

    def __init__(self, state: DynsecState, inline_iterations: int = 200) -> None:
        self.name = "dynsec"
        self.state = state
        self.authorizer = DynsecAuthorizer(state)
        self.inline_iterations = inline_iterations
        self._decoy_secret = secrets.token_bytes(32)

    async def authenticate(self, request: AuthRequest) -> AuthDecision:
        username, password = request.username, request.password
        if username is None or password is None or len(password) > MAX_PASSWORD:
            return IGNORE
        client = self.state.grants.config.clients.get(username)
        entry: MosquittoEntry | None = None
        if client is not None and client.password is not None:
            try:
                entry = parse_mosquitto(username, client.password)
            except ValueError:
                entry = None  # a damaged hash: the user cannot log in with a password
        known = entry is not None
        if entry is None:  # same work as a real check, which cannot succeed
            salt = hmac.digest(self._decoy_secret, username.encode("utf-8", "surrogateescape"), "sha256")
            entry = MosquittoEntry(username, HashKind.PBKDF2_SHA512, self.state.iterations, salt[:SALT_LEN],
                                   secrets.token_bytes(HASH_LEN))
        if entry.iterations <= self.inline_iterations:
            matched = verify_mosquitto(entry, password)
        else:
            matched = await asyncio.to_thread(verify_mosquitto, entry, password)
        if not known or client is None:
            return IGNORE
        if client.disabled:
            return AuthDecision(Outcome.DENY, reason="client disabled")
        if client.clientid is not None and client.clientid != request.client_id:
            return AuthDecision(Outcome.DENY, reason="client id not allowed for this user")
        if not matched or b"\x00" in password:
            return AuthDecision(Outcome.DENY, reason=_BAD)
        return AuthDecision(Outcome.ALLOW, username=username, acl=self.authorizer, tenant=client.tenant)

    def reload(self) -> None:
        """Nothing to re-read from files: the store is the source (`gateway.ops.dynsec` re-reads it)."""

    async def close(self) -> None:
        pass


def _control_level(levels: list[str]) -> bool:
    return len(levels) > 1 and levels[0] == "$CONTROL" and levels[1] in ("dynamic-security", "+", "#")


class ControlTopicGuard:
    """With dynamic security on and no ACL file (everyone else may do anything): the dynamic-security control topics
    stay for clients with grants of their own (a dynamic-security client's roles decide) and superusers, so no other
    client reads the responses (the user list) or forges one. An authorizer plugin after the others (`Narrowed`)."""

    __slots__ = ()

    def allow_publish(self, client: ClientInfo, topic: str) -> bool:
        return client.acl is not None or not _control_level(topic.split("/", 2))

    def subscribe_access(self, client: ClientInfo, topic_filter: str) -> SubscribeAccess:
        if client.acl is None and _control_level(topic_filter.split("/", 2)):
            return SubscribeAccess.DENIED
        return SubscribeAccess.GRANTED

    def allow_read(self, client: ClientInfo, topic: str) -> bool:
        return self.allow_publish(client, topic)
