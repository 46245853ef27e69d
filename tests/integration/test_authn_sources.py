"""JWT, HTTP hook and chained authentication sources end to end (Tidewire only: Mosquitto has none of them).

Tokens are made with PyJWT in the test; the HTTP hook is a real stdlib HTTP server in a thread; clients are
paho and a hand-built CONNECT (for the exact 3.1.1 return codes on the wire).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import math
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.integration.conftest import GatewayFactory, PahoFactory, free_port, write_password_file
from tests.integration.rawconnect import raw_connect

pytestmark = pytest.mark.tidewire_only

SECRET = "tidewire-integration-test-secret-0123456789"  # HS256 wants >= 32 bytes (RFC 7518 3.2)
BAD_CREDENTIALS = {4: 4, 5: 0x86}
NOT_AUTHORIZED = {4: 5, 5: 0x87}
UNAVAILABLE = {4: 3, 5: 0x88}
MAXIMUM_CONNECT_TIME = 0xA0


def token(sub: str, exp_in: float = 60, acl: Any = None, key: Any = SECRET, algorithm: str = "HS256",
          **claims: Any) -> str:
    payload: dict[str, Any] = {"sub": sub, "exp": math.ceil(time.time() + exp_in), **claims}
    if acl is not None:
        payload["acl"] = acl
    return jwt.encode(payload, key, algorithm=algorithm)


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def hs256_by_hand(payload: dict[str, Any], key: bytes) -> str:
    """HS256 with any bytes as the key (PyJWT refuses a PEM public key here, as it should; attackers do not)."""
    signing_input = _b64url(json.dumps({"alg": "HS256", "typ": "JWT"}).encode()) + "." + \
        _b64url(json.dumps(payload).encode())
    signature = hmac.new(key, signing_input.encode(), hashlib.sha256).digest()
    return signing_input + "." + _b64url(signature)


# -- JWT ------------------------------------------------------------------------------------------------

def test_jwt_acl_claim_grants_exactly_that(gateway_factory: GatewayFactory, paho_factory: PahoFactory) -> None:
    gw = gateway_factory(env={"TIDEWIRE_JWT_SECRET": SECRET})
    dev = paho_factory(gw.port, "jwt-dev", username="dev-1",
                       password=token("dev-1", acl={"pub": ["jwt/up/#"], "sub": ["jwt/down/#"]}))
    dev.connect()
    peer = paho_factory(gw.port, "jwt-peer", username="svc",
                        password=token("svc", acl={"pub": ["jwt/down/#"], "sub": ["jwt/up/#"]}))
    peer.connect()
    assert dev.subscribe("jwt/down/#", 1) == [1]
    assert dev.subscribe([("jwt/up/#", 1), ("other/#", 1)]) == [0x87, 0x87]
    assert peer.subscribe("jwt/up/#", 1) == [1]
    assert dev.publish("jwt/up/1", b"telemetry", qos=1) == 0
    assert dev.publish("jwt/down/1", b"forged", qos=1) == 0x87
    assert dev.publish("other/1", b"elsewhere", qos=1) == 0x87
    assert peer.get().payload == b"telemetry"
    assert peer.publish("jwt/down/2", b"command", qos=1) == 0
    assert dev.get().payload == b"command"
    dev.assert_nothing(0.2)
    peer.assert_nothing(0.1)


def test_jwt_bad_tokens_are_refused(gateway_factory: GatewayFactory) -> None:
    gw = gateway_factory(env={"TIDEWIRE_JWT_SECRET": SECRET})
    unsigned = jwt.encode({"sub": "x", "exp": math.ceil(time.time() + 60)}, "", algorithm="none")
    bad = {
        "expired": token("late", exp_in=-30),
        "wrong secret": token("forger", key="another-secret-that-is-long-enough-too"),
        "alg none": unsigned,
        "not a token": "just-a-password",
    }
    for version in (4, 5):
        assert raw_connect(gw.port, version, f"good-{version}", "good", token("good")).code == 0  # control
        for what, password in bad.items():
            res = raw_connect(gw.port, version, f"bad-{version}", "someone", password)
            assert res.code == BAD_CREDENTIALS[version], (version, what, res)
            assert res.closed, what


@pytest.mark.slow  # waits out a protocol timer (make test-slow)
def test_jwt_expiry_closes_the_connection(gateway_factory: GatewayFactory, paho_factory: PahoFactory) -> None:
    gw = gateway_factory(env={"TIDEWIRE_JWT_SECRET": SECRET})
    v5 = paho_factory(gw.port, "short-v5", username="short", password=token("short", exp_in=2))
    v4 = paho_factory(gw.port, "short-v4", version=4, username="short", password=token("short", exp_in=2))
    v5.connect()
    v4.connect()
    assert v5.subscribe("short/#", 1) == [1]  # usable until then
    assert v5.disconnects.empty()
    assert v5.wait_disconnect(timeout=5) == MAXIMUM_CONNECT_TIME  # DISCONNECT 0xA0 read before the close
    v4.wait_disconnect(timeout=2)


def test_jwt_rs256_with_public_key_file(gateway_factory: GatewayFactory, paho_factory: PahoFactory,
                                        tmp_path: Path) -> None:
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public_pem = private.public_key().public_bytes(serialization.Encoding.PEM,
                                                   serialization.PublicFormat.SubjectPublicKeyInfo)
    key_file = tmp_path / "jwt-public.pem"
    key_file.write_bytes(public_pem)
    gw = gateway_factory(env={"TIDEWIRE_JWT_PUBLIC_KEY": str(key_file)})

    c = paho_factory(gw.port, "rs-dev", username="rs-user", password=token("rs-user", key=private, algorithm="RS256"))
    c.connect()
    assert c.subscribe("rs/#", 1) == [1]
    c.publish("rs/1", b"signed", qos=1)
    assert c.get().payload == b"signed"

    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    confused = hs256_by_hand({"sub": "rs-user", "exp": math.ceil(time.time() + 60)}, public_pem)
    for what, password in (("other key", token("rs-user", key=other, algorithm="RS256")),
                           ("HS256 keyed with the public key", confused)):
        res = raw_connect(gw.port, 5, "rs-bad", "rs-user", password)
        assert res.code == BAD_CREDENTIALS[5], (what, res)


# -- HTTP hook ------------------------------------------------------------------------------------------

Answer = Callable[[dict[str, Any]], tuple[int, dict[str, Any] | None]]


class AuthService:
    """A real HTTP server: records each POSTed JSON body and answers `answer(body) -> (status, json or None)`."""

    def __init__(self, answer: Answer) -> None:
        self.requests: list[tuple[str, str, dict[str, Any]]] = []  # (path, content type, body)
        service = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                body = json.loads(raw)
                service.requests.append((self.path, self.headers.get("Content-Type", ""), body))
                status, reply = answer(body)
                data = b"" if reply is None else json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/auth"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


@pytest.fixture
def auth_service() -> Iterator[Callable[[Answer], AuthService]]:
    made: list[AuthService] = []

    def make(answer: Answer) -> AuthService:
        service = AuthService(answer)
        made.append(service)
        return service

    yield make
    for service in made:
        service.close()


def test_http_hook_allow_with_acl(gateway_factory: GatewayFactory, paho_factory: PahoFactory,
                                  auth_service: Callable[[Answer], AuthService]) -> None:
    rules = [{"permission": "allow", "action": "publish", "topic": "t/%c"},
             {"permission": "allow", "action": "subscribe", "topic": "t/#"}]
    service = auth_service(lambda body: (200, {"result": "allow", "is_superuser": False, "acl": rules}))
    gw = gateway_factory(env={"TIDEWIRE_HTTP_AUTH_URL": service.url})
    c = paho_factory(gw.port, "dev7", username="u7", password="p7")
    c.connect()
    path, content_type, body = service.requests[0]
    assert path == "/auth" and content_type.startswith("application/json")
    assert (body["clientid"], body["username"], body["password"], body["peerhost"]) == ("dev7", "u7", "p7",
                                                                                     "127.0.0.1")
    assert "protocol" in body
    assert c.subscribe("t/#", 1) == [1]
    assert c.subscribe("x/#", 1) == [0x87]
    assert c.publish("t/dev7", b"own topic", qos=1) == 0
    assert c.get().payload == b"own topic"
    assert c.publish("t/dev8", b"another's", qos=1) == 0x87
    c.assert_nothing(0.3)


def test_http_hook_refusals(gateway_factory: GatewayFactory, auth_service: Callable[[Answer], AuthService]) -> None:
    answers: dict[str, tuple[int, dict[str, Any] | None]] = {
        "denied": (200, {"result": "deny"}), "bad": (401, None), "forbidden": (403, None)}
    service = auth_service(lambda body: answers[body["username"]])
    gw = gateway_factory(env={"TIDEWIRE_HTTP_AUTH_URL": service.url})
    expected = {"denied": NOT_AUTHORIZED, "bad": BAD_CREDENTIALS, "forbidden": NOT_AUTHORIZED}
    for version in (4, 5):
        for user, codes in expected.items():
            res = raw_connect(gw.port, version, f"{user}-{version}", user, "pw")
            assert res.code == codes[version], (version, user, res)
            assert res.closed
    assert len(service.requests) >= 3


def test_http_superuser_bypasses_the_acl_file(gateway_factory: GatewayFactory, paho_factory: PahoFactory,
                                              auth_service: Callable[[Answer], AuthService]) -> None:
    service = auth_service(lambda body: (200, {"result": "allow", "is_superuser": body["username"] == "root"}))
    gw = gateway_factory(acl_text="user nobody\ntopic read nothing/#\n", env={"TIDEWIRE_HTTP_AUTH_URL": service.url})
    root = paho_factory(gw.port, "root-dev", username="root", password="pw")
    root.connect()
    plain = paho_factory(gw.port, "plain-dev", username="plain", password="pw")
    plain.connect()
    assert plain.subscribe("any/#", 1) == [0x87]  # the ACL file grants plain nothing
    assert plain.publish("any/1", b"plain", qos=1) == 0x87
    assert root.subscribe("any/#", 1) == [1]
    assert root.publish("any/2", b"root", qos=1) == 0
    assert root.get().payload == b"root"


def test_http_hook_down_refuses(gateway_factory: GatewayFactory) -> None:
    gw = gateway_factory(env={"TIDEWIRE_HTTP_AUTH_URL": f"http://127.0.0.1:{free_port()}/auth"})
    for version in (4, 5):
        res = raw_connect(gw.port, version, f"down-{version}", "user", "pw")
        assert res.code == UNAVAILABLE[version], (version, res)
        assert res.closed
    assert "Traceback" not in gw.stderr


def test_http_hook_down_ignored_lets_anonymous_in(gateway_factory: GatewayFactory) -> None:
    gw = gateway_factory(env={"TIDEWIRE_HTTP_AUTH_URL": f"http://127.0.0.1:{free_port()}/auth",
                              "TIDEWIRE_HTTP_AUTH_ON_ERROR": "ignore"}, allow_anonymous=True)
    for version in (4, 5):
        assert raw_connect(gw.port, version, f"anon-{version}").code == 0
        # Credentials nobody could check are not a proved identity: refused, not downgraded to anonymous.
        res = raw_connect(gw.port, version, f"claim-{version}", "user", "pw")
        assert res.code == BAD_CREDENTIALS[version], (version, res)


# -- chain ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("chain", [None, '["jwt","file"]'], ids=["default-order", "jwt-first"])
def test_password_file_and_jwt_together(gateway_factory: GatewayFactory, paho_factory: PahoFactory,
                                        tmp_path: Path, chain: str | None) -> None:
    passwords = write_password_file(tmp_path / "passwd", {"alice": "alice-secret"})
    env = {"TIDEWIRE_JWT_SECRET": SECRET}
    if chain is not None:
        env["TIDEWIRE_AUTH_CHAIN"] = chain
    gw = gateway_factory(env=env, password_file=passwords)
    alice = paho_factory(gw.port, "chain-alice", username="alice", password="alice-secret")
    alice.connect()
    device = paho_factory(gw.port, "chain-device", username="device-9", password=token("device-9"))
    device.connect()
    assert alice.subscribe("chain/#", 1) == [1]
    device.publish("chain/1", b"from a token user", qos=1)
    assert alice.get().payload == b"from a token user"
    for version in (4, 5):
        for user, password in (("alice", "wrong"), ("alice", token("alice", key="not-the-secret-but-32-bytes-long")),
                               ("device-9", "device-9")):
            res = raw_connect(gw.port, version, f"chain-bad-{version}", user, password)
            assert res.code == BAD_CREDENTIALS[version], (version, user, res)
