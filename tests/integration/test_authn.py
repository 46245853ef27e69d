"""Password-file authentication end to end: CONNACK codes, claimed user names, anonymous access, SIGHUP reload.

Password files are made with the real `mosquitto_passwd`; the attack on claimed user names is reproduced with
the real `mosquitto_sub`/`mosquitto_pub`. CONNACK codes are read off the wire with a hand-built CONNECT.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.integration.conftest import (
    TARGET,
    GatewayFactory,
    PahoFactory,
    delete_password_user,
    write_password_file,
)
from tests.integration.rawconnect import raw_connect
from tests.waiting import wait_until

USERS = {"alice": "alice-secret", "bob": "bob-secret"}


def bad_credentials(version: int) -> int:
    """Wrong password or unknown user. Mosquitto 2.0.11 answers "not authorized" (5 / 0x87) here; Tidewire
    answers "bad user name or password" (4 / 0x86) as the spec intends."""
    if TARGET == "mosquitto":
        return not_authorized(version)
    return 4 if version == 4 else 0x86


def not_authorized(version: int) -> int:
    """No credentials while anonymous access is off."""
    return 5 if version == 4 else 0x87


def mosquitto_client(tool: str, port: int, *args: str, timeout: float = 10.0) -> subprocess.CompletedProcess[str]:
    cmd = [f"/usr/bin/mosquitto_{tool}", "-h", "127.0.0.1", "-p", str(port), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def passwords(tmp_path: Path) -> Path:
    return write_password_file(tmp_path / "passwd", USERS)


# -- CONNACK codes --------------------------------------------------------------------------------------

def test_wrong_password_is_refused_and_closed(gateway_factory: GatewayFactory, passwords: Path) -> None:
    gw = gateway_factory(password_file=passwords)
    for version in (4, 5):
        res = raw_connect(gw.port, version, f"wrong-pw-{version}", "alice", "not-alice-secret")
        assert res.code == bad_credentials(version), (version, res)
        assert res.closed, "the server must close the connection after a refused CONNACK"
        assert raw_connect(gw.port, version, f"right-pw-{version}", "alice", USERS["alice"]).code == 0  # control


def test_unknown_user_is_refused_like_a_wrong_password(gateway_factory: GatewayFactory, passwords: Path) -> None:
    gw = gateway_factory(password_file=passwords)
    for version in (4, 5):
        unknown = raw_connect(gw.port, version, "unknown", "mallory", "alice-secret")
        wrong = raw_connect(gw.port, version, "wrong", "alice", "mallory-guess")
        assert unknown.code == wrong.code == bad_credentials(version), (version, unknown, wrong)
        assert unknown.closed and wrong.closed


def test_no_credentials_refused_when_anonymous_is_off(gateway_factory: GatewayFactory, passwords: Path) -> None:
    default = gateway_factory(password_file=passwords)  # anonymous off by default once a password file is set
    explicit = gateway_factory(password_file=passwords, allow_anonymous=False)
    for gw in (default, explicit):
        for version in (4, 5):
            res = raw_connect(gw.port, version, f"anon-{version}")
            assert res.code == not_authorized(version), (version, res)
            assert res.closed


@pytest.mark.parametrize("version", [4, 5])
def test_right_password_with_paho(gateway_factory: GatewayFactory, paho_factory: PahoFactory, passwords: Path,
                                  version: int) -> None:
    gw = gateway_factory(password_file=passwords)
    alice = paho_factory(gw.port, f"alice-{version}", version=version, username="alice", password=USERS["alice"])
    alice.connect()
    bob = paho_factory(gw.port, f"bob-{version}", version=version, username="bob", password=USERS["bob"])
    bob.connect()
    assert bob.subscribe("room/#", 1) == [1]
    alice.publish("room/1", b"hello bob", qos=1)
    m = bob.get()
    assert (m.topic, m.payload) == ("room/1", b"hello bob")
    wrong = paho_factory(gw.port, f"bob-wrong-{version}", version=version, username="bob", password="alice-secret")
    # paho reports a 3.1.1 return code as the equivalent 5.0 reason code
    assert wrong.connect(check=False).reason_code == bad_credentials(5)


def test_anonymous_allowed_does_not_downgrade_a_failed_login(gateway_factory: GatewayFactory,
                                                             passwords: Path) -> None:
    gw = gateway_factory(password_file=passwords, allow_anonymous=True)
    for version in (4, 5):
        assert raw_connect(gw.port, version, "anon").code == 0
        for user, password in (("alice", "wrong"), ("mallory", "anything")):
            res = raw_connect(gw.port, version, f"claim-{user}", user, password)
            assert res.code == bad_credentials(version), (version, user, res)
            assert res.closed
        no_password = raw_connect(gw.port, version, "claim-nopw", "alice")
        assert no_password.code in (bad_credentials(version), not_authorized(version)), no_password


# -- the original hole: a claimed user name must never carry that user's grants -------------------------

ALICE_ONLY_ACL = """\
user alice
topic readwrite private/#
"""


@pytest.mark.parametrize("anonymous", [True, False], ids=["anonymous-on", "anonymous-off"])
def test_claimed_user_name_gets_no_grants(gateway_factory: GatewayFactory, passwords: Path,
                                          anonymous: bool) -> None:
    gw = gateway_factory(acl_text=ALICE_ONLY_ACL, password_file=passwords, allow_anonymous=anonymous)
    published = mosquitto_client("pub", gw.port, "-u", "alice", "-P", USERS["alice"], "-t", "private/diary",
                                 "-m", "dear diary", "-r", "-q", "1")
    assert published.returncode == 0, published.stderr
    for claim in (["-u", "alice", "-P", "wrong"], ["-u", "alice"]):
        attacker = mosquitto_client("sub", gw.port, *claim, "-t", "private/#", "-C", "1", "-W", "2", "-v")
        assert "dear diary" not in attacker.stdout, f"{claim} read alice's message"
        assert attacker.returncode != 0, (claim, attacker.stdout, attacker.stderr)
    # Control: the same command with alice's password does get it, so the attempts above could have.
    owner = mosquitto_client("sub", gw.port, "-u", "alice", "-P", USERS["alice"], "-t", "private/#", "-C", "1",
                             "-W", "3", "-v")
    assert owner.stdout.strip() == "private/diary dear diary", (owner.stdout, owner.stderr)


# -- SIGHUP reload ------------------------------------------------------------------------------------

def test_sighup_reloads_password_file(gateway_factory: GatewayFactory, paho_factory: PahoFactory,
                                      passwords: Path) -> None:
    gw = gateway_factory(password_file=passwords)
    bob = paho_factory(gw.port, "bob-stays", version=5, username="bob", password=USERS["bob"])
    bob.connect()
    assert bob.subscribe("news/#", 1) == [1]
    assert raw_connect(gw.port, 5, "carol-early", "carol", "carol-secret").code == bad_credentials(5)

    write_password_file(passwords, {"carol": "carol-secret"}, create=False)
    delete_password_user(passwords, "alice")
    gw.reload()
    wait_until(lambda: raw_connect(gw.port, 5, "carol-new", "carol", "carol-secret").code == 0,
               what="carol (added) accepted after SIGHUP")
    wait_until(lambda: raw_connect(gw.port, 5, "alice-gone", "alice", USERS["alice"]).code == bad_credentials(5),
               what="alice (removed) refused after SIGHUP")
    assert raw_connect(gw.port, 4, "alice-gone4", "alice", USERS["alice"]).code == bad_credentials(4)

    carol = paho_factory(gw.port, "carol-pub", version=5, username="carol", password="carol-secret")
    carol.connect()
    carol.publish("news/1", b"after reload", qos=1)
    assert bob.get().payload == b"after reload"
    assert bob.disconnects.empty(), "a reload must not drop a client whose credentials still hold"


RELOAD_ACL = """\
user bob
topic read news/#
user carol
topic write #
"""


def test_sighup_reloads_acl_file(gateway_factory: GatewayFactory, paho_factory: PahoFactory,
                                 tmp_path: Path) -> None:
    pw = write_password_file(tmp_path / "passwd", {"bob": "bob-secret", "carol": "carol-secret"})
    gw = gateway_factory(acl_text=RELOAD_ACL, password_file=pw)
    bob = paho_factory(gw.port, "bob-reader", version=5, username="bob", password="bob-secret")
    bob.connect()
    bob.subscribe([("news/#", 1), ("extra/#", 1)])  # extra: refused (Tidewire) or filtered (Mosquitto)
    carol = paho_factory(gw.port, "carol-writer", version=5, username="carol", password="carol-secret")
    carol.connect()
    carol.publish("extra/before", b"no", qos=1)
    bob.assert_nothing(0.3)

    assert gw.acl_file is not None
    gw.acl_file.write_text(RELOAD_ACL.replace("topic read news/#", "topic read news/#\ntopic read extra/#"))
    gw.reload()

    def extra_delivered() -> bool:
        bob.subscribe("extra/#", 1)
        carol.publish("extra/after", b"yes", qos=1)
        try:
            return bob.get(0.2).payload == b"yes"
        except AssertionError:
            return False

    wait_until(extra_delivered, what="ACL grant added by SIGHUP")
    carol.publish("news/still", b"still here", qos=1)
    got = [m.payload for m in bob.expect(1)]
    while not bob.messages.empty():  # late copies of the polling publishes
        got.append(bob.get(0.1).payload)
    assert b"still here" in got
    assert bob.disconnects.empty()
