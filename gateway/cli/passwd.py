"""`tidewire passwd`: add, update or delete a user in a password file, with mosquitto_passwd's semantics.

Each user gets a Mosquitto ``$7$`` line (PBKDF2-SHA512, 101 iterations, 12-byte salt, as mosquitto_passwd 2.0
writes; ``-H sha512`` for the ``$6$`` of Mosquitto 1.x) and, unless ``--no-scram``, a SCRAM-SHA-256 line for
MQTT 5 enhanced authentication, so one file serves plain passwords and SCRAM alike.

Mosquitto can read such a file: 2.0.11 (and 1.6) logs "Error: Invalid password hash type for user X,
removing entry." once per SCRAM line at start and on reload, then uses the user's ``$7$`` line. Give files
meant only for Mosquitto ``--no-scram`` to keep its log clean. Editing a mixed file with mosquitto_passwd
turns the user's SCRAM line into a second ``$7$`` line, which Tidewire refuses as a duplicate: edit mixed
files with this command, which replaces all of a user's lines.

The file is rewritten atomically (temporary file in the same directory, then rename); a new file is 0600,
an updated one keeps its mode (and owner, when allowed).
"""

from __future__ import annotations

import getpass
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import typer

from tidewire.errors import TidewireError
from tidewire.extensions.password_file import (
    DEFAULT_ITERATIONS,
    MAX_ITERATIONS,
    HashKind,
    check_username,
    line_username,
    mosquitto_hash,
)
from tidewire.extensions.scram_credentials import DEFAULT_ITERATIONS as SCRAM_ITERATIONS
from tidewire.extensions.scram_credentials import credential_line

_HASHES = {"sha512-pbkdf2": HashKind.PBKDF2_SHA512, "sha512": HashKind.SHA512}
MAX_PASSWORD = 65535  # mosquitto_passwd's limit, in bytes
_HASH_HELP = "sha512-pbkdf2 ($7$, default) or sha512 ($6$, Mosquitto 1.x)"
_ITER_HELP = "PBKDF2 iterations of the $7$ line"
_SCRAM_ITER_HELP = "iterations of the SCRAM-SHA-256 line"
_NO_SCRAM_HELP = "write no SCRAM-SHA-256 line (files only for Mosquitto, which logs an error for each)"


class PasswdError(TidewireError):
    """A refusal with mosquitto_passwd's exit code; the message never holds a password."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def user_lines(username: str, password: str, *, kind: HashKind = HashKind.PBKDF2_SHA512,
               iterations: int = DEFAULT_ITERATIONS, scram: bool = True,
               scram_iterations: int = SCRAM_ITERATIONS) -> list[str]:
    """The lines (without newlines) that store `password` for `username`."""
    check_username(username)
    lines = [f"{username}:{mosquitto_hash(password, kind, iterations)}"]
    if scram:
        try:
            lines.append(credential_line(username, password, iterations=scram_iterations))
        except ValueError:
            raise PasswdError("the password has characters SASLprep (RFC 4013) prohibits for SCRAM-SHA-256, "
                              "such as control characters; choose another or pass --no-scram") from None
    return lines


def edit_text(text: str, username: str, new_lines: Sequence[str] | None) -> tuple[str, bool]:
    """`text` with every line of `username` replaced by `new_lines` (None: deleted); and whether it had any.

    Other lines, comments and blank lines are kept as they are. New lines go where the user's first line
    was, or at the end.
    """
    out: list[str] = []
    found = False
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            out.append(raw)
            continue
        owner = line_username(line)
        if owner is None:
            raise PasswdError(f"Corrupt password file at line {number}.")
        if owner != username:
            out.append(raw)
        elif not found:
            found = True
            out.extend(new_lines or ())
    if not found and new_lines:
        out.extend(new_lines)
    return "".join(f"{line}\n" for line in out), found


def write_atomically(path: Path, text: str, *, create: bool) -> None:
    """Replace `path` (through symlinks) with `text`; 0600 when `create`, else the old file's mode and owner."""
    target = Path(os.path.realpath(path))
    old = None if create else target.stat()
    fd, temp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")  # 0600
    try:
        with os.fdopen(fd, "w", encoding="utf-8", errors="surrogateescape", newline="\n") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        if old is not None:
            os.chmod(temp, old.st_mode & 0o7777)
            try:
                os.chown(temp, old.st_uid, old.st_gid)
            except PermissionError:
                pass  # not root: the file becomes ours, as with any editor that renames
        os.replace(temp, target)
    except BaseException:
        os.unlink(temp)
        raise
    directory = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(directory)  # the rename itself survives a crash
    finally:
        os.close(directory)


