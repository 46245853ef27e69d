"""Authentication and authorization as configured: the chain of sources (password file, JWT, HTTP hook),
MQTT 5 enhanced authentication (SCRAM-SHA-256 from the same password file), the ACL file; and their reload
on SIGHUP, each keeping its previous state when its new files are bad."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tidewire.extensions.acl import AclFile
from tidewire.extensions.authentication import AuthChain, Authenticator
from tidewire.extensions.hooks import AllowAll, Authorizer
from tidewire.extensions.http_auth import HttpAuthenticator
from tidewire.extensions.password_file import PasswordFileAuthenticator
from tidewire.extensions.scram import ScramSha256
from tidewire.gateway.config import Settings

if TYPE_CHECKING:
    from tidewire.gateway.node import Node


@dataclass(slots=True)
class Security:
    chain: AuthChain
    authorizer: Authorizer  # the ACL file, or allow-all
    enhanced: ScramSha256 | None
    passwords: PasswordFileAuthenticator | None

    @classmethod
    def build(cls, settings: Settings) -> Security:
        """ValueError (naming the file and line) when a configured file cannot be used: refuse to start
        rather than run with less protection than the operator asked for."""
        passwords = None
        if settings.password_file is not None or settings.auth_file is not None:
            passwords = PasswordFileAuthenticator([settings.password_file, settings.auth_file],
                                                  settings.password_hash_threads,
                                                  inline_iterations=settings.password_inline_iterations)
        jwt: Authenticator | None = None
        if settings.jwt_configured:  # PyJWT and cryptography (tidewire[jwt]) are imported only then
            from tidewire.extensions.jwt_auth import JwtAuthenticator

            jwt = JwtAuthenticator.from_settings(settings)
        available: dict[str, Authenticator | None] = {
            "file": passwords, "jwt": jwt, "http": HttpAuthenticator.from_settings(settings)}
        sources = [source for name in settings.auth_chain if (source := available.get(name)) is not None]
        missing = [name for name, source in available.items() if source is not None and name not in settings.auth_chain]
        if missing:
            raise ValueError(f"configured but not in auth_chain: {', '.join(missing)}")
        allow_anonymous = settings.allow_anonymous
        if allow_anonymous is None:  # Mosquitto 2: anonymous only while nothing can authenticate anyone
            allow_anonymous = not sources and not (settings.use_identity_as_username
                                                   or settings.use_subject_as_username)
        enhanced = None
        if passwords is not None and len(passwords.scram_credentials):
            enhanced = ScramSha256(passwords.scram_credentials)
        authorizer: Authorizer = AclFile.load(settings.acl_file) if settings.acl_file else AllowAll()
        return cls(AuthChain(sources, allow_anonymous), authorizer, enhanced, passwords)

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
