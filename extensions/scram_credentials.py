"""SCRAM-SHA-256 credentials file: derive the stored keys from a password, write and load the file.

File format, one user per line (blank lines and lines starting with ``#`` are skipped)::

    username:SCRAM-SHA-256:<iterations>:<salt b64>:<StoredKey b64>:<ServerKey b64>

The username is everything before the last five ``:`` fields, so it may itself contain ``:``. The server
never sees or stores a password: only StoredKey = H(ClientKey) and ServerKey (RFC 5802 §3), which verify a
client proof but cannot produce one. Passwords are SASLprep'd (RFC 4013) before hashing, as RFC 5802
requires, so clients that normalise the same way agree on non-ASCII passwords.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
import stringprep
import unicodedata
from dataclasses import dataclass
from pathlib import Path

MECHANISM = "SCRAM-SHA-256"
DEFAULT_ITERATIONS = 4096  # RFC 7677 minimum
KEY_SIZE = 32  # SHA-256 digest size


def saslprep(text: str) -> str:
    """RFC 4013 SASLprep for a stored string (unassigned code points refused). ValueError if prohibited."""
    if text.isascii():
        # Fast path: ASCII needs no mapping or normalisation; only control characters are prohibited.
        if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in text):
            raise ValueError("password contains a control character")
        return text
    mapped = "".join(" " if stringprep.in_table_c12(ch) else ch
                     for ch in text if not stringprep.in_table_b1(ch))
    normalized = unicodedata.normalize("NFKC", mapped)
    for ch in normalized:
        if (stringprep.in_table_c12(ch) or stringprep.in_table_c21_c22(ch) or stringprep.in_table_c3(ch)
                or stringprep.in_table_c4(ch) or stringprep.in_table_c5(ch) or stringprep.in_table_c6(ch)
                or stringprep.in_table_c7(ch) or stringprep.in_table_c8(ch) or stringprep.in_table_c9(ch)):
            raise ValueError(f"password contains prohibited character U+{ord(ch):04X}")
        if stringprep.in_table_a1(ch):
            raise ValueError(f"password contains unassigned character U+{ord(ch):04X}")
    if any(stringprep.in_table_d1(ch) for ch in normalized):
        if any(stringprep.in_table_d2(ch) for ch in normalized):
            raise ValueError("password mixes right-to-left and left-to-right characters")
        if not (stringprep.in_table_d1(normalized[0]) and stringprep.in_table_d1(normalized[-1])):
            raise ValueError("right-to-left password must start and end with a right-to-left character")
    return normalized


def derive_keys(password: str, salt: bytes, iterations: int) -> tuple[bytes, bytes]:
    """(StoredKey, ServerKey) for a password, per RFC 5802 §3 with SHA-256."""
    salted = hashlib.pbkdf2_hmac("sha256", saslprep(password).encode(), salt, iterations)
    client_key = hmac.digest(salted, b"Client Key", "sha256")
    server_key = hmac.digest(salted, b"Server Key", "sha256")
    return hashlib.sha256(client_key).digest(), server_key


def hash_password(password: str, salt: bytes | None = None, iterations: int = DEFAULT_ITERATIONS) -> str:
    """The credential part of a file line (after ``username:``); a fresh 16-byte salt if `salt` is None."""
    if iterations < 1:
        raise ValueError("iterations must be at least 1")
    if salt is None:
        salt = secrets.token_bytes(16)
    elif not salt:
        raise ValueError("salt must not be empty")
    stored_key, server_key = derive_keys(password, salt, iterations)
    fields = (base64.b64encode(value).decode() for value in (salt, stored_key, server_key))
    return ":".join((MECHANISM, str(iterations), *fields))


def credential_line(username: str, password: str, salt: bytes | None = None,
                    iterations: int = DEFAULT_ITERATIONS) -> str:
    """A whole credentials file line (without newline) for one user."""
    _check_username(username)
    return f"{username}:{hash_password(password, salt, iterations)}"


def _check_username(username: str) -> None:
    if not username or username.startswith("#") or username != username.strip() or "\n" in username:
        raise ValueError(f"username {username!r} cannot be stored (empty, leading '#', or outer whitespace)")


@dataclass(slots=True, frozen=True)
class CredentialEntry:
    username: str
    iterations: int
    salt: bytes
    stored_key: bytes
    server_key: bytes


class Credentials:
    """The loaded credentials file: username -> entry. Immutable once built; reload by loading again."""

    __slots__ = ("_entries",)

    def __init__(self, entries: dict[str, CredentialEntry]) -> None:
        self._entries = entries

    @classmethod
    def load(cls, path: str | Path) -> Credentials:
        path = Path(path)
        return cls.parse(path.read_text(encoding="utf-8"), str(path))

    @classmethod
    def parse(cls, text: str, source: str = "<credentials>") -> Credentials:
        """Parse file content; ValueError naming `source` and the line on any malformed or duplicate line."""
        entries: dict[str, CredentialEntry] = {}
        for number, raw in enumerate(text.splitlines(), 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            try:
                entry = parse_line(line)
            except ValueError as exc:
                raise ValueError(f"{source}:{number}: {exc}") from None
            if entry.username in entries:
                raise ValueError(f"{source}:{number}: duplicate user {entry.username!r}")
            entries[entry.username] = entry
        return cls(entries)

    def lookup(self, username: str) -> CredentialEntry | None:
        return self._entries.get(username)

    def __len__(self) -> int:
        return len(self._entries)

    def entries(self) -> list[CredentialEntry]:
        return list(self._entries.values())

    def typical_iterations(self) -> int:
        """The most common iteration count, so made-up entries for unknown users look like real ones."""
        if not self._entries:
            return DEFAULT_ITERATIONS
        counts: dict[int, int] = {}
        for entry in self._entries.values():
            counts[entry.iterations] = counts.get(entry.iterations, 0) + 1
        return max(counts, key=counts.__getitem__)


def is_scram_line(line: str) -> bool:
    """Whether a stripped line has the SCRAM-SHA-256 shape (it may still be malformed)."""
    parts = line.rsplit(":", 5)
    return len(parts) == 6 and parts[1] == MECHANISM


def parse_line(line: str) -> CredentialEntry:
    """One stripped, non-comment file line; ValueError (never quoting the line) if it is not a SCRAM line."""
    parts = line.rsplit(":", 5)
    if len(parts) != 6:
        raise ValueError("expected username:SCRAM-SHA-256:iterations:salt:StoredKey:ServerKey")
    username, mechanism, iterations_text, salt_b64, stored_b64, server_b64 = parts
    if not username:
        raise ValueError("empty username")
    if mechanism != MECHANISM:
        raise ValueError(f"unsupported mechanism {mechanism!r} (only {MECHANISM})")
    if not (iterations_text.isascii() and iterations_text.isdigit()) or int(iterations_text) < 1:
        raise ValueError(f"invalid iteration count {iterations_text!r}")
    salt = _b64(salt_b64, "salt")
    if not salt:
        raise ValueError("empty salt")
    stored_key = _b64(stored_b64, "StoredKey")
    server_key = _b64(server_b64, "ServerKey")
    if len(stored_key) != KEY_SIZE or len(server_key) != KEY_SIZE:
        raise ValueError(f"StoredKey and ServerKey must be {KEY_SIZE} bytes")
    return CredentialEntry(username, int(iterations_text), salt, stored_key, server_key)


def _b64(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"invalid base64 in {what}") from None
