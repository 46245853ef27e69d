"""The files both targets share for the auth and TLS variants: one password file, one CA and server certificate.

The password file is made by Mosquitto's own `mosquitto_passwd -c -b` so both brokers read the identical
file; the certificate comes from a throwaway CA (trustme) and is valid for `localhost` and 127.0.0.1.
"""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

MOSQUITTO_PASSWD_FALLBACK = "/usr/bin/mosquitto_passwd"
BENCH_USERS = 100
BENCH_PASSWORD = "bench-secret"  # a benchmark fixture, not a secret: the file it protects lives for one run
SERVER_HOSTNAME = "localhost"
MAX_BENCH_USERS = 10_000  # each user costs one mosquitto_passwd run (~5 ms)


def mosquitto_passwd_path() -> str | None:
    found = shutil.which("mosquitto_passwd")
    if found:
        return found
    return MOSQUITTO_PASSWD_FALLBACK if os.access(MOSQUITTO_PASSWD_FALLBACK, os.X_OK) else None


@dataclass(frozen=True, slots=True)
class Security:
    """What the targets are started with beyond a plain anonymous listener, and what clients need to match.

    password_file set: every target gets it with anonymous access off. certfile set: every target gets a
    TLS listener (TLS 1.2 or newer) with this certificate; clients verify it against cafile.
    """

    password_file: Path | None = None
    users: tuple[str, ...] = field(default=(), repr=False)
    password: str = field(default="", repr=False)
    certfile: Path | None = None
    keyfile: Path | None = None
    cafile: Path | None = None
    server_hostname: str = SERVER_HOSTNAME

    @property
    def auth(self) -> bool:
        return self.password_file is not None

    @property
    def tls(self) -> bool:
        return self.certfile is not None

    def tags(self) -> str:
        """`(auth,tls)`-style suffix for a server label; empty for the plain setup."""
        parts = [name for name, on in (("auth", self.auth), ("tls", self.tls)) if on]
        return f"({','.join(parts)})" if parts else ""

    def client_context(self) -> ssl.SSLContext:
        """One context for every client connection: verifies the server certificate, TLS 1.2 or newer."""
        if self.cafile is None:
            raise ValueError("no TLS material: start the targets with tls=True")
        ctx = ssl.create_default_context(cafile=str(self.cafile))
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        return ctx


def write_password_file(path: Path, users: tuple[str, ...], password: str) -> None:
    """Hash every user with mosquitto_passwd (`-c -b` for the first, `-b` for the rest)."""
    exe = mosquitto_passwd_path()
    if exe is None:
        raise RuntimeError("mosquitto_passwd not found: it makes the password file both targets read")
    if not users or len(users) > MAX_BENCH_USERS:
        raise ValueError(f"need 1..{MAX_BENCH_USERS} users, got {len(users)}")
    for i, user in enumerate(users):
        cmd = [exe, "-c", "-b", str(path), user, password] if i == 0 else [exe, "-b", str(path), user, password]
        done = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, timeout=30, check=False)
        if done.returncode != 0:
            # The command line holds the password, so only the exit code and mosquitto_passwd's own words.
            raise RuntimeError(f"mosquitto_passwd failed for {user!r} (exit {done.returncode}): "
                               f"{done.stderr.decode(errors='replace').strip()[:200]}")


def write_certificates(workdir: Path, hostname: str = SERVER_HOSTNAME) -> tuple[Path, Path, Path]:
    """A fresh CA and a server certificate for hostname and 127.0.0.1; returns (certfile, keyfile, cafile)."""
    import trustme  # a dev dependency: only the TLS variants need it

    ca = trustme.CA()
    leaf = ca.issue_cert(hostname, "127.0.0.1")
    certfile, keyfile, cafile = workdir / "server.crt", workdir / "server.key", workdir / "ca.crt"
    certfile.write_bytes(b"".join(pem.bytes() for pem in leaf.cert_chain_pems))
    keyfile.write_bytes(leaf.private_key_pem.bytes())
    keyfile.chmod(0o600)
    ca.cert_pem.write_to_path(str(cafile))
    return certfile, keyfile, cafile


@contextmanager
def security_files(*, auth: bool, tls: bool, users: int = BENCH_USERS,
                   password: str = BENCH_PASSWORD) -> Iterator[Security]:
    """Make the password file and/or certificates in a temporary dir, removed on exit."""
    if not (auth or tls):
        yield Security()
        return
    workdir = Path(tempfile.mkdtemp(prefix="loadtest-security-"))
    try:
        sec = Security()
        if auth:
            names = tuple(f"bench{i}" for i in range(users))
            write_password_file(workdir / "passwd", names, password)
            sec = Security(password_file=workdir / "passwd", users=names, password=password)
        if tls:
            certfile, keyfile, cafile = write_certificates(workdir)
            sec = Security(password_file=sec.password_file, users=sec.users, password=sec.password,
                           certfile=certfile, keyfile=keyfile, cafile=cafile)
        yield sec
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
