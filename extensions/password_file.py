"""Password-file authentication: Mosquitto `password_file` lines and SCRAM-SHA-256 lines, checked off the loop.

One file may hold any mix of these lines (blank lines and lines starting with ``#`` are skipped)::

    alice:$7$101$<salt b64>$<hash b64>         PBKDF2-HMAC-SHA512 (mosquitto_passwd 2.0 default)
    bob:$6$<salt b64>$<hash b64>               SHA-512(password bytes + salt) (mosquitto_passwd -H sha512, 1.x)
    alice:SCRAM-SHA-256:4096:<salt>:<StoredKey>:<ServerKey>   extensions.scram_credentials, for MQTT 5 AUTH

As in Mosquitto (src/password_mosq.c, src/security_default.c in 2.0.11): the salt is 12 bytes, the hash 64,
both standard base64 with padding; the password is hashed as the raw bytes the client sent; the user name is
what comes before the first ``:`` with blanks trimmed. A user may have one Mosquitto line and one SCRAM line;
a plain password is checked against the Mosquitto line when there is one, else against the SCRAM line
(StoredKey derived from the SASLprep'd password). Unlike Mosquitto, which logs a bad line and drops it, any
malformed or duplicate line is a ValueError naming the file and line: a typo must not silently lock a user out
or leave a stale entry in force. Errors never quote a line, since a plain-text password file would leak.

An unknown user costs the same hash work as the most common kind of entry before the source says IGNORE,
so timing does not tell which user names exist. Expensive PBKDF2 runs on a bounded thread pool (hashlib releases
the GIL), with an explicit cap on queued checks; a cheap check runs inline: a single SHA-512 for ``$6$``, and
PBKDF2 of at most `inline_iterations` (Mosquitto's default of 101 costs ~70 us here, less than the hop to a
thread and back, ~200 us of latency, so inline is both faster and no longer a pause for other clients).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import os
import secrets
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import Enum
from functools import partial
from pathlib import Path

from tidewire.extensions.authentication import IGNORE, AuthDecision, AuthRequest, Failure, Outcome
from tidewire.extensions.scram_credentials import (
    KEY_SIZE,
    CredentialEntry,
    Credentials,
    is_scram_line,
    parse_line,
    saslprep,
)

SALT_LEN = 12  # Mosquitto drops entries whose salt is any other length
HASH_LEN = 64  # SHA-512 digest size
DEFAULT_ITERATIONS = 101  # mosquitto_passwd's PW_DEFAULT_ITERATIONS
MAX_ITERATIONS = 10_000_000  # a line asking for more is refused: each login would cost seconds
MAX_PASSWORD = 65535  # bytes; MQTT's own limit, and mosquitto_passwd's
DEFAULT_MAX_PENDING = 1024  # PBKDF2 checks queued or running before new logins are turned away
_SCRAM_SALT_LEN = 16
_BAD = "bad user name or password"  # one reason for every DENY: logs say nothing about which part was wrong


class HashKind(Enum):
    SHA512 = 6
    PBKDF2_SHA512 = 7


@dataclass(frozen=True, slots=True)
class MosquittoEntry:
    username: str
    kind: HashKind
    iterations: int  # 1 for SHA512 (unused)
    salt: bytes
    digest: bytes


def mosquitto_hash(password: str | bytes, kind: HashKind = HashKind.PBKDF2_SHA512,
                   iterations: int = DEFAULT_ITERATIONS, salt: bytes | None = None) -> str:
    """The part of a Mosquitto line after ``username:``, as mosquitto_passwd writes it."""
    if iterations < 1 or iterations > MAX_ITERATIONS:
        raise ValueError(f"iterations must be between 1 and {MAX_ITERATIONS}")
    secret = password.encode("utf-8", "surrogateescape") if isinstance(password, str) else password
    salt = secrets.token_bytes(SALT_LEN) if salt is None else salt
    if len(salt) != SALT_LEN:
        raise ValueError(f"salt must be {SALT_LEN} bytes")
    entry = MosquittoEntry("", kind, iterations, salt, b"")
    digest = _digest(entry, secret)
    salt64, digest64 = base64.b64encode(salt).decode(), base64.b64encode(digest).decode()
    if kind is HashKind.PBKDF2_SHA512:
        return f"$7${iterations}${salt64}${digest64}"
    return f"$6${salt64}${digest64}"


def check_username(username: str) -> None:
    """ValueError unless `username` can be stored in both line kinds (mosquitto_passwd's rules and ours)."""
    if not username:
        raise ValueError("user name must not be empty")
    if len(username.encode("utf-8", "surrogateescape")) > 65535:
        raise ValueError("user name must be less than 65536 bytes long")
    if ":" in username:
        raise ValueError("user name must not contain ':'")
    if any(ord(ch) < 0x20 or 0x7F <= ord(ch) < 0xA0 for ch in username):
        raise ValueError("user name must not contain control characters")
    if username.startswith("#") or username != username.strip():
        raise ValueError("user name must not start with '#' or with or end in whitespace")


def line_username(line: str) -> str | None:
    """The user a stripped line is about; None for a blank or comment line, or one without a ``:``."""
    if not line or line.startswith("#"):
        return None
    if is_scram_line(line):
        return line.rsplit(":", 5)[0]
    username, sep, _ = line.partition(":")
    return username.strip(" \t") if sep else None


def parse_mosquitto(username: str, text: str) -> MosquittoEntry:
    """The hash part of a Mosquitto line; ValueError (never quoting it) if malformed."""
    fields = text.split("$")
    if len(fields) < 2 or fields[0] or fields[1] not in ("6", "7"):
        raise ValueError("expected a $7$ or $6$ hash or a SCRAM-SHA-256 line "
                         "(plain-text passwords: convert with mosquitto_passwd -U)")
    kind = HashKind(int(fields[1]))
    iterations = 1
    if kind is HashKind.PBKDF2_SHA512:
        if len(fields) != 5:
            raise ValueError("expected $7$<iterations>$<salt>$<hash>")
        iterations_text = fields[2]
        if not (iterations_text.isascii() and iterations_text.isdigit()):
            raise ValueError("invalid iteration count")
        iterations = int(iterations_text)
        if not 1 <= iterations <= MAX_ITERATIONS:
            raise ValueError(f"iteration count must be between 1 and {MAX_ITERATIONS}")
    elif len(fields) != 4:
        raise ValueError("expected $6$<salt>$<hash>")
    salt, digest = _b64(fields[-2], "salt"), _b64(fields[-1], "hash")
    if len(salt) != SALT_LEN:
        raise ValueError(f"salt must be {SALT_LEN} bytes")
    if len(digest) != HASH_LEN:
        raise ValueError(f"hash must be {HASH_LEN} bytes")
    return MosquittoEntry(username, kind, iterations, salt, digest)


def _b64(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"invalid base64 in {what}") from None


@dataclass(slots=True)
class _Builder:
    """Accumulates entries from one or more files, remembering where each came from for duplicate errors."""

    mosquitto: dict[str, MosquittoEntry] = field(default_factory=dict)
    scram: dict[str, CredentialEntry] = field(default_factory=dict)
    origins: dict[tuple[str, str], str] = field(default_factory=dict)

    def add_text(self, text: str, source: str) -> None:
        for number, raw in enumerate(text.splitlines(), 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            where = f"{source}:{number}"
            try:
                self._add_line(line, where)
            except ValueError as exc:
                raise ValueError(f"{where}: {exc}") from None

    def _add_line(self, line: str, where: str) -> None:
        username, sep, rest = line.partition(":")
        rest = rest.strip(" \t")
        if is_scram_line(line) or (not rest.startswith("$") and "SCRAM-" in rest):
            entry = parse_line(line)  # its errors say what a SCRAM line needs
            self._claim("SCRAM", entry.username, where)
            self.scram[entry.username] = entry
            return
        username = username.strip(" \t")
        if not sep:
            raise ValueError("expected user:hash")
        if not username:
            raise ValueError("empty user name")
        hashed = parse_mosquitto(username, rest)
        self._claim("Mosquitto", username, where)
        self.mosquitto[username] = hashed

    def _claim(self, kind: str, username: str, where: str) -> None:
        first = self.origins.setdefault((kind, username), where)
        if first != where:
            raise ValueError(f"duplicate {kind} line for user {username!r} (first at {first})")


@dataclass(frozen=True, slots=True)
class PasswordFile:
    """Loaded password files: Mosquitto entries and SCRAM credentials by user name. Immutable."""

    mosquitto: Mapping[str, MosquittoEntry]
    scram: Credentials

    @classmethod
    def parse(cls, text: str, source: str = "<password file>") -> PasswordFile:
        builder = _Builder()
        builder.add_text(text, source)
        return cls(builder.mosquitto, Credentials(builder.scram))

    @classmethod
    def load(cls, paths: Sequence[str | os.PathLike[str] | None]) -> PasswordFile:
        """Read every given file (None entries skipped) into one set; ValueError naming file and line."""
        builder = _Builder()
        for path in paths:
            if path is None:
                continue
            try:
                text = Path(path).read_text(encoding="utf-8")
            except UnicodeDecodeError:
                raise ValueError(f"{path}: not UTF-8") from None
            except OSError as exc:
                raise ValueError(f"{path}: {exc.strerror or exc}") from None
            builder.add_text(text, str(path))
        return cls(builder.mosquitto, Credentials(builder.scram))

    def usernames(self) -> set[str]:
        return set(self.mosquitto) | {entry.username for entry in self.scram.entries()}


def verify_mosquitto(entry: MosquittoEntry, password: bytes) -> bool:
    return hmac.compare_digest(_digest(entry, password), entry.digest)


def _digest(entry: MosquittoEntry, password: bytes) -> bytes:
    if entry.kind is HashKind.PBKDF2_SHA512:
        return hashlib.pbkdf2_hmac("sha512", password, entry.salt, entry.iterations, HASH_LEN)
    return hashlib.sha512(password + entry.salt).digest()


def verify_scram(entry: CredentialEntry, password: bytes) -> bool:
    """Whether a plain password derives the entry's StoredKey (same work whether or not it can be SASLprep'd)."""
    try:
        prepared, usable = saslprep(password.decode("utf-8")).encode(), True
    except (UnicodeDecodeError, ValueError):
        prepared, usable = password, False
    salted = hashlib.pbkdf2_hmac("sha256", prepared, entry.salt, entry.iterations)
    stored_key = hashlib.sha256(hmac.digest(salted, b"Client Key", "sha256")).digest()
    return hmac.compare_digest(stored_key, entry.stored_key) and usable


@dataclass(frozen=True, slots=True)
class _State:
    file: PasswordFile
    decoy_kind: HashKind | None  # None: SCRAM
    decoy_iterations: int


def _state_for(file: PasswordFile) -> _State:
    """Pick the decoy for unknown users: the most common kind of check a known user's login runs."""
    counts: dict[tuple[HashKind | None, int], int] = {}
    for entry in file.mosquitto.values():
        key = (entry.kind, entry.iterations)
        counts[key] = counts.get(key, 0) + 1
    for scram in file.scram.entries():
        if scram.username not in file.mosquitto:  # SCRAM lines decide only for users without a Mosquitto line
            counts[(None, scram.iterations)] = counts.get((None, scram.iterations), 0) + 1
    if not counts:
        return _State(file, HashKind.PBKDF2_SHA512, DEFAULT_ITERATIONS)
    kind, iterations = max(counts, key=counts.__getitem__)
    return _State(file, kind, iterations)


class PasswordFileAuthenticator:
    """The "file" source of the auth chain over `password_file` (and the deprecated `auth_file`)."""

    __slots__ = ("_closed", "_decoy_secret", "_executor", "_inline_iterations", "_max_pending", "_offloaded",
                 "_paths", "_pending", "_state", "name")

    def __init__(self, paths: Sequence[str | os.PathLike[str] | None], hash_threads: int = 2, *,
                 inline_iterations: int = 200,
                 max_pending: int = DEFAULT_MAX_PENDING) -> None:
        """Load `paths` (None entries skipped); ValueError naming file and line if one cannot be used."""
        if hash_threads < 1:
            raise ValueError("hash_threads must be at least 1")
        if max_pending < 1:
            raise ValueError("max_pending must be at least 1")
        self.name = "file"
        self._paths = tuple(paths)
        self._state = _state_for(PasswordFile.load(self._paths))
        self._decoy_secret = secrets.token_bytes(32)
        self._max_pending = max_pending
        self._pending = 0
        self._offloaded = 0
        self._closed = False
        self._inline_iterations = inline_iterations
        self._executor = ThreadPoolExecutor(max_workers=hash_threads, thread_name_prefix="tidewire-pwhash")

    @property
    def scram_credentials(self) -> Credentials:
        """The SCRAM lines, for `extensions.scram.ScramSha256.set_credentials` after each reload."""
        return self._state.file.scram

    @property
    def password_file(self) -> PasswordFile:
        return self._state.file

    @property
    def offloaded(self) -> int:
        """Hash checks run on the thread pool so far (known and unknown users alike)."""
        return self._offloaded

    def reload(self) -> None:
        """Re-read every file; on any error keep the previous entries and raise ValueError."""
        self._state = _state_for(PasswordFile.load(self._paths))

    async def close(self) -> None:
        self._closed = True
        # Waits at most for the checks already running (milliseconds each); queued ones are dropped.
        self._executor.shutdown(wait=True, cancel_futures=True)

    async def authenticate(self, request: AuthRequest) -> AuthDecision:
        username, password = request.username, request.password
        if username is None:
            return IGNORE
        if self._closed or self._pending >= self._max_pending:
            # Before any lookup, so a full backlog looks the same for every user name.
            return AuthDecision(Outcome.DENY, failure=Failure.UNAVAILABLE, reason="password checks backlog full")
        state = self._state
        mosquitto = state.file.mosquitto.get(username)
        scram = state.file.scram.lookup(username)
        known = mosquitto is not None or scram is not None
        if password is None or len(password) > MAX_PASSWORD:
            # A real check does no hash work here either, so there is nothing to imitate for unknown users.
            return AuthDecision(Outcome.DENY, reason=_BAD) if known else IGNORE
        check: Callable[[], bool]
        if mosquitto is not None:
            check, cheap = partial(verify_mosquitto, mosquitto, password), self._cheap(mosquitto.kind,
                                                                                        mosquitto.iterations)
        elif scram is not None:
            check, cheap = partial(verify_scram, scram, password), self._cheap(None, scram.iterations)
        else:
            check, cheap = self._decoy(state, username, password)
        matched = check() if cheap else await self._offload(check)
        # No stored password holds a NUL (mosquitto_passwd takes C strings, SASLprep refuses it), and HMAC pads
        # short keys with zeros, so PBKDF2 would take "secret\0" for "secret": refuse it after the same work.
        matched = matched and b"\x00" not in password
        if not known:
            return IGNORE
        if matched:
            return AuthDecision(Outcome.ALLOW, username=username)
        return AuthDecision(Outcome.DENY, reason=_BAD)

    def _decoy(self, state: _State, username: str, password: bytes) -> tuple[Callable[[], bool], bool]:
        """A check with the same cost as a real one that cannot succeed; its salt is stable per user name."""
        salt = hmac.digest(self._decoy_secret, username.encode("utf-8", "surrogateescape"), "sha256")
        if state.decoy_kind is None:
            fake = CredentialEntry(username, state.decoy_iterations, salt[:_SCRAM_SALT_LEN],
                                   secrets.token_bytes(KEY_SIZE), secrets.token_bytes(KEY_SIZE))
            return partial(verify_scram, fake, password), self._cheap(None, state.decoy_iterations)
        entry = MosquittoEntry(username, state.decoy_kind, state.decoy_iterations, salt[:SALT_LEN],
                               secrets.token_bytes(HASH_LEN))
        return partial(verify_mosquitto, entry, password), self._cheap(state.decoy_kind, state.decoy_iterations)

    def _cheap(self, kind: HashKind | None, iterations: int) -> bool:
        return kind is HashKind.SHA512 or iterations <= self._inline_iterations

    async def _offload(self, check: Callable[[], bool]) -> bool:
        self._pending += 1
        self._offloaded += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, check)
        finally:
            self._pending -= 1