def prompt_password() -> str:
    """Ask twice like mosquitto_passwd: hidden on a terminal, plain lines from a pipe."""
    first = _read_password("Password: ")
    second = _read_password("Reenter password: ")
    if first != second:
        raise PasswdError("Passwords do not match.", code=2)
    return first


def _read_password(prompt: str) -> str:
    if sys.stdin.isatty():
        value = getpass.getpass(prompt)
    else:
        sys.stdout.write(prompt)
        sys.stdout.flush()
        value = sys.stdin.readline().rstrip("\r\n")
        sys.stdout.write("\n")
    if not value:
        raise PasswdError("Empty password.")
    return value


def run_passwd(file: Path, username: str, password: str | None, *, create: bool = False, batch: bool = False,
               delete: bool = False, kind: HashKind = HashKind.PBKDF2_SHA512,
               iterations: int = DEFAULT_ITERATIONS, scram: bool = True,
               scram_iterations: int = SCRAM_ITERATIONS) -> None:
    """Do what the command line asked; PasswdError (with exit code) on refusal."""
    if create and delete:
        raise PasswdError("-c and -D cannot be used together.")
    if batch and delete:
        raise PasswdError("-b and -D cannot be used together.")
    if batch and password is None:
        raise PasswdError("-b needs the password on the command line.")
    if not batch and password is not None:
        raise PasswdError("a password on the command line needs -b.")
    if not 1 <= iterations <= MAX_ITERATIONS:
        raise PasswdError(f"Number of iterations must be between 1 and {MAX_ITERATIONS}.")
    try:
        check_username(username)
    except ValueError as exc:
        raise PasswdError(f"{str(exc)[0].upper()}{str(exc)[1:]}.") from None
    text = ""
    if not create:
        try:
            text = file.read_text(encoding="utf-8", errors="surrogateescape")
        except OSError as exc:
            raise PasswdError(f"Unable to open password file {file}. {exc.strerror or exc}.") from None
        edit_text(text, username, ())  # refuse a corrupt file before asking for a password
    if delete:
        new_text, found = edit_text(text, username, None)
        if not found:
            raise PasswdError(f"User {username} not found in password file.")
        write_atomically(file, new_text, create=False)
        return
    if password is None:
        password = prompt_password()
    if len(password.encode("utf-8", "surrogateescape")) > MAX_PASSWORD:
        raise PasswdError("Password must be less than 65536 characters long.")
    lines = user_lines(username, password, kind=kind, iterations=iterations, scram=scram,
                       scram_iterations=scram_iterations)
    new_text, _ = edit_text(text, username, lines)
    write_atomically(file, new_text, create=create)


def passwd_command(
    file: Annotated[Path, typer.Argument(help="password file")],
    username: Annotated[str, typer.Argument(help="user to add, update or delete")],
    password: Annotated[str | None, typer.Argument(help="with -b only")] = None,
    create: Annotated[bool, typer.Option("-c", "--create", help="create or overwrite the file")] = False,
    batch: Annotated[bool, typer.Option("-b", "--batch", help="take the password from the command line")] = False,
    delete: Annotated[bool, typer.Option("-D", "--delete", help="delete the user")] = False,
    hash_name: Annotated[str, typer.Option("-H", "--hash", help=_HASH_HELP)] = "sha512-pbkdf2",
    iterations: Annotated[int, typer.Option("-I", "--iterations", help=_ITER_HELP)] = DEFAULT_ITERATIONS,
    scram_iterations: Annotated[int, typer.Option(min=SCRAM_ITERATIONS, help=_SCRAM_ITER_HELP)] = SCRAM_ITERATIONS,
    no_scram: Annotated[bool, typer.Option("--no-scram", help=_NO_SCRAM_HELP)] = False,
) -> None:
    """Manage a password file like mosquitto_passwd: a $7$ line per user plus a SCRAM-SHA-256 line.

    Without -b the password is asked twice. Mosquitto reads these files too, logging one error per SCRAM
    line; use --no-scram for files meant only for Mosquitto.
    """
    kind = _HASHES.get(hash_name)
    try:
        if kind is None:
            raise PasswdError(f"Unknown hash type '{hash_name}'")
        run_passwd(file, username, password, create=create, batch=batch, delete=delete, kind=kind,
                   iterations=iterations, scram=not no_scram, scram_iterations=scram_iterations)
    except PasswdError as exc:
        typer.echo(f"Error: {exc}", err=True)
        raise typer.Exit(exc.code) from None
    except OSError as exc:
        typer.echo(f"Error: {file}: {exc.strerror or exc}", err=True)
        raise typer.Exit(1) from None


if __name__ == "__main__":  # `python -m tidewire.gateway.cli.passwd`, without loading the server
    typer.run(passwd_command)
