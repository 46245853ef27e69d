"""MQTT 5 enhanced authentication hook (§4.12): the interface the gateway drives for CONNECT/AUTH exchanges.

The gateway owns the packet flow; a mechanism owns the bytes. For each connection attempt (and each
re-authentication) the gateway calls `EnhancedAuth.begin` with the Authentication Method, then feeds every
Authentication Data it receives (CONNECT first, then each AUTH 0x18) to `AuthSession.step` until the result
is `done`. Mechanisms are sans-IO and must never raise on client input: bad input is a failed `AuthResult`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol


@dataclass(slots=True)
class AuthResult:
    done: bool  # True: authentication finished (success or failure)
    success: bool  # meaningful when done
    data: bytes | None  # Authentication Data to send (AUTH 0x18 while not done, CONNACK/AUTH 0x00 when done)
    reason: str = ""  # for logs / reason string on failure; never says whether a user exists
    # The identity the mechanism authenticated (set on success), so ACLs can use it even when CONNECT
    # carried no User Name.
    username: str | None = None


def auth_failed(reason: str) -> AuthResult:
    return AuthResult(True, False, None, reason)


class AuthSession(Protocol):
    """One authentication exchange (one connection attempt or one re-authentication)."""

    def step(self, data: bytes | None) -> AuthResult:
        """First call with CONNECT's Authentication Data, later calls with each AUTH packet's data."""
        ...


class EnhancedAuth(Protocol):
    methods: frozenset[str]

    def begin(self, method: str, client_id: str, username: str | None) -> AuthSession | None:
        """Start an exchange; None when `method` is not one of `methods` (the gateway answers 0x8C)."""
        ...


class EnhancedAuthRegistry:
    """Several mechanisms behind one `EnhancedAuth`, dispatching on the Authentication Method."""

    __slots__ = ("_by_method", "methods")

    def __init__(self, mechanisms: Iterable[EnhancedAuth]) -> None:
        by_method: dict[str, EnhancedAuth] = {}
        for mechanism in mechanisms:
            for method in mechanism.methods:
                if method in by_method:
                    raise ValueError(f"authentication method {method!r} is provided twice")
                by_method[method] = mechanism
        self._by_method = by_method
        self.methods: frozenset[str] = frozenset(by_method)

    def begin(self, method: str, client_id: str, username: str | None) -> AuthSession | None:
        mechanism = self._by_method.get(method)
        if mechanism is None:
            return None
        return mechanism.begin(method, client_id, username)
