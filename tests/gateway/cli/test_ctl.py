"""`tidewire ctl` as an operator runs it (subprocesses: `python -m tidewire ctl ...`, or its Typer app alone)
against a real node's admin API, with real paho clients on the MQTT side: status, clients, kick, publish, retained
messages, bans, the token from the environment or a file, and the exit codes of a refused token (1) and an
unreachable node (2)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.conftest import Gateway, PahoClient, free_port
from tests.waiting import wait_until

RUN_TIMEOUT = 20.0  # s per ctl invocation
MQTT5_ADMINISTRATIVE_ACTION = 0x98
MQTT5_BANNED = 0x8A
CTL_ENV = ("TIDEWIRE_API_TOKEN", "TIDEWIRE_API_TOKEN_FILE", "TIDEWIRE_ADMIN_URL", "TIDEWIRE_DATA_DIR")


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with Gateway(tmp_path_factory.mktemp("ctl"), admin=True) as gw:
        yield gw


@pytest.fixture
def mqtt(node: Gateway) -> Iterator[Callable[..., PahoClient]]:
    """`mqtt(client_id, connect=True)` -> an MQTT 5 paho client of `node` (closed at teardown)."""
    made: list[PahoClient] = []

    def make(client_id: str, connect: bool = True) -> PahoClient:
        c = PahoClient(node.port, client_id)
        made.append(c)
        if connect:
            c.connect()
        return c

    yield make
    for c in made:
        c.close()


# `python -m tidewire ctl` as installed (the cli registers ctl_app); most tests start the same Typer app without
# importing every other subcommand's modules, which halves each command's start time.
FULL_CLI = [sys.executable, "-m", "tidewire", "ctl"]
CTL_ONLY = [sys.executable, "-c",
            "import sys; from tidewire.gateway.cli.ctl import ctl_app; sys.argv[0] = 'ctl'; ctl_app()"]
REPO = Path(__file__).resolve().parents[3]


def ctl(*args: str, url: str | None = None, token: str | None = None, cwd: Path | None = None,
        extra_env: dict[str, str] | None = None, full: bool = False) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in CTL_ENV}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)  # for any `cwd`
    if token is not None:
        env["TIDEWIRE_API_TOKEN"] = token
    env.update(extra_env or {})
    cmd = [*(FULL_CLI if full else CTL_ONLY), *(["--url", url] if url else []), *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=RUN_TIMEOUT)


def run_ok(node: Gateway, *args: str, full: bool = False) -> str:
    """Run ctl against `node` with its token; it must succeed without ever printing the token."""
    res = ctl(*args, url=f"http://127.0.0.1:{node.admin_port}", token=node.api_token, full=full)
    assert res.returncode == 0, f"ctl {args}: exit {res.returncode}\n{res.stdout}\n{res.stderr}"
    assert node.api_token not in res.stdout + res.stderr
    return res.stdout


def run_fail(node: Gateway, *args: str) -> subprocess.CompletedProcess[str]:
    return ctl(*args, url=f"http://127.0.0.1:{node.admin_port}", token=node.api_token)


def api_status(node: Gateway) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {node.api_token}"}
    answer = httpx.get(f"http://127.0.0.1:{node.admin_port}/api/v1/status", headers=headers, timeout=10.0)
    answer.raise_for_status()
    status: dict[str, Any] = answer.json()
    return status


def test_status_human_and_json(node: Gateway, mqtt: Callable[..., PahoClient]) -> None:
    # The node is shared by the module: once the clients of earlier tests are gone, the count is this test's own.
    wait_until(lambda: api_status(node)["connections"] == 0, what="no client of an earlier test still connected")
    mqtt("ctl-status-1")
    mqtt("ctl-status-2")
    human = run_ok(node, "status", full=True)
    lines = dict(line.split(None, 1) for line in human.splitlines() if line and not line.startswith(" "))
    assert lines["node"] == "node1" and lines["draining"] == "no" and lines["cluster"] == "no"
    assert int(lines["connections"]) == 2 and int(lines["sessions_online"]) == 2
    status = json.loads(run_ok(node, "status", "--json"))  # --json after the command works too
    assert status["node_id"] == "node1" and status["draining"] is False and status["cluster"] is None
    assert status["connections"] == 2


@pytest.mark.slow  # several seconds (a real node, a build or a long model run): make test-slow
def test_clients_lists_and_kick_disconnects(node: Gateway, mqtt: Callable[..., PahoClient]) -> None:
    client = mqtt("ctl-kick-me")
    table = run_ok(node, "clients", "--client-id", "kick-me").splitlines()
    assert table[0].split()[:3] == ["CLIENT_ID", "USERNAME", "PEER"]
    assert table[1].split()[0] == "ctl-kick-me" and table[-1] == "1 client"
    listed = json.loads(run_ok(node, "--json", "clients", "--client-id", "kick-me", "--limit", "5"))
    assert [c["client_id"] for c in listed["data"]] == ["ctl-kick-me"] and listed["meta"]["limit"] == 5

    assert run_ok(node, "kick", "ctl-kick-me").strip() == "kicked ctl-kick-me"
    assert client.wait_disconnect(timeout=5) == MQTT5_ADMINISTRATIVE_ACTION
    again = run_fail(node, "kick", "ctl-kick-me")
    assert again.returncode == 1 and "HTTP 404" in again.stderr


def test_publish_reaches_a_subscriber(node: Gateway, mqtt: Callable[..., PahoClient]) -> None:
    sub = mqtt("ctl-sub")
    assert sub.subscribe("ctl/pub/#", qos=1) == [1]
    assert "published 5 bytes to ctl/pub/x (qos 1)" in run_ok(node, "publish", "ctl/pub/x", "hello", "--qos", "1")
    msg = sub.get(timeout=5)
    assert (msg.topic, msg.payload, msg.qos) == ("ctl/pub/x", b"hello", 1)
    bad = run_fail(node, "publish", "ctl/+/x", "nope")
    assert bad.returncode == 1 and "HTTP 400" in bad.stderr


@pytest.mark.slow  # seconds long: `make test-slow` keeps `make test` under its 10 minutes
def test_retained_list_get_delete(node: Gateway) -> None:
    run_ok(node, "publish", "ctl/ret/a", "first", "--qos", "1", "--retain")
    listing = run_ok(node, "retained", "list", "ctl/ret/#").splitlines()
    assert listing[0].split() == ["TOPIC", "QOS", "BYTES"]
    assert listing[1].split() == ["ctl/ret/a", "1", "5"] and listing[2] == "1 retained message"

    one = json.loads(run_ok(node, "--json", "retained", "get", "ctl/ret/a"))
    assert one["topic"] == "ctl/ret/a" and base64.b64decode(one["payload"]) == b"first"
    assert "payload  first" in run_ok(node, "retained", "get", "ctl/ret/a")

    assert "deleted" in run_ok(node, "retained", "delete", "ctl/ret/a")
    assert "ctl/ret/a" not in run_ok(node, "retained")  # no subcommand: every retained message
    gone = run_fail(node, "retained", "get", "ctl/ret/a")
    assert gone.returncode == 1 and "HTTP 404" in gone.stderr


@pytest.mark.slow  # seconds long: `make test-slow` keeps `make test` under its 10 minutes
def test_ban_refuses_then_unban_admits(node: Gateway, mqtt: Callable[..., PahoClient]) -> None:
    online = mqtt("ctl-banned")
    out = run_ok(node, "ban", "clientid", "ctl-banned", "--reason", "ops test", "--duration", "600")
    assert out.startswith("banned clientid ctl-banned until ") and "(kicked 1 online)" in out
    online.wait_disconnect(timeout=5)
    refused = mqtt("ctl-banned", connect=False).connect(check=False)
    assert refused.reason_code == MQTT5_BANNED
    run_ok(node, "ban", "peerhost", "192.0.2.0/24")  # TEST-NET-1: no client here comes from it

    bans = [line.split(None, 2) for line in run_ok(node, "bans").splitlines()]
    assert bans[0][:2] == ["AS", "WHO"]
    assert any(b[:2] == ["clientid", "ctl-banned"] and "ops test" in b[2] for b in bans)
    network = [b[2] for b in bans if b[:2] == ["peerhost", "192.0.2.0/24"]]
    assert len(network) == 1 and network[0].startswith("- ") and network[0].endswith("for ever")  # no reason
    listed = {b["who"]: b for b in json.loads(run_ok(node, "--json", "bans"))["data"]}
    assert listed["ctl-banned"]["as"] == "clientid" and listed["ctl-banned"]["until"] is not None

    assert run_ok(node, "unban", "CLIENTID", "ctl-banned").strip() == "unbanned clientid ctl-banned"
    mqtt("ctl-banned")  # connects again
    run_ok(node, "unban", "peerhost", "192.0.2.0/24")  # a network: its `/` is escaped in the URL
    missing = run_fail(node, "unban", "peerhost", "192.0.2.0/24")
    assert missing.returncode == 1 and "no such ban" in missing.stderr


def test_wrong_token_is_exit_1_unauthorized(node: Gateway) -> None:
    res = ctl("status", url=f"http://127.0.0.1:{node.admin_port}", token="not-the-token", full=True)
    assert res.returncode == 1 and "unauthorized" in res.stderr and res.stdout == ""
    assert "not-the-token" not in res.stdout + res.stderr


def test_unreachable_or_no_token_is_exit_2(node: Gateway, tmp_path: Path) -> None:
    res = ctl("status", url=f"http://127.0.0.1:{free_port()}", token="t", full=True)
    assert res.returncode == 2 and "cannot reach" in res.stderr
    res = ctl("status", url=f"http://127.0.0.1:{node.admin_port}", cwd=tmp_path)  # no token, no ./data/api_token
    assert res.returncode == 2 and "no API token" in res.stderr


def test_token_from_files(node: Gateway, tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{node.admin_port}"
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "api_token").write_text(node.api_token + "\n")  # as the node writes it
    res = ctl("--json", "status", url=url, cwd=tmp_path)  # default: ./data/api_token
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["node_id"] == "node1"
    other = tmp_path / "elsewhere"
    other.write_text(node.api_token)
    res = ctl("status", url=url, cwd=tmp_path / "data", extra_env={"TIDEWIRE_API_TOKEN_FILE": str(other)})
    assert res.returncode == 0 and node.api_token not in res.stdout + res.stderr
    res = ctl("status", "--json", url=url, extra_env={"TIDEWIRE_DATA_DIR": str(tmp_path / "data")})
    assert res.returncode == 0, res.stderr


def test_rules_and_bridges_are_listed(node: Gateway, mqtt: Callable[..., PahoClient]) -> None:
    headers = {"Authorization": f"Bearer {node.api_token}"}
    rule = {"name": "ctl-rule", "sql": 'SELECT payload FROM "ctl/rules/#"',
            "action": {"type": "republish", "topic": "ctl/out/${clientid}"}}
    answer = httpx.put(f"http://127.0.0.1:{node.admin_port}/api/v1/rules/ctl-rule", json=rule, headers=headers,
                       timeout=10.0)
    assert answer.status_code == 200, answer.text
    sub = mqtt("ctl-rules-sub")
    sub.subscribe("ctl/out/#", 1)
    mqtt("ctl-rules-pub").publish("ctl/rules/x", b"hello", qos=1)
    assert sub.get(timeout=5).topic == "ctl/out/ctl-rules-pub"
    wait_until(lambda: json.loads(run_ok(node, "rules", "--json"))["data"][0]["counts"]["sent"] == 1,
               what="the rule's count")
    [line] = run_ok(node, "rules").splitlines()[1:]
    assert line.split()[:7] == ["ctl-rule", "yes", "republish", "1", "1", "0", "0"]
    assert run_ok(node, "bridges").splitlines()[1:] == []  # the header only: no bridge configured
    httpx.delete(f"http://127.0.0.1:{node.admin_port}/api/v1/rules/ctl-rule", headers=headers, timeout=10.0)
