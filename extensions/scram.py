"""SCRAM-SHA-256 server (RFC 5802, RFC 7677) as a sans-IO MQTT 5 enhanced authentication mechanism.

Exchange, driven by the gateway through `extensions.enhanced_auth`:

1. CONNECT Authentication Data = client-first-message ``n,,n=<user>,r=<client nonce>``;
   `step` answers server-first-message ``r=<client nonce><server nonce>,s=<salt>,i=<iterations>``.
2. AUTH 0x18 data = client-final-message ``c=biws,r=<nonce>,p=<ClientProof>``; `step` verifies the proof
   against StoredKey and answers server-final-message ``v=<ServerSignature>`` with success.

Channel binding is not offered: gs2 flag ``n`` and ``y`` are accepted (``y`` means the client could bind
but thinks we cannot, which is true), ``p=`` is refused. An unknown user gets a server-first made from a
salt derived from the username with a per-instance secret (stable across attempts, so a repeated probe sees
the same salt) and the usual iteration count; the exchange then fails at the proof like a wrong password,
with the same reason and the same amount of work. Bad input never raises: it ends the exchange as failed.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from collections.abc import Callable

from tidewire.extensions.enhanced_auth import AuthResult, auth_failed
from tidewire.extensions.scram_credentials import KEY_SIZE, MECHANISM, CredentialEntry, Credentials

DEFAULT_MAX_MESSAGE = 4096  # bytes of Authentication Data accepted per step
_FAILED_PROOF = "authentication failed"  # one reason for unknown user and wrong password alike

_START, _SENT_FIRST, _DONE = 0, 1, 2


class _Malformed(ValueError):
    pass


def default_nonce() -> str:
    # 18 random bytes -> 24 base64 characters: printable and comma-free, as the nonce grammar requires
    return base64.b64encode(secrets.token_bytes(18)).decode()


class ScramSha256:
    """The SCRAM-SHA-256 `EnhancedAuth` mechanism over a credentials file."""

    __slots__ = ("_credentials", "_fake_iterations", "_fake_secret", "_nonce_factory", "max_message",
                 "methods")

    def __init__(self, credentials: Credentials, *, nonce_factory: Callable[[], str] = default_nonce,
                 max_message: int = DEFAULT_MAX_MESSAGE) -> None:
        self.methods: frozenset[str] = frozenset({MECHANISM})
        self._nonce_factory = nonce_factory  # injectable so tests can replay RFC 7677's exchange
        self.max_message = max_message
        self._fake_secret = secrets.token_bytes(32)
        self._credentials = credentials
        self._fake_iterations = credentials.typical_iterations()

    def set_credentials(self, credentials: Credentials) -> None:
        """Swap in a reloaded credentials file; exchanges already started keep the entry they looked up."""
        self._credentials = credentials
        self._fake_iterations = credentials.typical_iterations()

    def begin(self, method: str, client_id: str, username: str | None) -> ScramSession | None:
        if method not in self.methods:
            return None
        return ScramSession(self, username)

    def _entry_for(self, username: str) -> tuple[CredentialEntry, bool]:
        """The user's entry, or a convincing stand-in (and False) for a user that does not exist."""
        entry = self._credentials.lookup(username)
        if entry is not None:
            return entry, True
        salt = hmac.digest(self._fake_secret, username.encode(), "sha256")[:16]
        fake = CredentialEntry(username, self._fake_iterations, salt, secrets.token_bytes(KEY_SIZE),
                               secrets.token_bytes(KEY_SIZE))
        return fake, False


