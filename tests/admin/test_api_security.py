"""The admin API of dynamic security (`/api/v1/security`) on a real node: clients and roles made, listed and deleted,
role ACLs added and removed, a raw Mosquitto request; Mosquitto's errors as HTTP statuses; no password or hash ever
answered; nothing without the token."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import Gateway
from tests.integration.test_dynsec import DYNSEC_ENV


@pytest.fixture
def dynsec_node(tmp_path: Path) -> Iterator[Gateway]:
    with Gateway(tmp_path / "gw", admin=True, env=DYNSEC_ENV) as gw:
        yield gw


def _api(gw: Gateway, method: str, path: str, body: object = None, **params: str) -> httpx.Response:
    return httpx.request(method, f"http://127.0.0.1:{gw.admin_port}/api/v1/security{path}", json=body, params=params,
                         headers={"Authorization": f"Bearer {gw.api_token}"}, timeout=10)


def test_security_api_answers_statuses_and_never_a_password(dynsec_node: Gateway) -> None:
    node = dynsec_node
    assert _api(node, "POST", "/roles", {"rolename": "r", "acls": [
        {"acltype": "publishClientSend", "topic": "t/#", "allow": True}]}).status_code == 201
    assert _api(node, "POST", "/roles", {"rolename": "r"}).status_code == 409
    made = _api(node, "POST", "/clients", {"username": "u", "password": "pw-u", "roles": [{"rolename": "r"}]})
    assert made.status_code == 201
    assert _api(node, "POST", "/clients", {"username": "v", "roles": [{"rolename": "nope"}]}).status_code == 404
    listed = _api(node, "GET", "/clients")
    assert [c["username"] for c in listed.json()["data"]] == ["admin", "u"]
    assert "pw-u" not in listed.text and "$7$" not in listed.text
    assert _api(node, "POST", "/roles/r/acls", {"acltype": "bogus", "topic": "x"}).status_code == 400
    assert _api(node, "DELETE", "/roles/r/acls", acltype="publishClientSend", topic="t/#").status_code == 204
    assert _api(node, "DELETE", "/roles/r/acls", acltype="publishClientSend", topic="t/#").status_code == 404
    raw = _api(node, "POST", "/commands", {"commands": [{"command": "getClient", "username": "u"}]}).json()
    assert raw["responses"][0]["data"]["client"]["roles"] == [{"rolename": "r"}]
    assert _api(node, "DELETE", "/clients/u").status_code == 204
    assert _api(node, "DELETE", "/clients/u").status_code == 404
    unauthorized = httpx.get(f"http://127.0.0.1:{node.admin_port}/api/v1/security/clients", timeout=10)
    assert unauthorized.status_code == 401
