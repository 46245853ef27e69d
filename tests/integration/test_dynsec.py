"""Dynamic security on a running gateway, driven by Mosquitto's own tools: `mosquitto_ctrl dynsec` and JSON commands
sent with `mosquitto_pub`/`mosquitto_sub` create a client and a role; the client then has exactly the granted topics
(paho); a revoked grant stops delivery to it while connected; disabling it disconnects it (0x98); a bad command gets
Mosquitto's error and changes nothing; a client that is no admin is refused; anonymous clients are refused."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import Gateway, GatewayFactory, PahoFactory, write_password_file

pytestmark = [pytest.mark.tidewire_only,
              pytest.mark.skipif(shutil.which("mosquitto_ctrl") is None, reason="no mosquitto_ctrl")]

ADMIN, ADMIN_PW = "admin", "admin-pw"
DYNSEC_ENV = {"TIDEWIRE_DYNSEC_ENABLED": "true", "TIDEWIRE_DYNSEC_ADMIN_USERNAME": ADMIN,
              "TIDEWIRE_DYNSEC_ADMIN_PASSWORD": ADMIN_PW}
CONTROL = "$CONTROL/dynamic-security/v1"


def ctrl(port: int, *args: str, user: str = ADMIN, password: str = ADMIN_PW) -> subprocess.CompletedProcess[str]:
    """`mosquitto_ctrl -h 127.0.0.1 -p PORT -u USER -P PW dynsec ARGS...`"""
    return subprocess.run(["mosquitto_ctrl", "-h", "127.0.0.1", "-p", str(port), "-u", user, "-P", password,
                           "dynsec", *args], capture_output=True, text=True, timeout=20)


def command(port: int, *commands: dict[str, Any], user: str = ADMIN, password: str = ADMIN_PW) -> dict[str, Any]:
    """Send a request with mosquitto_pub and read its answer with mosquitto_sub (subscribed first: its SUBACK is
    awaited in its debug output)."""
    base = ["-h", "127.0.0.1", "-p", str(port), "-u", user, "-P", password]
    # Line-buffered (stdbuf), so its debug lines come as they happen.
    sub = subprocess.Popen(["stdbuf", "-oL", "mosquitto_sub", *base, "-t", CONTROL + "/response", "-C", "1", "-W",
                            "10", "-d"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert sub.stdout is not None
    lines: list[str] = []
    try:
        while "SUBACK" not in (line := sub.stdout.readline()):  # until it is subscribed
            assert line, f"mosquitto_sub was not subscribed: {lines}"
            lines.append(line)
        subprocess.run(["mosquitto_pub", *base, "-q", "1", "-t", CONTROL, "-m",
                        json.dumps({"commands": list(commands)})], check=True, timeout=10)
        while not (line := sub.stdout.readline()).startswith("{"):
            assert line, f"no response: {lines}"
            lines.append(line)
        return json.loads(line)
    finally:
        sub.kill()
        sub.wait()


@pytest.fixture
def dynsec_gateway(gateway_factory: GatewayFactory, tmp_path: Path) -> Gateway:
    """Dynamic security on, and a password file with `plain` (a user with no grants of its own, no ACL file)."""
    passwords = write_password_file(tmp_path / "passwords", {"plain": "plain-pw"})
    return gateway_factory(env=DYNSEC_ENV, password_file=passwords)


def test_mosquitto_tools_make_a_client_that_gets_exactly_its_grants(dynsec_gateway: Gateway,
                                                                     paho_factory: PahoFactory) -> None:
    port = dynsec_gateway.port
    for args in (("createRole", "sensors"), ("createClient", "dev1", "-p", "dev1-pw"),
                 ("addRoleACL", "sensors", "publishClientSend", "data/%c/#", "allow"),
                 ("addRoleACL", "sensors", "subscribePattern", "cmd/%u/#", "allow"),
                 ("addClientRole", "dev1", "sensors", "5"),
                 ("addRoleACL", "admin", "publishClientSend", "#", "allow")):  # the admin feeds the test topics
        done = ctrl(port, *args)
        assert done.returncode == 0 and "Error" not in done.stderr + done.stdout, (args, done)
    listed = ctrl(port, "listClients")
    assert listed.stdout.split() == ["admin", "dev1"]
    # The same over mosquitto_pub/mosquitto_sub, with Mosquitto's JSON: a role and a client in one request.
    answer = command(port, {"command": "createRole", "rolename": "watch", "acls": [
        {"acltype": "subscribeLiteral", "topic": "alerts", "allow": True}]},
        {"command": "addClientRole", "username": "dev1", "rolename": "watch", "correlationData": "x1"},
        {"command": "getClient", "username": "dev1"})
    assert answer["responses"][:2] == [{"command": "createRole"}, {"command": "addClientRole", "correlationData": "x1"}]
    client = answer["responses"][2]["data"]["client"]
    assert client["username"] == "dev1" and {r["rolename"] for r in client["roles"]} == {"sensors", "watch"}
    assert "password" not in json.dumps(answer)

    dev = paho_factory(port, "dev1-id", username="dev1", password="dev1-pw")
    dev.connect()
    assert dev.publish("data/dev1-id/temp", "21", qos=1) == 0
    assert dev.publish("data/other/temp", "21", qos=1) == 0x87  # outside the grant: refused
    assert dev.subscribe([("cmd/dev1/#", 1), ("cmd/other/#", 1), ("alerts", 1), ("elsewhere", 1)]) == [
        1, 0x87, 1, 0x87]
    admin = paho_factory(port, "adm", username=ADMIN, password=ADMIN_PW)
    admin.connect()
    assert admin.publish("alerts", "a1", qos=1) == 0
    assert dev.get().payload == b"a1"
    # A revoked grant stops delivery to the connected client at once.
    assert ctrl(port, "removeClientRole", "dev1", "watch").returncode == 0
    assert admin.publish("alerts", "a2", qos=1) == 0
    assert admin.publish("cmd/dev1/go", "c1", qos=1) == 0  # still granted: it comes, and a2 would have come first
    got = dev.get()
    assert (got.topic, got.payload) == ("cmd/dev1/go", b"c1")
    dev.assert_nothing(0.2)
    # A grant revoked while a persistent session is offline: the subscription is gone when it comes back.
    away = paho_factory(port, "dev1-id", username="dev1", password="dev1-pw", clean=False)
    dev.disconnect()
    away.connect(session_expiry=300)
    assert away.subscribe([("cmd/dev1/#", 1)]) == [1]
    away.disconnect()
    assert ctrl(port, "removeRoleACL", "sensors", "subscribePattern", "cmd/%u/#").returncode == 0
    back = paho_factory(port, "dev1-id", username="dev1", password="dev1-pw", clean=False)
    assert back.connect(session_expiry=300).session_present
    assert admin.publish("cmd/dev1/go", "c2", qos=1) == 0
    back.assert_nothing(0.3)
    assert back.unsubscribe("cmd/dev1/#") == [0x11]  # No subscription existed
    dev = back
    # A bad command: Mosquitto's error, nothing changed.
    bad = command(port, {"command": "addRoleACL", "rolename": "sensors", "acltype": "bogus", "topic": "x"},
                  {"command": "deleteClient", "username": "nobody"})
    assert bad["responses"] == [{"command": "addRoleACL", "error": "Unknown acltype"},
                                {"command": "deleteClient", "error": "Client not found"}]
    # A client without grants on the control topic is refused (PUBACK 0x87) and nothing runs.
    assert dev.publish(CONTROL, json.dumps({"commands": [{"command": "deleteClient", "username": "admin"}]}),
                       qos=1) == 0x87
    assert "admin" in ctrl(port, "listClients").stdout.split()
    # A password-file user (allowed everything else, there being no ACL file) neither commands nor reads answers.
    plain = paho_factory(port, "plain", username="plain", password="plain-pw")
    plain.connect()
    assert plain.subscribe([(CONTROL + "/response", 0), ("$CONTROL/#", 0), ("anything/#", 0)]) == [0x87, 0x87, 0]
    assert plain.publish(CONTROL, json.dumps({"commands": [{"command": "listClients"}]}), qos=1) == 0x87
    assert plain.publish(CONTROL + "/response", '{"responses": []}', qos=1) == 0x87
    # Disabling the client disconnects it (Administrative action) and keeps it out.
    assert ctrl(port, "disableClient", "dev1").returncode == 0
    assert dev.wait_disconnect() == 0x98
    again = paho_factory(port, "dev1-id", username="dev1", password="dev1-pw")
    assert again.connect(check=False).reason_code in (0x86, 0x87)
    anonymous = paho_factory(port, "anon")
    assert anonymous.connect(check=False).reason_code == 0x87


def test_a_dynamic_security_clients_tenant_puts_it_under_its_mount(gateway_factory: GatewayFactory,
                                                                    tmp_path: Path, paho_factory: PahoFactory) -> None:
    """A client record's `tenant` (createClient) is the tenant of the client it authenticates (item 1's "from the
    authenticated user's record"): its topics are under `$tenant/acme/`, which a superuser addresses and a
    default-tenant `#` never sees; its grants (`%c`) still see the topics as the client writes them."""
    passwords = write_password_file(tmp_path / "passwords", {"root": "root-pw"})
    gw = gateway_factory(env={**DYNSEC_ENV, "TIDEWIRE_TENANT_SUPERUSERS": json.dumps(["root"])},
                         password_file=passwords)
    answer = command(gw.port, {"command": "createRole", "rolename": "dev", "acls": [
        {"acltype": "publishClientSend", "topic": "data/%c", "allow": True}]},
        {"command": "createClient", "username": "d1", "password": "d1-pw", "tenant": "acme",
         "roles": [{"rolename": "dev"}]})
    assert answer["responses"] == [{"command": "createRole"}, {"command": "createClient"}]
    root = paho_factory(gw.port, "root", username="root", password="root-pw")
    root.connect()
    assert root.subscribe([("$tenant/acme/#", 1), ("#", 1)]) == [1, 1]
    device = paho_factory(gw.port, "d1-id", username="d1", password="d1-pw")
    device.connect()
    assert device.publish("data/d1-id", "21", qos=1) == 0
    assert device.publish("data/other", "21", qos=1) == 0x87  # the grant is the client's own view
    got = root.get()
    assert (got.topic, got.payload) == ("$tenant/acme/data/d1-id", b"21")
    root.assert_nothing(0.2)  # once: the default tenant's `#` does not see it
