"""The admin API's bearer token, one job: find it in the settings (`api_token`, then the first line of
`api_token_file`), or make a random one and keep it in `<data_dir>/api_token` (mode 0600), so a restarted node
answers to the same token. The token itself is never logged: only where it came from."""

from __future__ import annotations

import logging
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

from tidewire.errors import TidewireError
from tidewire.gateway.config import Settings

log = logging.getLogger("tidewire.admin")

TOKEN_FILE_NAME = "api_token"
TOKEN_BYTES = 32  # of randomness in a generated token (43 URL-safe characters)
MAX_TOKEN_FILE_BYTES = 4096  # a token file is one short line; anything bigger is not one


class TokenError(TidewireError, OSError):
    """The configured token cannot be used (unreadable or empty file); the message names the file only."""


@dataclass(frozen=True, slots=True)
class ApiToken:
    value: str
    source: str  # "setting", "file" or "generated": for the log line, never the value

    def __repr__(self) -> str:  # a token that ends up in a traceback or a log line shows nothing
        return f"ApiToken(source={self.source!r})"


def resolve_token(settings: Settings) -> tuple[ApiToken, Path | None]:
    """The token and the file it lives in (None: given directly). Raises `TokenError` for a bad
    `api_token_file`; a generated token's file that cannot be written is an `OSError`."""
    given = (settings.api_token or "").strip()  # blank (an empty TIDEWIRE_API_TOKEN) counts as not set
    if given:
        return ApiToken(given, "setting"), None
    if settings.api_token_file is not None:
        value = _read_token(settings.api_token_file)
        if value is None:
            raise TokenError(f"api_token_file {settings.api_token_file}: no token in it (empty first line)")
        return ApiToken(value, "file"), settings.api_token_file
    path = settings.data_dir / TOKEN_FILE_NAME
    value = _read_token(path, missing_ok=True)
    if value is not None:
        _owner_only(path)
        return ApiToken(value, "file"), path
    return ApiToken(_generate(path), "generated"), path


def _read_token(path: Path, *, missing_ok: bool = False) -> str | None:
    try:
        with path.open("rb") as f:
            data = f.read(MAX_TOKEN_FILE_BYTES + 1)
    except FileNotFoundError:
        if missing_ok:
            return None
        raise TokenError(f"api_token_file {path}: no such file") from None
    except OSError as exc:
        raise TokenError(f"api_token_file {path}: {exc.strerror}") from None
    if len(data) > MAX_TOKEN_FILE_BYTES:
        raise TokenError(f"token file {path}: larger than {MAX_TOKEN_FILE_BYTES} bytes")
    lines = data.decode("utf-8", "replace").splitlines()
    first = lines[0].strip() if lines else ""
    return first or None


def _owner_only(path: Path) -> None:
    """A token file others may read is tightened to 0600 (it was copied or made with a loose umask)."""
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        os.chmod(path, 0o600)
        log.warning("admin.token_file_mode_fixed", extra={"path": str(path), "was": oct(mode)})


def _generate(path: Path) -> str:
    """A new random token written to `path` with mode 0600 from the start (never readable by others, even
    for a moment), fsynced, under a temporary name renamed into place."""
    value = secrets.token_urlsafe(TOKEN_BYTES)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # O_CREAT's mode is masked by the umask; this is not
        os.write(fd, (value + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    log.info("admin.token_generated", extra={"path": str(path)})
    return value
