"""Bans end to end: a real gateway process (admin port on, a password file made by `mosquitto_passwd`), bans made
through its admin API, real paho clients (3.1.1 and 5) and hand-built CONNECTs for exact CONNACK bytes.

Covered: a banned client id is refused (5.0 0x8A, 3.1.1 code 5) before authentication; a banned user name only
once its password proved it; a banned network (127.0.0.0/8, and a single address) refuses, a ban on another
network does not; a 1 s ban lapses; a new ban kicks connected clients (5.0 DISCONNECT 0x98); bans survive a
restart. The ban list's own logic (parsing, validation, matching) is checked in-process first, and so is a ban
lapsing on the node's clock, moved by hand.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pika
import pika.exceptions
import pytest

from tests.gateway.fakeclock import FakeClock
from tests.gateway.protocols.mqtt.fakeio import channel, until
from tests.integration.conftest import Gateway, PahoClient, write_password_file
from tests.integration.rawconnect import raw_connect
from tidewire.gateway.node import Node
from tidewire.gateway.ops.bans import _View, new_ban, normalize_who, peer_address
from tidewire.gateway.protocols.mqtt.codec import Connack, Connect, encode
from tidewire.store.base import Ban

BANNED_5 = 0x8A
NOT_AUTHORIZED_311 = 5  # on the wire; paho reports it as 0x87 ("Not authorized")
PAHO_NOT_AUTHORIZED = 0x87
BAD_CREDENTIALS_5 = 0x86
ADMINISTRATIVE_ACTION = 0x98
USERS = {"mallory": "mallory-pw", "alice": "alice-pw"}

# --- the ban list's logic, in-process -------------------------------------------------------------------------


def test_new_ban_validates_and_canonicalizes() -> None:
    now = 1000.0
    assert new_ban("ip", "x", now=now) == "'as' must be one of clientid, username, peerhost"
    assert isinstance(new_ban("clientid", "", now=now), str)
    assert isinstance(new_ban("peerhost", "not-an-address", now=now), str)
    assert isinstance(new_ban("peerhost", "10.0.0.0/33", now=now), str)
    assert new_ban("clientid", "x", until=999.0, now=now) == "'until' is in the past"
    assert isinstance(new_ban("clientid", "x", until=2000.0, duration=5, now=now), str)
    assert isinstance(new_ban("clientid", "x", duration=0, now=now), str)
    assert new_ban("clientid", "x", "why", duration=5, now=now) == Ban("clientid", "x", "why", now, now + 5)
    made = new_ban("peerhost", "10.1.2.3/8", now=now)
    assert isinstance(made, Ban) and made.who == "10.0.0.0/8"  # host bits masked: one canonical form
    assert normalize_who("peerhost", "::ffff:192.0.2.7") == "192.0.2.7"
    assert normalize_who("peerhost", "2001:db8::1/128") == "2001:db8::1"
    assert normalize_who("username", "a/b") == "a/b" and normalize_who("nope", "x") is None


def test_peer_addresses_as_connections_keep_them() -> None:
    assert str(peer_address("127.0.0.1:5555")) == "127.0.0.1"
    assert str(peer_address("::1:5555")) == "::1"  # f"{host}:{port}" of an IPv6 peer
    assert str(peer_address("[2001:db8::2]:1883")) == "2001:db8::2"
    assert str(peer_address("::ffff:10.0.0.9:40000")) == "10.0.0.9"
    assert str(peer_address("ipv4:192.0.2.1:443")) == "192.0.2.1"  # gRPC's form (RocketMQ)
    assert str(peer_address("192.0.2.5")) == "192.0.2.5"
    assert peer_address("/run/mqtt.sock") is None and peer_address("") is None


def test_view_matches_by_kind_network_and_time() -> None:
    now = 1000.0
    view = _View([Ban("clientid", "c1"), Ban("username", "u1", until=2000.0), Ban("clientid", "old", until=999.0),
                  Ban("peerhost", "10.0.0.0/8"), Ban("peerhost", "10.1.0.0/16", "inner"),
                  Ban("peerhost", "192.0.2.7"), Ban("peerhost", "2001:db8::/32")])
    assert view.check("c1", None, None, now) is not None
    assert view.check("u1", None, None, now) is None  # a user name is not a client id
    assert view.check(None, "u1", None, now) is not None and view.check(None, "u1", None, 2000.0) is None
    assert view.check("old", None, None, now) is None  # lapsed: not applied, whatever the store still holds
    hit = view.check(None, None, "10.1.200.3:1", now)
    assert hit is not None and hit.reason == "inner"  # the longest prefix is tried first
    assert view.check(None, None, "10.200.0.1:1", now) is not None
    assert view.check(None, None, "11.0.0.1:1", now) is None
    assert view.check(None, None, "192.0.2.7:9", now) is not None and view.check(None, None, "192.0.2.8:9", now) is None
    assert view.check(None, None, "2001:db8:5::1:9", now) is not None
    assert view.check(None, None, "2001:db9::1:9", now) is None
    assert view.check("c2", "u2", "127.0.0.1:1", now) is None and _View([]).empty


async def _connect(node: Node, clock: FakeClock, client_id: str) -> Connack:
    conn, io = channel(node, clock)
    conn.receive(encode(Connect(client_id, protocol_level=5), 5))
    await until(lambda: bool(io.out), "the CONNACK")
    [ack] = io.packets()
    assert isinstance(ack, Connack)
    if ack.reason_code == 0:
        conn.connection_lost("done")
    return ack


async def test_a_ban_lapses_on_the_node_clock(clocked_node: Node, clock: FakeClock) -> None:
    """A 30 s ban, on a clock moved by hand: refused (CONNACK 0x8A) until its end, admitted from then on, and the
    next refresh deletes it from the store. No sleep."""
    node = clocked_node
    ban = new_ban("clientid", "mallory", "spam", duration=30, now=clock.time())
    assert isinstance(ban, Ban) and ban.until == clock.time() + 30
    await node.bans.add(ban)
    assert (await _connect(node, clock, "mallory")).reason_code == BANNED_5
    assert (await _connect(node, clock, "alice")).reason_code == 0
    clock.advance(29.9)
    assert (await _connect(node, clock, "mallory")).reason_code == BANNED_5
    assert node.bans.current() == [ban]
    clock.advance(0.1)
    assert node.bans.current() == []  # lapsed at once, before any refresh
    assert (await _connect(node, clock, "mallory")).reason_code == 0
    assert [b.who for b in await node.store.get_bans()] == ["mallory"]
    await node.bans.refresh()
    assert await node.store.get_bans() == []

# --- a real node -------------------------------------------------------------------------------------------------


class Api:
    def __init__(self, gw: Gateway) -> None:
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{gw.admin_port}",
                                 headers={"Authorization": f"Bearer {gw.api_token}"}, timeout=5.0)

    def ban(self, kind: str, who: str, **extra: Any) -> dict[str, Any]:
        r = self.http.post("/api/v1/banned", json={"as": kind, "who": who, **extra})
        assert r.status_code == 201, r.text
        body: dict[str, Any] = r.json()
        return body

    def unban(self, kind: str, who: str) -> None:
        r = self.http.delete(f"/api/v1/banned/{kind}/{who}")
        assert r.status_code == 204, r.text


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    work = tmp_path_factory.mktemp("bans")
    passwords = write_password_file(work / "passwd", USERS)
    with Gateway(work / "gw", password_file=passwords, allow_anonymous=True, admin=True, amqp=True) as gw:
        yield gw


@pytest.fixture
def api(node: Gateway) -> Iterator[Api]:
    a = Api(node)
    yield a
    for ban in a.http.get("/api/v1/banned", params={"limit": 1000}).json()["data"]:  # every test starts unbanned
        a.unban(ban["as"], ban["who"])
    a.http.close()


@pytest.fixture
def clients(node: Gateway) -> Iterator[list[PahoClient]]:
    made: list[PahoClient] = []
    yield made
    for c in made:
        c.close()


def paho(node: Gateway, clients: list[PahoClient], client_id: str, version: int, username: str | None = None,
         password: str | None = None) -> PahoClient:
    c = PahoClient(node.port, client_id, version, username=username, password=password)
    clients.append(c)
    return c


def refused_code(version: int) -> int:
    return BANNED_5 if version == 5 else PAHO_NOT_AUTHORIZED


def test_a_banned_client_id_is_refused_before_authentication(node: Gateway, api: Api,
                                                             clients: list[PahoClient]) -> None:
    api.ban("clientid", "bad-dev", reason="tampering")
    for version in (4, 5):
        res = paho(node, clients, "bad-dev", version).connect(check=False)
        assert res.reason_code == refused_code(version), res
        raw = raw_connect(node.port, version, "bad-dev")
        assert raw.code == (BANNED_5 if version == 5 else NOT_AUTHORIZED_311) and raw.closed, raw
        # Refused before the password is looked at: a wrong one gets the ban's code, not "bad credentials".
        assert raw_connect(node.port, version, "bad-dev", "alice", "wrong").code == raw.code
        assert paho(node, clients, f"good-dev-{version}", version).connect().reason_code == 0


def test_a_banned_user_name_is_refused_only_once_proven(node: Gateway, api: Api, clients: list[PahoClient]) -> None:
    api.ban("username", "mallory")
    for version in (4, 5):
        wrong = paho(node, clients, f"m-wrong-{version}", version, "mallory", "guess").connect(check=False)
        assert wrong.reason_code == (BAD_CREDENTIALS_5 if version == 5 else 0x86), wrong  # the ban is not revealed
        right = paho(node, clients, f"m-right-{version}", version, "mallory", USERS["mallory"]).connect(check=False)
        assert right.reason_code == refused_code(version), right
        assert raw_connect(node.port, version, f"m-raw-{version}", "mallory", USERS["mallory"]).code == \
            (BANNED_5 if version == 5 else NOT_AUTHORIZED_311)
        assert paho(node, clients, f"a-{version}", version, "alice", USERS["alice"]).connect().reason_code == 0
        # Anonymous, a client id equal to the banned user name is no user name.
        assert paho(node, clients, "mallory", version).connect().reason_code == 0
        clients[-1].disconnect()


def test_a_banned_network_refuses_its_addresses_only(node: Gateway, api: Api, clients: list[PahoClient]) -> None:
    api.ban("peerhost", "10.0.0.0/8")
    for version in (4, 5):
        assert paho(node, clients, f"other-net-{version}", version).connect().reason_code == 0
    made = api.ban("peerhost", "127.1.2.3/8")
    assert made["who"] == "127.0.0.0/8"
    for version in (4, 5):
        res = paho(node, clients, f"loopback-{version}", version).connect(check=False)
        assert res.reason_code == refused_code(version), res
    api.unban("peerhost", "127.0.0.0/8")
    api.ban("peerhost", "127.0.0.1")
    assert paho(node, clients, "one-address", 5).connect(check=False).reason_code == BANNED_5
    api.unban("peerhost", "127.0.0.1")
    assert paho(node, clients, "one-address", 5).connect().reason_code == 0


def test_a_ban_lapses_when_its_duration_is_over(node: Gateway, api: Api, clients: list[PahoClient]) -> None:
    made = api.ban("clientid", "brief", duration=1.0)
    assert made["until"] is not None and made["until"] - made["at"] == pytest.approx(1.0)
    assert paho(node, clients, "brief", 5).connect(check=False).reason_code == BANNED_5
    time.sleep(max(0.0, made["until"] - time.time()) + 0.1)  # the behaviour under test: the ban's second passes
    assert paho(node, clients, "brief", 5).connect().reason_code == 0
    assert paho(node, clients, "brief-311", 4).connect().reason_code == 0
    # ... and is gone from the list (the node's refresh deletes it from the store).
    assert [b["who"] for b in api.http.get("/api/v1/banned").json()["data"]] == []


def test_a_new_ban_kicks_connected_clients(node: Gateway, api: Api, clients: list[PahoClient]) -> None:
    v5 = paho(node, clients, "online-5", 5)
    v5.connect()
    v311 = paho(node, clients, "online-311", 4, "mallory", USERS["mallory"])
    v311.connect()
    bystander = paho(node, clients, "bystander", 5, "alice", USERS["alice"])
    bystander.connect()
    assert api.ban("clientid", "online-5")["kicked"] == 1
    assert v5.wait_disconnect() == ADMINISTRATIVE_ACTION
    assert api.ban("username", "mallory")["kicked"] == 1
    v311.wait_disconnect()  # 3.1.1 has no DISCONNECT from the server: the connection just ends
    assert bystander.client.is_connected() and bystander.subscribe("t/#", 1) == [1]
    assert paho(node, clients, "online-5", 5).connect(check=False).reason_code == BANNED_5


def test_bans_survive_a_restart(node: Gateway, api: Api, clients: list[PahoClient]) -> None:
    api.ban("clientid", "kept", reason="stored")
    api.ban("clientid", "lifted")
    api.unban("clientid", "lifted")
    node.restart()
    assert paho(node, clients, "kept", 5).connect(check=False).reason_code == BANNED_5
    assert paho(node, clients, "lifted", 5).connect().reason_code == 0
    listed = api.http.get("/api/v1/banned").json()["data"]
    assert [(b["as"], b["who"], b["reason"]) for b in listed] == [("clientid", "kept", "stored")]



def _amqp_login(node: Gateway, username: str) -> bool:
    params = pika.ConnectionParameters("127.0.0.1", node.amqp_port, credentials=pika.PlainCredentials(
        username, USERS[username]), connection_attempts=1, socket_timeout=5)
    try:
        pika.BlockingConnection(params).close()
    except pika.exceptions.ProbableAuthenticationError:
        return False
    return True


def test_a_banned_user_name_is_refused_over_amqp_too(node: Gateway, api: Api) -> None:
    assert _amqp_login(node, "mallory")
    api.ban("username", "mallory")
    assert not _amqp_login(node, "mallory")
    assert _amqp_login(node, "alice")  # only the banned identity
    api.ban("peerhost", "127.0.0.1")
    assert not _amqp_login(node, "alice")
