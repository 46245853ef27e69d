"""Who sends a RocketMQ request: the MQv2-HMAC-SHA1 `authorization` header checked against the access keys of
`rocketmq_credentials_file`, and the `ClientInfo` the node's ACL sees for that access key.

The header is `MQv2-HMAC-SHA1 Credential=<ak>[/...], SignedHeaders=x-mq-date-time, Signature=<hex>` where the
signature is hex(HMAC-SHA1(secret key, value of the `x-mq-date-time` header)), as the RocketMQ 5 clients sign
every call. An HMAC needs the secret itself, so the file holds `access_key:secret_key` lines (keep it 0600).

Without a credentials file, every request is anonymous when the node allows anonymous clients, else refused.
With one, every request must present a known access key and its signature (an anonymous one is refused).
The date is not checked for freshness: the clients format their local time with a `Z` suffix, so the value
is only as good as their clock and time zone. No secret, signature or header value is ever logged or returned.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable
from pathlib import Path

from tidewire.extensions.hooks import ClientInfo

ALGORITHM = "MQv2-HMAC-SHA1"
DATE_HEADER = "x-mq-date-time"
CLIENT_ID_HEADER = "x-mq-client-id"
MAX_HEADER = 1024  # characters of an authorization header we look at
MAX_CLIENT_ID = 256
_DUMMY_KEY = b"\x00" * 20  # an unknown access key costs the same HMAC as a known one


def load_credentials(path: Path) -> dict[str, str]:
    """`access_key:secret_key` lines (blank lines and `#` comments skipped). Raises ValueError naming the line
    (never its content) or OSError."""
    secrets: dict[str, str] = {}
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        access_key, sep, secret = line.partition(":")
        if not sep or not access_key or not secret:
            raise ValueError(f"{path}:{number}: expected access_key:secret_key")
        secrets[access_key] = secret
    return secrets


def parse_authorization(value: str) -> tuple[str, str] | None:
    """(access key, signature) of an MQv2-HMAC-SHA1 header that signs x-mq-date-time; None otherwise."""
    if len(value) > MAX_HEADER or not value.startswith(ALGORITHM + " "):
        return None
    fields: dict[str, str] = {}
    for part in value[len(ALGORITHM) + 1:].split(","):
        name, sep, content = part.strip().partition("=")
        if sep:
            fields[name.strip()] = content.strip()
    credential, signed, signature = fields.get("Credential"), fields.get("SignedHeaders"), fields.get("Signature")
    if credential is None or signed is None or signature is None:
        return None
    if DATE_HEADER not in (h.strip().lower() for h in signed.split(";")):
        return None
    return credential.split("/", 1)[0], signature.lower()


class Authenticator:
    """Checks the signature of each call (cheap: one HMAC-SHA1) and names the caller for the ACL."""

    __slots__ = ("allow_anonymous", "secrets")

    def __init__(self, secrets: dict[str, str] | None, allow_anonymous: bool) -> None:
        self.secrets = secrets  # None: no credentials file configured
        self.allow_anonymous = allow_anonymous

    def check(self, metadata: Iterable[tuple[str, str | bytes]], peer: str = "") -> ClientInfo | None:
        """The caller of a request with these gRPC headers; None: refuse it (UNAUTHORIZED)."""
        headers: dict[str, str] = {}
        for name, value in metadata:
            if isinstance(value, str):
                headers[name.lower()] = value
        client_id = headers.get(CLIENT_ID_HEADER, "")[:MAX_CLIENT_ID]
        if self.secrets is None:
            return ClientInfo(client_id, None, peer) if self.allow_anonymous else None
        parsed = parse_authorization(headers.get("authorization", ""))
        if parsed is None:
            return None
        access_key, signature = parsed
        secret = self.secrets.get(access_key)
        key = secret.encode() if secret is not None else _DUMMY_KEY
        expected = hmac.new(key, headers.get(DATE_HEADER, "").encode(), hashlib.sha1).hexdigest()
        if not hmac.compare_digest(expected, signature) or secret is None:
            return None
        return ClientInfo(client_id, access_key, peer)
