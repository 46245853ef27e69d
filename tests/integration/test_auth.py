"""MQTT 5 enhanced authentication end to end: SCRAM-SHA-256 (RFC 5802 / 7677) through CONNECT and AUTH."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import Gateway, GatewayFactory
from tests.integration.rawmqtt import RawClient
from tidewire.gateway.protocols.mqtt.codec import Auth, Connack, Connect, Suback, Subscribe, SubscriptionRequest

AUTH_METHOD = 0x15
AUTH_DATA = 0x16


# -- enhanced authentication: SCRAM-SHA-256 (RFC 5802 / 7677) --------------------------------------

def _hmac(key: bytes, msg: bytes) -> bytes:
    return hmac.new(key, msg, hashlib.sha256).digest()


def scram_credentials_line(user: str, password: str, iterations: int = 4096) -> str:
    salt = os.urandom(16)
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    stored = hashlib.sha256(_hmac(salted, b"Client Key")).digest()
    server_key = _hmac(salted, b"Server Key")
    b64 = lambda b: base64.b64encode(b).decode()  # noqa: E731
    return f"{user}:SCRAM-SHA-256:{iterations}:{b64(salt)}:{b64(stored)}:{b64(server_key)}"


class ScramClient:
    """The client side of one SCRAM-SHA-256 exchange."""

    def __init__(self, user: str, password: str) -> None:
        self.password = password
        self.nonce = base64.b64encode(os.urandom(18)).decode()
        self.first_bare = f"n={user},r={self.nonce}"
        self.server_signature = b""

    def first(self) -> bytes:
        return ("n,," + self.first_bare).encode()

    def final(self, server_first: bytes) -> bytes:
        fields = dict(item.split("=", 1) for item in server_first.decode().split(","))
        assert fields["r"].startswith(self.nonce), server_first
        salted = hashlib.pbkdf2_hmac("sha256", self.password.encode(), base64.b64decode(fields["s"]),
                                     int(fields["i"]))
        client_key = _hmac(salted, b"Client Key")
        without_proof = f"c=biws,r={fields['r']}"
        auth_message = f"{self.first_bare},{server_first.decode()},{without_proof}".encode()
        signature = _hmac(hashlib.sha256(client_key).digest(), auth_message)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        self.server_signature = _hmac(_hmac(salted, b"Server Key"), auth_message)
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def verify(self, server_final: bytes) -> bool:
        return server_final.decode() == "v=" + base64.b64encode(self.server_signature).decode()


@pytest.fixture
def auth_gateway(gateway_factory: GatewayFactory, tmp_path: Path) -> Gateway:
    creds = tmp_path / "scram.txt"
    creds.write_text(scram_credentials_line("alice", "s3cret") + "\n" + scram_credentials_line("bob", "other")
                     + "\n")
    return gateway_factory(env={"TIDEWIRE_AUTH_FILE": str(creds)})


def _scram_connect(gw: Gateway, user: str, password: str) -> tuple[RawClient, ScramClient, Any]:
    raw = RawClient(gw.port, level=5)
    scram = ScramClient(user, password)
    raw.send(Connect(client_id=f"scram-{user}", protocol_level=5,
                     properties={AUTH_METHOD: "SCRAM-SHA-256", AUTH_DATA: scram.first()}))
    challenge = raw.expect(Auth)
    assert challenge.reason_code == 0x18, challenge
    assert challenge.properties.get(AUTH_METHOD) == "SCRAM-SHA-256"
    raw.send(Auth(reason_code=0x18, properties={AUTH_METHOD: "SCRAM-SHA-256",
                                                AUTH_DATA: scram.final(challenge.properties[AUTH_DATA])}))
    return raw, scram, raw.recv()


@pytest.mark.tidewire_only
def test_scram_auth_success(auth_gateway: Gateway) -> None:
    raw, scram, reply = _scram_connect(auth_gateway, "alice", "s3cret")
    assert isinstance(reply, Connack) and reply.reason_code == 0, reply
    assert reply.properties.get(AUTH_METHOD) == "SCRAM-SHA-256"
    assert scram.verify(reply.properties.get(AUTH_DATA, b"")), "server-final signature does not verify"
    raw.send(Subscribe(packet_id=1, subscriptions=[SubscriptionRequest("scram/t", 1)]))
    assert raw.expect(Suback).reason_codes == [1]  # a usable session


@pytest.mark.tidewire_only
def test_scram_auth_wrong_password(auth_gateway: Gateway) -> None:
    raw, _, reply = _scram_connect(auth_gateway, "alice", "wrong")
    assert isinstance(reply, Connack) and reply.reason_code in (0x86, 0x87), reply
    raw.until_closed(2.0)


@pytest.mark.tidewire_only
def test_auth_unknown_method(auth_gateway: Gateway) -> None:
    raw = RawClient(auth_gateway.port, level=5)
    raw.send(Connect(client_id="auth-unknown", protocol_level=5,
                     properties={AUTH_METHOD: "KERBEROS-42", AUTH_DATA: b"x"}))
    reply = raw.expect(Connack)
    assert reply.reason_code == 0x8C, reply
    raw.until_closed(2.0)
