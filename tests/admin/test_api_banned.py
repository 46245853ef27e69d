"""`/api/v1/banned` on a real node's admin port (httpx): the token is required, bans are listed (paged), added,
replaced and lifted, bad requests are 400/422 with an `{"error"}` body; and on a two-node cluster over one Redis,
a ban made through one node refuses and kicks clients of the other at its next refresh."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import Gateway, PahoClient, free_port
from tests.store import redis_server

BANNED_5 = 0x8A
ADMINISTRATIVE_ACTION = 0x98
REFRESH = 0.3  # s: the cluster nodes' ban_refresh_interval


def client(gw: Gateway, token: str | None = None) -> httpx.Client:
    headers = {} if token == "" else {"Authorization": f"Bearer {token or gw.api_token}"}
    return httpx.Client(base_url=f"http://127.0.0.1:{gw.admin_port}", headers=headers, timeout=5.0)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with Gateway(tmp_path_factory.mktemp("api-banned"), admin=True) as gw:
        yield gw


@pytest.fixture
def api(node: Gateway) -> Iterator[httpx.Client]:
    with client(node) as c:
        yield c
        for ban in c.get("/api/v1/banned", params={"limit": 1000}).json()["data"]:
            assert c.delete(f"/api/v1/banned/{ban['as']}/{ban['who']}").status_code == 204


def test_every_route_wants_the_token(node: Gateway, api: httpx.Client) -> None:
    assert api.post("/api/v1/banned", json={"as": "clientid", "who": "x"}).status_code == 201
    for token in ("", "wrong-token"):
        with client(node, token) as c:
            for method, path, body in (("GET", "/api/v1/banned", None),
                                       ("POST", "/api/v1/banned", {"as": "clientid", "who": "y"}),
                                       ("DELETE", "/api/v1/banned/clientid/x", None)):
                r = c.request(method, path, json=body)
                assert r.status_code == 401, (method, token, r.text)
                assert r.json() == {"error": "unauthorized"} and r.headers["www-authenticate"] == "Bearer"
    # Nothing was changed by the refused calls.
    assert [b["who"] for b in api.get("/api/v1/banned").json()["data"]] == ["x"]


def test_add_list_replace_and_lift(api: httpx.Client) -> None:
    before = time.time()
    r = api.post("/api/v1/banned", json={"as": "clientid", "who": "dev-9", "reason": "abuse"})
    assert r.status_code == 201
    made = r.json()
    assert made["as"] == "clientid" and made["who"] == "dev-9" and made["reason"] == "abuse"
    assert made["until"] is None and before - 1 <= made["at"] <= time.time() + 1 and made["kicked"] == 0
    until = time.time() + 3600
    assert api.post("/api/v1/banned", json={"as": "username", "who": "eve", "until": until}).status_code == 201
    assert api.post("/api/v1/banned", json={"as": "peerhost", "who": "192.0.2.0/24"}).status_code == 201
    assert api.post("/api/v1/banned", json={"as": "peerhost", "who": "2001:db8::/32", "duration": 60}).status_code \
        == 201
    listed = api.get("/api/v1/banned").json()
    assert listed["meta"] == {"page": 1, "limit": 100, "count": 4}
    assert [(b["as"], b["who"]) for b in listed["data"]] == [
        ("clientid", "dev-9"), ("peerhost", "192.0.2.0/24"), ("peerhost", "2001:db8::/32"), ("username", "eve")]
    assert next(b for b in listed["data"] if b["who"] == "eve")["until"] == pytest.approx(until)
    page = api.get("/api/v1/banned", params={"page": 2, "limit": 1}).json()
    assert page["meta"] == {"page": 2, "limit": 1, "count": 4} and page["data"][0]["who"] == "192.0.2.0/24"
    # The same kind and who replaces.
    assert api.post("/api/v1/banned", json={"as": "clientid", "who": "dev-9", "reason": "again"}).status_code == 201
    listed = api.get("/api/v1/banned").json()
    assert listed["meta"]["count"] == 4 and listed["data"][0]["reason"] == "again"
    # Lift: a network's '/' raw or percent-encoded, and an address in any spelling of it.
    assert api.delete("/api/v1/banned/peerhost/192.0.2.0/24").status_code == 204
    assert api.delete("/api/v1/banned/peerhost/2001%3Adb8%3A%3A%2F32").status_code == 204
    assert api.delete("/api/v1/banned/clientid/dev-9").status_code == 204
    r = api.delete("/api/v1/banned/clientid/dev-9")
    assert r.status_code == 404 and r.json() == {"error": "no such ban"}
    assert [b["who"] for b in api.get("/api/v1/banned").json()["data"]] == ["eve"]


@pytest.mark.parametrize(("body", "status"), [
    ({"as": "ip", "who": "x"}, 400),
    ({"as": "peerhost", "who": "10.0.0.0/40"}, 400),
    ({"as": "peerhost", "who": "example.com"}, 400),
    ({"as": "clientid", "who": "x", "until": 1_000_000}, 400),  # in the past
    ({"as": "clientid", "who": "x", "until": time.time() + 60, "duration": 5}, 400),
    ({"as": "clientid", "who": ""}, 422),
    ({"as": "clientid"}, 422),
    ({"as": "clientid", "who": "x", "duration": -1}, 422),
    ({"as": "clientid", "who": "x", "colour": "red"}, 422),
    ({"as": "clientid", "who": "x" * 2000}, 422),
])
def test_bad_requests_are_refused_with_an_error(api: httpx.Client, body: dict[str, object], status: int) -> None:
    r = api.post("/api/v1/banned", json=body)
    assert r.status_code == status, r.text
    assert isinstance(r.json()["error"], str) and r.json()["error"]
    assert api.get("/api/v1/banned").json()["meta"]["count"] == 0


def test_unknown_kind_in_a_delete_is_400(api: httpx.Client) -> None:
    r = api.delete("/api/v1/banned/ip/10.0.0.1")
    assert r.status_code == 400 and "error" in r.json()


# --- two nodes on one Redis: a ban is cluster-wide ------------------------------------------------------------


@pytest.fixture
def two_nodes(tmp_path: Path) -> Iterator[list[Gateway]]:
    if not redis_server.available():
        pytest.skip("redis-server is not installed")
    redis = redis_server.RedisServer(tmp_path / "redis")
    redis.start()
    nodes: list[Gateway] = []
    try:
        for i in (1, 2):
            env = {"TIDEWIRE_NODE_ID": f"n{i}", "TIDEWIRE_CLUSTER_PORT": str(free_port()),
                   "TIDEWIRE_CLUSTER_SECRET": "s" * 32, "TIDEWIRE_BAN_REFRESH_INTERVAL": str(REFRESH)}
            gw = Gateway(tmp_path / f"n{i}", env=env, admin=True, extra_args=["--store", redis.url])
            nodes.append(gw)
            gw.start()
        yield nodes
    finally:
        for gw in nodes:
            gw.close()
        redis.stop()


@pytest.mark.slow  # several seconds (a real node, a build or a long model run): make test-slow
def test_a_ban_made_on_one_node_applies_on_the_other(two_nodes: list[Gateway]) -> None:
    n1, n2 = two_nodes
    online = PahoClient(n2.port, "roamer", 5)
    later = PahoClient(n2.port, "roamer", 5)
    back = PahoClient(n1.port, "roamer", 5)
    try:
        online.connect()
        with client(n1) as api:
            made = api.post("/api/v1/banned", json={"as": "clientid", "who": "roamer"})
            assert made.status_code == 201 and made.json()["kicked"] == 0  # not on n1
        assert online.wait_disconnect(timeout=REFRESH * 10) == ADMINISTRATIVE_ACTION  # n2's refresh kicked it
        assert later.connect(check=False).reason_code == BANNED_5
        with client(n2) as api:
            assert [b["who"] for b in api.get("/api/v1/banned").json()["data"]] == ["roamer"]
            assert api.delete("/api/v1/banned/clientid/roamer").status_code == 204
        # Lifted through n2: n1 lets the client in again (a listing re-reads the store at once).
        with client(n1) as api:
            assert api.get("/api/v1/banned").json()["meta"]["count"] == 0
        back.connect()
    finally:
        for c in (online, later, back):
            c.close()
