"""Tests for extensions.password_file and `tidewire passwd`, against Debian's mosquitto_passwd and mosquitto."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import stat
import subprocess
import sys
import threading
import unicodedata
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from loadtest.ports import free_port
from tests.waiting import wait_until
from tidewire.extensions.authentication import AuthDecision, AuthRequest, Failure, Outcome
from tidewire.extensions.password_file import (
    HashKind,
    PasswordFile,
    PasswordFileAuthenticator,
    mosquitto_hash,
    verify_mosquitto,
)
from tidewire.extensions.scram_credentials import credential_line

REPO = Path(__file__).resolve().parents[2]
MOSQUITTO = "/usr/sbin/mosquitto"
needs_mosquitto_passwd = pytest.mark.skipif(shutil.which("mosquitto_passwd") is None, reason="no mosquitto_passwd")
needs_mosquitto = pytest.mark.skipif(not Path(MOSQUITTO).exists() or shutil.which("mosquitto_pub") is None,
                                     reason="no mosquitto broker or mosquitto_pub")
UNICODE_PASSWORD = "pässwörd ✓"


def tidewire_passwd(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """The real command line in its own process, as an operator runs it."""
    return subprocess.run([sys.executable, "-m", "tidewire", "passwd", *map(str, args)], cwd=REPO,
                          capture_output=True, text=True, timeout=30, check=False)


def passwd_cli(*args: str | Path, stdin: str | None = None) -> Result:
    """The same command line in this process (each subprocess pays for importing the whole gateway)."""
    from tidewire.gateway.cli import app

    return CliRunner().invoke(app, ["passwd", *map(str, args)], input=stdin)


def mosquitto_passwd(*args: str | Path) -> None:
    subprocess.run(["mosquitto_passwd", *map(str, args)], check=True, capture_output=True, timeout=30)


async def check(auth: PasswordFileAuthenticator, username: str | None, password: bytes | None) -> AuthDecision:
    return await auth.authenticate(AuthRequest("client-1", username, password))


async def assert_allows(auth: PasswordFileAuthenticator, username: str, password: bytes) -> None:
    decision = await check(auth, username, password)
    assert decision.outcome is Outcome.ALLOW, decision
    assert decision.username == username


async def assert_denies(auth: PasswordFileAuthenticator, username: str, password: bytes | None) -> None:
    decision = await check(auth, username, password)
    assert decision.outcome is Outcome.DENY, decision
    assert decision.failure is Failure.BAD_CREDENTIALS


def pwhash_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("tidewire-pwhash")]


@pytest.fixture
async def opened() -> AsyncIterator[list[PasswordFileAuthenticator]]:
    """Authenticators a test opens; all closed afterwards, leaving no hash threads."""
    made: list[PasswordFileAuthenticator] = []
    yield made
    for auth in made:
        await auth.close()
    assert not pwhash_threads()


def open_auth(made: list[PasswordFileAuthenticator], paths: Sequence[Path | None], **kwargs: int
              ) -> PasswordFileAuthenticator:
    auth = PasswordFileAuthenticator(paths, **kwargs)
    made.append(auth)
    return auth


@needs_mosquitto_passwd
async def test_file_from_mosquitto_passwd_is_verified(tmp_path: Path,
                                                      opened: list[PasswordFileAuthenticator]) -> None:
    path = tmp_path / "pw"
    mosquitto_passwd("-c", "-b", path, "alice", "secret")  # $7$, the 2.0 default
    mosquitto_passwd("-H", "sha512", "-b", path, "bob", "hunter2")  # $6$
    mosquitto_passwd("-b", path, "jörg", UNICODE_PASSWORD)
    text = path.read_text()
    assert "alice:$7$101$" in text and "bob:$6$" in text
    auth = open_auth(opened, [path, None], hash_threads=2)
    await assert_allows(auth, "alice", b"secret")
    await assert_denies(auth, "alice", b"wrong")
    await assert_denies(auth, "alice", None)
    await assert_denies(auth, "alice", b"secret\x00")
    await assert_allows(auth, "bob", b"hunter2")
    await assert_denies(auth, "bob", b"hunter")
    await assert_allows(auth, "jörg", UNICODE_PASSWORD.encode())
    await assert_denies(auth, "jörg", unicodedata.normalize("NFD", UNICODE_PASSWORD).encode())  # raw bytes
    assert (await check(auth, "mallory", b"secret")).outcome is Outcome.IGNORE
    assert (await check(auth, "mallory", None)).outcome is Outcome.IGNORE
    assert (await check(auth, None, b"secret")).outcome is Outcome.IGNORE
    assert auth.name == "file"
    assert len(auth.scram_credentials) == 0


@needs_mosquitto
async def test_file_from_tidewire_passwd_is_accepted_by_mosquitto(
        tmp_path: Path, opened: list[PasswordFileAuthenticator]) -> None:
    path = tmp_path / "pw"
    result = tidewire_passwd("-c", "-b", path, "alice", "secret")
    assert result.returncode == 0, result.stderr
    lines = path.read_text().splitlines()
    assert [line.split(":")[1][:3] for line in lines] == ["$7$", "SCR"]
    assert lines[0].startswith("alice:$7$101$")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert "secret" not in result.stdout + result.stderr

    port = free_port()
    conf = tmp_path / "mosquitto.conf"
    conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous false\npassword_file {path}\n"
                    "user root\nlog_dest stderr\npersistence false\n")
    broker = subprocess.Popen([MOSQUITTO, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True)
    try:
        wait_for_port(port, broker)
        good = mosquitto_pub(port, "alice", "secret")
        bad = mosquitto_pub(port, "alice", "wrong")
    finally:
        broker.terminate()
        _, log = broker.communicate(timeout=10)
    assert good.returncode == 0, good.stderr
    assert bad.returncode != 0
    assert "not authorised" in bad.stderr
    # Mosquitto 2.0 drops each SCRAM line with an error and keeps the user's $7$ line: what the docs say.
    assert "Invalid password hash type for user alice, removing entry" in log

    auth = open_auth(opened, [path])
    await assert_allows(auth, "alice", b"secret")
    await assert_denies(auth, "alice", b"wrong")
    assert auth.scram_credentials.lookup("alice") is not None


def wait_for_port(port: int, process: subprocess.Popen[str]) -> None:
    def listening() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"mosquitto exited: {process.communicate()[1]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return True
        except OSError:
            return False

    wait_until(listening, timeout=10, what=f"mosquitto listening on {port}", interval=0.05)


def mosquitto_pub(port: int, username: str, password: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["mosquitto_pub", "-h", "127.0.0.1", "-p", str(port), "-u", username, "-P", password,
                           "-t", "t", "-m", "x"], capture_output=True, text=True, timeout=10, check=False)


def line7(username: str, password: str) -> str:
    return f"{username}:{mosquitto_hash(password)}"


GOOD_SALT = "AAAAAAAAAAAAAAAA"  # 12 bytes
GOOD_HASH = "A" * 86 + "=="  # 64 bytes


@pytest.mark.parametrize(("line", "message"), [
    ("alice:plaintextsecret", "expected a $7$ or $6$ hash"),
    ("alice", "expected user:hash"),
    (":$6$" + GOOD_SALT + "$" + GOOD_HASH, "empty user name"),
    ("alice:$8$" + GOOD_SALT + "$" + GOOD_HASH, "expected a $7$ or $6$ hash"),
    ("alice:$7$0$" + GOOD_SALT + "$" + GOOD_HASH, "iteration count"),
    ("alice:$7$x$" + GOOD_SALT + "$" + GOOD_HASH, "invalid iteration count"),
    ("alice:$7$" + GOOD_SALT + "$" + GOOD_HASH, "expected $7$<iterations>"),
    ("alice:$6$" + GOOD_SALT, "expected $6$<salt>$<hash>"),
    ("alice:$6$AAAA$" + GOOD_HASH, "salt must be 12 bytes"),
    ("alice:$6$" + GOOD_SALT + "$AAAA", "hash must be 64 bytes"),
    ("alice:$6$" + GOOD_SALT + "$" + GOOD_HASH[:-1] + "!", "invalid base64 in hash"),
    ("alice:SCRAM-SHA-256:4096:AAAA", "expected username:SCRAM-SHA-256"),
    ("alice:SCRAM-SHA-256:0:AAAA:AAAA:AAAA", "invalid iteration count"),
])
def test_malformed_line_names_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "pw"
    path.write_text(f"# users\n\n{line}\n")
    with pytest.raises(ValueError) as caught:
        PasswordFile.load([path])
    assert str(caught.value).startswith(f"{path}:3: ")
    assert message in str(caught.value)
    assert "plaintextsecret" not in str(caught.value)


def test_mixed_lines_and_duplicates(tmp_path: Path) -> None:
    alice7, alice_scram = line7("alice", "a"), credential_line("alice", "a")
    parsed = PasswordFile.parse(f"{alice7}\n  # comment\n{alice_scram}\n{line7('bob', 'b')}\n")
    assert set(parsed.mosquitto) == {"alice", "bob"}
    assert parsed.scram.lookup("alice") is not None
    assert parsed.usernames() == {"alice", "bob"}
    with pytest.raises(ValueError, match=r"^f:3: duplicate Mosquitto line for user 'alice' \(first at f:1\)"):
        PasswordFile.parse(f"{alice7}\n{alice_scram}\n{line7('alice', 'b')}\n", "f")
    with pytest.raises(ValueError, match="duplicate SCRAM line"):
        PasswordFile.parse(f"{alice_scram}\n{alice_scram}\n")
    first, second = tmp_path / "password_file", tmp_path / "auth_file"
    first.write_text(alice7 + "\n")
    second.write_text(f"{alice_scram}\n{alice7}\n")  # auth_file is read as a second password file
    with pytest.raises(ValueError, match=f"^{second}:2: duplicate Mosquitto line .*first at {first}:1"):
        PasswordFile.load([first, second])
    with pytest.raises(ValueError, match="No such file"):
        PasswordFile.load([tmp_path / "missing"])
    assert PasswordFile.load([None, None]).usernames() == set()


def test_mosquitto_hash_formats() -> None:
    salt = bytes(range(12))
    line = mosquitto_hash("secret", HashKind.SHA512, salt=salt)
    entry = PasswordFile.parse(f"u:{line}").mosquitto["u"]
    assert (entry.kind, entry.salt) == (HashKind.SHA512, salt)
    assert verify_mosquitto(entry, b"secret") and not verify_mosquitto(entry, b"secreT")
    entry = PasswordFile.parse(f"u:{mosquitto_hash('secret', iterations=7)}").mosquitto["u"]
    assert (entry.kind, entry.iterations) == (HashKind.PBKDF2_SHA512, 7)
    with pytest.raises(ValueError):
        mosquitto_hash("secret", salt=b"short")


async def test_reload_swaps_atomically_and_keeps_old_state_on_error(
        tmp_path: Path, opened: list[PasswordFileAuthenticator]) -> None:
    path = tmp_path / "pw"
    path.write_text(line7("alice", "one") + "\n")
    auth = open_auth(opened, [path])
    await assert_allows(auth, "alice", b"one")
    path.write_text(f"{line7('alice', 'two')}\n{credential_line('bob', 'b')}\n")
    auth.reload()
    await assert_denies(auth, "alice", b"one")
    await assert_allows(auth, "alice", b"two")
    await assert_allows(auth, "bob", b"b")
    credentials = auth.scram_credentials
    assert credentials.lookup("bob") is not None

    path.write_text(f"{line7('alice', 'three')}\nbroken line\n")
    with pytest.raises(ValueError, match=f"{path}:2"):
        auth.reload()
    path.unlink()
    with pytest.raises(ValueError, match=str(path)):
        auth.reload()
    await assert_allows(auth, "alice", b"two")
    assert auth.scram_credentials is credentials


async def test_scram_only_user_logs_in_with_plain_password(
        tmp_path: Path, opened: list[PasswordFileAuthenticator]) -> None:
    path = tmp_path / "pw"
    path.write_text(credential_line("carol", UNICODE_PASSWORD) + "\n")
    auth = open_auth(opened, [path])
    await assert_allows(auth, "carol", UNICODE_PASSWORD.encode())
    # SASLprep normalises, so the decomposed spelling of the same password is the same password.
    await assert_allows(auth, "carol", unicodedata.normalize("NFD", UNICODE_PASSWORD).encode())
    await assert_denies(auth, "carol", b"p\xe4ssw\xf6rd")  # Latin-1, not UTF-8
    await assert_denies(auth, "carol", b"bad\x07")  # SASLprep refuses control characters
    await assert_denies(auth, "carol", None)


async def test_unknown_user_costs_the_same_hash_work(
        tmp_path: Path, opened: list[PasswordFileAuthenticator]) -> None:
    path = tmp_path / "pw"
    path.write_text(f"{line7('alice', 'a')}\n{line7('bob', 'b')}\n")
    auth = open_auth(opened, [path], inline_iterations=0)
    before = auth.offloaded
    await assert_allows(auth, "alice", b"a")
    assert auth.offloaded == before + 1
    assert (await check(auth, "mallory", b"a")).outcome is Outcome.IGNORE
    assert auth.offloaded == before + 2  # the decoy ran on the pool like the real check
    assert pwhash_threads()

    scram_only = tmp_path / "scram"
    scram_only.write_text(credential_line("carol", "c") + "\n")
    auth = open_auth(opened, [scram_only])
    assert (await check(auth, "mallory", b"c")).outcome is Outcome.IGNORE
    assert auth.offloaded == 1

    sha512 = tmp_path / "sha512"
    sha512.write_text(f"dave:{mosquitto_hash('d', HashKind.SHA512)}\n")
    auth = open_auth(opened, [sha512])
    await assert_allows(auth, "dave", b"d")
    assert (await check(auth, "mallory", b"d")).outcome is Outcome.IGNORE
    assert auth.offloaded == 0  # one SHA-512 runs inline, for the real user and the decoy alike

    auth = open_auth(opened, [path])  # Mosquitto's 101 iterations: cheaper inline than a thread hop
    await assert_allows(auth, "alice", b"a")
    assert (await check(auth, "mallory", b"a")).outcome is Outcome.IGNORE
    assert auth.offloaded == 0


async def test_backlog_limit_and_close(tmp_path: Path, opened: list[PasswordFileAuthenticator]) -> None:
    path = tmp_path / "pw"
    path.write_text(line7("alice", "a") + "\n")
    auth = open_auth(opened, [path], hash_threads=1, max_pending=1, inline_iterations=0)
    first, second = await asyncio.gather(check(auth, "alice", b"a"), check(auth, "mallory", b"a"))
    assert first.outcome is Outcome.ALLOW
    assert (second.outcome, second.failure) == (Outcome.DENY, Failure.UNAVAILABLE)
    await auth.close()
    assert not pwhash_threads()
    closed = await check(auth, "alice", b"a")
    assert (closed.outcome, closed.failure) == (Outcome.DENY, Failure.UNAVAILABLE)
    with pytest.raises(ValueError):
        PasswordFileAuthenticator([path], hash_threads=0)


async def test_passwd_update_delete_and_prompts(tmp_path: Path, opened: list[PasswordFileAuthenticator]) -> None:
    path = tmp_path / "pw"
    path.write_text(f"# managed by hand\n{line7('bob', 'b')}\n")
    path.chmod(0o640)
    prompted = passwd_cli(path, "alice", stdin=f"{UNICODE_PASSWORD}\n{UNICODE_PASSWORD}\n")
    assert prompted.exit_code == 0, prompted.stderr
    assert "Password: " in prompted.stdout and "Reenter password: " in prompted.stdout
    assert UNICODE_PASSWORD not in prompted.stdout + prompted.stderr
    updated = passwd_cli("-b", path, "bob", "new")
    assert updated.exit_code == 0, updated.stderr
    text = path.read_text()
    assert text.startswith("# managed by hand\nbob:$7$")
    assert [line.split(":")[0] for line in text.splitlines()] == ["# managed by hand", "bob", "bob", "alice",
                                                                   "alice"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o640  # an update keeps the file's mode
    auth = open_auth(opened, [path])
    await assert_allows(auth, "alice", UNICODE_PASSWORD.encode())
    await assert_allows(auth, "bob", b"new")
    await assert_denies(auth, "bob", b"b")

    mismatch = passwd_cli(path, "bob", stdin="one\ntwo\n")
    assert mismatch.exit_code == 2
    assert "Passwords do not match" in mismatch.stderr
    empty = passwd_cli(path, "bob", stdin="\n")
    assert empty.exit_code == 1 and "Empty password" in empty.stderr
    assert path.read_text() == text  # refusals leave the file alone

    deleted = passwd_cli("-D", path, "bob")
    assert deleted.exit_code == 0, deleted.stderr
    assert [line.split(":")[0] for line in path.read_text().splitlines()] == ["# managed by hand", "alice",
                                                                              "alice"]
    missing = passwd_cli("-D", path, "bob")
    assert missing.exit_code == 1 and "User bob not found" in missing.stderr
    auth.reload()
    assert (await check(auth, "bob", b"new")).outcome is Outcome.IGNORE

    refusals: list[list[str | Path]] = [
        ["-c", "-D", path, "bob"], ["-b", path, "bob"], [path, "bob", "pw"], ["-b", path, "a:b", "pw"],
        ["-b", "-H", "md5", path, "bob", "pw"], ["-b", tmp_path / "absent", "bob", "pw"]]
    for args in refusals:
        refused = passwd_cli(*args)
        assert refused.exit_code == 1, (args, refused.stdout, refused.stderr)
        assert refused.stderr.startswith("Error: ")
    no_scram = passwd_cli("-c", "-b", "--no-scram", "-H", "sha512", tmp_path / "plain", "eve", "e")
    assert no_scram.exit_code == 0, no_scram.stderr
    assert [line[:7] for line in (tmp_path / "plain").read_text().splitlines()] == ["eve:$6$"]
    assert not [name for name in os.listdir(tmp_path) if name.endswith(".tmp")]  # no temp files left
