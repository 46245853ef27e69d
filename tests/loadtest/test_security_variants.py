"""Smoke runs of the password and TLS benchmark variants against Mosquitto and Tidewire started with the same
password file (mosquitto_passwd) and certificate, plus the checks that keep a broken setup from looking fast."""

from __future__ import annotations

import dataclasses
import json
import ssl
from collections.abc import Iterator

import pytest

from loadtest import bench, servers
from loadtest.client import ConnackRefused, Counters, disconnect
from loadtest.scenarios import SCENARIOS, Params, Result
from loadtest.security import Security, mosquitto_passwd_path, security_files

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(servers.mosquitto_path() is None or mosquitto_passwd_path() is None,
                       reason="needs mosquitto and mosquitto_passwd (Debian package mosquitto)"),
]
TARGETS = ["mosquitto", "tidewire"]
@pytest.fixture(scope="module")
def auth_tls_files() -> Iterator[Security]:
    with security_files(auth=True, tls=True, users=5) as sec:
        yield sec


@pytest.fixture(scope="module")
def tls_files() -> Iterator[Security]:
    with security_files(auth=False, tls=True) as sec:
        yield sec


@pytest.fixture(scope="module", params=TARGETS)
def secured(request: pytest.FixtureRequest, auth_tls_files: Security) -> Iterator[servers.Server]:
    """A target with the password file (anonymous off) and a TLS listener."""
    with servers.start(request.param, core=None, security=auth_tls_files) as s:
        yield s


@pytest.fixture(scope="module", params=TARGETS)
def tls_only(request: pytest.FixtureRequest, tls_files: Security) -> Iterator[servers.Server]:
    """A target with anonymous access and a TLS listener."""
    with servers.start(request.param, core=None, security=tls_files) as s:
        yield s


def tiny(**kw: object) -> Params:
    p = Params(seconds=0.7, subscribers=10, rate=1_000, concurrency=4, drain=1.0, open_concurrency=20)
    for k, v in kw.items():
        setattr(p, k, v)
    return p


def check_connects(r: Result, server: servers.Server) -> None:
    assert r.scenario == "connect" and r.server == server.label and r.unit == "conns/s"
    assert r.extra["errors"] == 0 and r.extra["refused"] == 0
    # Every loop must get past one connection; a server that sits on a closed session would cap this at 4.
    assert r.extra["slow_closes"] == 0
    assert r.sent > 4 and r.rate > 0
    assert r.p50_ms is not None and r.p99_ms is not None and 0 < r.p50_ms <= r.p99_ms < 10_000
    assert bench.refusals(r) is None


@pytest.mark.parametrize("tls", [False, True])
async def test_connect_with_password(secured: servers.Server, tls: bool) -> None:
    assert secured.label.endswith("(auth,tls)")
    check_connects(await SCENARIOS["connect"](secured, tiny(auth=True, tls=tls)), secured)


async def test_connect_tls(tls_only: servers.Server) -> None:
    assert tls_only.label.endswith("(tls)")
    check_connects(await SCENARIOS["connect"](tls_only, tiny(tls=True)), tls_only)


async def test_fanout_tls_delivers_to_every_subscriber(tls_only: servers.Server) -> None:
    r = await SCENARIOS["fanout"](tls_only, tiny(tls=True))
    assert r.scenario == "fanout" and r.extra["subscribers_per_msg"] == 10
    assert r.sent > 0 and r.lost == 0 and r.received == r.sent * 10


async def test_wrong_password_is_counted_as_refused_not_speed(secured: servers.Server) -> None:
    wrong = dataclasses.replace(secured, security=dataclasses.replace(secured.security, password="not-it"))
    r = await SCENARIOS["connect"](wrong, tiny(auth=True, seconds=0.5))
    assert r.sent == 0 and r.rate == 0
    assert r.extra["refused"] > 0 and r.extra["errors"] == r.extra["refused"]
    assert r.extra["first_refused_code"] in (4, 5)  # bad user name or password / not authorized
    reason = bench.refusals(r)
    assert reason is not None and "not-it" not in reason


@pytest.mark.parametrize("tls", [False, True])
async def test_anonymous_is_refused(secured: servers.Server, tls: bool) -> None:
    ep = secured.endpoint(tls=tls, auth=False)
    with pytest.raises(ConnackRefused) as refused:
        await ep.connect("lt-anon", Counters())
    assert refused.value.code in (4, 5)


async def test_tls_is_verified_and_modern(tls_only: servers.Server) -> None:
    ep = tls_only.endpoint(tls=True)
    conn = await ep.connect("lt-tls-version", Counters())
    try:
        assert conn.transport is not None
        ssl_object = conn.transport.get_extra_info("ssl_object")
        assert ssl_object is not None and ssl_object.version() in ("TLSv1.2", "TLSv1.3")
    finally:
        await disconnect(conn)
    # The same listener with a client that does not trust our CA: the handshake must fail.
    untrusting = dataclasses.replace(ep, ssl_context=ssl.create_default_context())
    with pytest.raises(ssl.SSLCertVerificationError):
        await untrusting.connect("lt-tls-untrusted", Counters(), timeout=5.0)


def test_endpoint_refuses_variants_the_server_was_not_started_with() -> None:
    plain = servers.Server("mosquitto", "127.0.0.1", 1, None, None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="TLS"):
        plain.endpoint(tls=True)
    with pytest.raises(ValueError, match="password"):
        plain.endpoint(auth=True)


def test_cli_connect_auth_tls(capsys: pytest.CaptureFixture[str]) -> None:
    rc = bench.main(["connect", "--target", "mosquitto", "--auth", "--tls", "--seconds", "0.5",
                     "--concurrency", "4", "--json", "--no-pin"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["server"] == "mosquitto(auth,tls)" and out["extra"]["refused"] == 0 and out["sent"] > 4
    args = bench.build_parser().parse_args(["fanout", "--tls"])
    p = bench.params_for("fanout", args, suite=False)
    assert p.tls is True and p.auth is False