class ScramSession:
    """One SCRAM exchange: client-first -> server-first, client-final -> server-final."""

    __slots__ = ("_client_first_bare", "_connect_username", "_entry", "_gs2_header", "_known", "_mechanism",
                 "_nonce", "_server_first", "_state", "_username")

    def __init__(self, mechanism: ScramSha256, connect_username: str | None) -> None:
        self._mechanism = mechanism
        self._connect_username = connect_username
        self._state = _START
        self._gs2_header = b""
        self._client_first_bare = ""
        self._server_first = ""
        self._nonce = ""
        self._username = ""
        self._entry: CredentialEntry | None = None
        self._known = False

    def step(self, data: bytes | None) -> AuthResult:
        state = self._state
        self._state = _DONE  # any failure below ends the exchange; success paths set the next state
        if state == _DONE:
            return auth_failed("SCRAM exchange already finished")
        if not data:
            return auth_failed("missing SCRAM authentication data")
        if len(data) > self._mechanism.max_message:
            return auth_failed("SCRAM message too long")
        try:
            text = data.decode("utf-8")
            if state == _START:
                return self._client_first(text)
            return self._client_final(text)
        except _Malformed as exc:
            return auth_failed(f"malformed SCRAM message: {exc}")
        except (UnicodeDecodeError, binascii.Error):
            return auth_failed("malformed SCRAM message: bad encoding")

    def _client_first(self, text: str) -> AuthResult:
        flag, sep, rest = text.partition(",")
        if flag.startswith("p="):
            return auth_failed("SCRAM channel binding is not supported (use SCRAM-SHA-256 with gs2 flag 'n')")
        if flag not in ("n", "y") or not sep:
            raise _Malformed("bad gs2 header")
        authzid, sep, bare = rest.partition(",")
        if not sep:
            raise _Malformed("bad gs2 header")
        fields = bare.split(",")
        if fields[0].startswith("m="):
            return auth_failed("SCRAM mandatory extension not supported")
        if len(fields) < 2 or not fields[0].startswith("n=") or not fields[1].startswith("r="):
            raise _Malformed("expected n=<username>,r=<nonce>")
        username = _decode_saslname(fields[0][2:])
        if authzid and (not authzid.startswith("a=") or _decode_saslname(authzid[2:]) != username):
            return auth_failed("SCRAM authorization identity must equal the username")
        client_nonce = fields[1][2:]
        _check_nonce(client_nonce)
        _check_extensions(fields[2:])
        if self._connect_username is not None and self._connect_username != username:
            return auth_failed("SCRAM username differs from the CONNECT User Name")

        entry, known = self._mechanism._entry_for(username)
        nonce = client_nonce + self._mechanism._nonce_factory()
        server_first = f"r={nonce},s={base64.b64encode(entry.salt).decode()},i={entry.iterations}"
        self._gs2_header = text[: len(text) - len(bare)].encode()
        self._client_first_bare = bare
        self._server_first = server_first
        self._nonce = nonce
        self._username = username
        self._entry = entry
        self._known = known
        self._state = _SENT_FIRST
        return AuthResult(False, False, server_first.encode())

    def _client_final(self, text: str) -> AuthResult:
        cut = text.rfind(",p=")
        if cut < 0:
            raise _Malformed("missing proof")
        without_proof = text[:cut]
        proof = base64.b64decode(text[cut + 3:], validate=True)
        fields = without_proof.split(",")
        if len(fields) < 2 or not fields[0].startswith("c=") or not fields[1].startswith("r="):
            raise _Malformed("expected c=<channel binding>,r=<nonce>,p=<proof>")
        if base64.b64decode(fields[0][2:], validate=True) != self._gs2_header:
            return auth_failed("SCRAM channel binding data does not match the gs2 header")
        if not hmac.compare_digest(fields[1][2:].encode(), self._nonce.encode()):
            return auth_failed("SCRAM nonce mismatch")
        _check_extensions(fields[2:])
        if len(proof) != KEY_SIZE:
            raise _Malformed("proof has the wrong length")

        entry = self._entry
        assert entry is not None  # set with _SENT_FIRST
        auth_message = f"{self._client_first_bare},{self._server_first},{without_proof}".encode()
        client_signature = hmac.digest(entry.stored_key, auth_message, "sha256")
        client_key = (int.from_bytes(proof) ^ int.from_bytes(client_signature)).to_bytes(KEY_SIZE)
        # Same work for unknown users (their stored key is random), so only the final flag differs.
        matches = hmac.compare_digest(hashlib.sha256(client_key).digest(), entry.stored_key)
        if not (matches and self._known):
            return auth_failed(_FAILED_PROOF)
        server_signature = hmac.digest(entry.server_key, auth_message, "sha256")
        return AuthResult(True, True, b"v=" + base64.b64encode(server_signature), "", self._username)


def _decode_saslname(value: str) -> str:
    """RFC 5802 saslname: ``=2C`` is ``,`` and ``=3D`` is ``=``; any other ``=`` is an error."""
    if not value or "\x00" in value:
        raise _Malformed("empty or invalid username")
    if "=" not in value:
        return value
    pieces = value.split("=")
    out = [pieces[0]]
    for piece in pieces[1:]:
        if piece.startswith("2C"):
            out.append("," + piece[2:])
        elif piece.startswith("3D"):
            out.append("=" + piece[2:])
        else:
            raise _Malformed("bad '=' escape in username")
    return "".join(out)


def _check_nonce(nonce: str) -> None:
    # printable = %x21-2B / %x2D-7E; the comma is already excluded by the field split
    if not nonce or not all("\x21" <= ch <= "\x7e" for ch in nonce):
        raise _Malformed("empty or non-printable nonce")


def _check_extensions(fields: list[str]) -> None:
    for field in fields:
        if len(field) < 2 or field[1] != "=" or not field[0].isascii() or not field[0].isalpha():
            raise _Malformed(f"bad attribute {field[:16]!r}")
