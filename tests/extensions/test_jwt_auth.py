"""Tests for extensions.jwt_auth: tokens made with PyJWT, keys generated here with `cryptography`."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

from tidewire.extensions.authentication import AuthChain, AuthDecision, AuthRequest, Failure, Identity, Outcome, Refused
from tidewire.extensions.hooks import ClientInfo, SubscribeAccess
from tidewire.extensions.jwt_auth import JwtAuthenticator, grants_from_acl_claim
from tidewire.gateway.config import Settings

SECRET = "k" * 32


@pytest.fixture(scope="module")
def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture(scope="module")
def rsa_key2() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture(scope="module")
def ec_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def pem(key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def write_pem(path: Path, key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey) -> Path:
    path.write_bytes(pem(key))
    return path


def write_jwks(path: Path, keys: dict[str, rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey]) -> Path:
    entries = []
    for kid, key in keys.items():
        if isinstance(key, rsa.RSAPrivateKey):
            entry = RSAAlgorithm.to_jwk(key.public_key(), as_dict=True)
        else:
            entry = ECAlgorithm.to_jwk(key.public_key(), as_dict=True)
        entry["kid"] = kid
        entries.append(entry)
    path.write_text(json.dumps({"keys": entries}))
    return path


def claims(**extra: Any) -> dict[str, Any]:
    return {"sub": "alice", "exp": int(time.time()) + 600, **extra}


def make(payload: dict[str, Any], key: Any, alg: str, **headers: Any) -> bytes:
    return jwt.encode(payload, key, algorithm=alg, headers=headers or None).encode()


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def raw_token(header: dict[str, Any], payload: dict[str, Any], signature: bytes = b"") -> bytes:
    return f"{b64(json.dumps(header).encode())}.{b64(json.dumps(payload).encode())}.{b64(signature)}".encode()


def req(password: bytes | None, client_id: str = "dev-1") -> AuthRequest:
    return AuthRequest(client_id=client_id, username="whoever", password=password)


async def decide(auth: JwtAuthenticator, password: bytes | None) -> AuthDecision:
    return await auth.authenticate(req(password))


async def denied(auth: JwtAuthenticator, token: bytes, fragment: str) -> None:
    decision = await decide(auth, token)
    assert decision.outcome is Outcome.DENY, decision
    assert decision.failure is Failure.BAD_CREDENTIALS
    assert fragment in decision.reason, decision.reason
    for part in token.decode().split("."):  # no piece of the token leaks into the reason
        assert not part or part not in decision.reason


@pytest.fixture
def hs() -> JwtAuthenticator:
    return JwtAuthenticator(secret=SECRET)


@pytest.fixture
def rs(tmp_path: Path, rsa_key: rsa.RSAPrivateKey) -> JwtAuthenticator:
    return JwtAuthenticator(public_key_file=write_pem(tmp_path / "rsa.pem", rsa_key))


# --- what the source ignores -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "password",
    [None, b"", b"hunter2", b"a.b.c", b"x.y", b"no.dots.here.either", "pässword.x.y".encode(),
     b"eyJhbGciOiJIUzI1NiJ9.e30", b"W10.e30.", b"bm90IGpzb24.e30.", b"eyJhbGciOiJIUzI1NiJ9..sig",
     b"eyJhbGciOiJIUzI1NiJ9.e3+.sig", b"eyJhbGciOiJIUzI1NiJ9.e30=.x"],
)
async def test_non_jwt_passwords_are_ignored(hs: JwtAuthenticator, password: bytes | None) -> None:
    assert (await decide(hs, password)).outcome is Outcome.IGNORE


async def test_chain_passes_ordinary_passwords_on_and_accepts_tokens(hs: JwtAuthenticator) -> None:
    chain = AuthChain([hs], allow_anonymous=False)
    refused = await chain.authenticate(req(b"hunter2"))
    assert isinstance(refused, Refused) and refused.source == "chain"
    exp = int(time.time()) + 60
    identity = await chain.authenticate(req(make(claims(exp=exp), SECRET, "HS256")))
    assert identity == Identity("alice", False, None, float(exp), "jwt")


# --- accepted tokens -----------------------------------------------------------------------------------------


async def test_tenant_claim() -> None:
    auth = JwtAuthenticator(secret=SECRET, tenant_claim="org")
    assert (await decide(auth, make(claims(org="acme"), SECRET, "HS256"))).tenant == "acme"
    assert (await decide(auth, make(claims(), SECRET, "HS256"))).tenant is None  # no claim: no tenant
    await denied(auth, make(claims(org=["acme"]), SECRET, "HS256"), "invalid tenant claim")
    unread = JwtAuthenticator(secret=SECRET)  # no claim configured: a token cannot pick its tenant
    assert (await decide(unread, make(claims(tenant="acme"), SECRET, "HS256"))).tenant is None


async def test_hs256_allows_with_identity_and_expiry(hs: JwtAuthenticator) -> None:
    exp = int(time.time()) + 600
    decision = await decide(hs, make(claims(exp=exp), SECRET, "HS256"))
    assert decision.outcome is Outcome.ALLOW
    assert decision.username == "alice" and decision.expires_at == exp
    assert decision.acl is None and not decision.superuser
    assert hs.name == "jwt"


async def test_token_without_exp_has_no_expiry(hs: JwtAuthenticator) -> None:
    decision = await decide(hs, make({"sub": "alice"}, SECRET, "HS256"))
    assert decision.outcome is Outcome.ALLOW and decision.expires_at is None


async def test_rs256_and_es256_by_pem_key_type(tmp_path: Path, rsa_key: rsa.RSAPrivateKey,
                                               ec_key: ec.EllipticCurvePrivateKey) -> None:
    rs = JwtAuthenticator(public_key_file=write_pem(tmp_path / "r.pem", rsa_key))
    es = JwtAuthenticator(public_key_file=write_pem(tmp_path / "e.pem", ec_key))
    assert (await decide(rs, make(claims(), rsa_key, "RS256"))).username == "alice"
    assert (await decide(rs, make(claims(), rsa_key, "PS256"))).outcome is Outcome.ALLOW
    assert (await decide(es, make(claims(), ec_key, "ES256"))).username == "alice"
    # The key type decides the algorithm family: each key refuses the other's tokens.
    await denied(rs, make(claims(), ec_key, "ES256"), "algorithm not allowed")
    await denied(es, make(claims(), rsa_key, "RS256"), "algorithm not allowed")
    await denied(es, make(claims(), ec.generate_private_key(ec.SECP384R1()), "ES384"), "algorithm not allowed")


async def test_jwks_selects_key_by_kid(tmp_path: Path, rsa_key: rsa.RSAPrivateKey, rsa_key2: rsa.RSAPrivateKey,
                                       ec_key: ec.EllipticCurvePrivateKey) -> None:
    auth = JwtAuthenticator(jwks_file=write_jwks(tmp_path / "jwks.json", {"r1": rsa_key, "e1": ec_key}))
    assert (await decide(auth, make(claims(), rsa_key, "RS256", kid="r1"))).outcome is Outcome.ALLOW
    assert (await decide(auth, make(claims(), ec_key, "ES256", kid="e1"))).outcome is Outcome.ALLOW
    await denied(auth, make(claims(), rsa_key, "RS256", kid="e1"), "algorithm not allowed")  # kid of the EC key
    await denied(auth, make(claims(), rsa_key2, "RS256", kid="r1"), "bad signature")
    await denied(auth, make(claims(), rsa_key, "RS256", kid="nope"), "unknown key id")
    await denied(auth, make(claims(), rsa_key, "RS256"), "algorithm not allowed")  # no kid, several keys
    await denied(auth, raw_token({"alg": "RS256", "kid": 7}, claims(), b"sig"), "malformed key id")


async def test_single_key_jwks_serves_tokens_without_kid(tmp_path: Path, ec_key: ec.EllipticCurvePrivateKey) -> None:
    auth = JwtAuthenticator(jwks_file=write_jwks(tmp_path / "jwks.json", {"only": ec_key}))
    assert (await decide(auth, make(claims(), ec_key, "ES256"))).outcome is Outcome.ALLOW


async def test_custom_username_claim(hs: JwtAuthenticator) -> None:
    auth = JwtAuthenticator(secret=SECRET, username_claim="preferred_username")
    token = make(claims(preferred_username="bob"), SECRET, "HS256")
    assert (await decide(auth, token)).username == "bob"
    await denied(auth, make(claims(), SECRET, "HS256"), "user name claim")


# --- refused tokens ------------------------------------------------------------------------------------------


async def test_bad_signature(hs: JwtAuthenticator, rs: JwtAuthenticator, rsa_key2: rsa.RSAPrivateKey) -> None:
    await denied(hs, make(claims(), "x" * 32, "HS256"), "bad signature")
    await denied(rs, make(claims(), rsa_key2, "RS256"), "bad signature")
    good = make(claims(), SECRET, "HS256").decode().split(".")
    forged = f"{good[0]}.{b64(json.dumps(claims(sub='root')).encode())}.{good[2]}".encode()
    await denied(hs, forged, "bad signature")
    await denied(hs, f"{good[0]}.{good[1]}.".encode(), "bad signature")  # stripped signature
    await denied(rs, make(claims(), rsa_key2, "RS256")[:-10] + b"AAAAAAAAAA", "bad signature")


async def test_unsigned_and_unknown_algorithms(hs: JwtAuthenticator, rs: JwtAuthenticator) -> None:
    for alg in ("none", "None", "NONE"):
        await denied(hs, raw_token({"alg": alg, "typ": "JWT"}, claims()), "alg none")
        await denied(rs, raw_token({"alg": alg}, claims()), "alg none")
    await denied(hs, raw_token({"typ": "JWT"}, claims(), b"sig"), "no algorithm")
    await denied(hs, raw_token({"alg": 256}, claims(), b"sig"), "no algorithm")
    await denied(hs, raw_token({"alg": "HS1"}, claims(), b"sig"), "algorithm not allowed")
    await denied(rs, make(claims(), SECRET, "HS256"), "algorithm not allowed")  # no secret configured
    await denied(hs, make(claims(), SECRET, "HS256", crit=["exp"]), "critical header")


async def test_algorithm_confusion_is_refused(tmp_path: Path, rsa_key: rsa.RSAPrivateKey) -> None:
    """HS256 signed with the public key's PEM as the HMAC secret, against RS256 keys (with and without a secret:
    the public key is never used as an HMAC secret)."""
    public_pem = pem(rsa_key)
    header = {"alg": "HS256", "typ": "JWT"}
    signing_input = f"{b64(json.dumps(header).encode())}.{b64(json.dumps(claims()).encode())}"
    signature = hmac.new(public_pem, signing_input.encode(), hashlib.sha256).digest()
    token = f"{signing_input}.{b64(signature)}".encode()
    path = write_pem(tmp_path / "rsa.pem", rsa_key)
    await denied(JwtAuthenticator(public_key_file=path), token, "algorithm not allowed")
    await denied(JwtAuthenticator(public_key_file=path, secret=SECRET), token, "bad signature")
    jwks = write_jwks(tmp_path / "jwks.json", {"r1": rsa_key})
    header["kid"] = "r1"
    await denied(JwtAuthenticator(jwks_file=jwks), raw_token(header, claims(), signature), "algorithm not allowed")


async def test_time_claims(hs: JwtAuthenticator) -> None:
    now = int(time.time())
    await denied(hs, make(claims(exp=now - 5), SECRET, "HS256"), "expired")
    await denied(hs, make(claims(nbf=now + 60), SECRET, "HS256"), "not yet valid")
    await denied(hs, make(claims(iat=now + 60), SECRET, "HS256"), "not yet valid")
    await denied(hs, make(claims(exp="soon"), SECRET, "HS256"), "malformed token")
    await denied(hs, make(claims(exp=str(now + 60)), SECRET, "HS256"), "invalid exp")
    await denied(hs, make(claims(exp=float("inf")), SECRET, "HS256"), "malformed token")
    await denied(hs, make(claims(exp=10**400), SECRET, "HS256"), "invalid exp")


async def test_leeway_extends_exp_and_nbf() -> None:
    now = int(time.time())
    lenient = JwtAuthenticator(secret=SECRET, leeway=30)
    late = make(claims(exp=now - 5), SECRET, "HS256")
    decision = await decide(lenient, late)
    assert decision.outcome is Outcome.ALLOW
    assert decision.expires_at == now - 5 + 30  # closed when the leeway runs out, not at once
    assert (await decide(lenient, make(claims(nbf=now + 10), SECRET, "HS256"))).outcome is Outcome.ALLOW
    await denied(lenient, make(claims(exp=now - 60), SECRET, "HS256"), "expired")
    await denied(JwtAuthenticator(secret=SECRET), late, "expired")


async def test_audience_and_issuer() -> None:
    auth = JwtAuthenticator(secret=SECRET, audience="tidewire", issuer="https://idp")
    ok = claims(aud=["other", "tidewire"], iss="https://idp")
    assert (await decide(auth, make(ok, SECRET, "HS256"))).outcome is Outcome.ALLOW
    await denied(auth, make(claims(aud="other", iss="https://idp"), SECRET, "HS256"), "wrong audience")
    await denied(auth, make(claims(iss="https://idp"), SECRET, "HS256"), "missing aud claim")
    await denied(auth, make(claims(aud="tidewire", iss="https://evil"), SECRET, "HS256"), "wrong issuer")
    await denied(auth, make(claims(aud="tidewire"), SECRET, "HS256"), "missing iss claim")
    plain = JwtAuthenticator(secret=SECRET)  # RFC 7519: a token meant for someone else is not for us either
    await denied(plain, make(claims(aud="other"), SECRET, "HS256"), "none is configured")


@pytest.mark.parametrize("username", [None, "", 42, ["alice"], "a\x00b", "\ud800"])
async def test_invalid_user_name_claim(hs: JwtAuthenticator, username: Any) -> None:
    payload = claims(sub=username) if username is not None else {"exp": int(time.time()) + 60}
    decision = await decide(hs, make(payload, SECRET, "HS256"))
    assert decision.outcome is Outcome.DENY and decision.failure is Failure.BAD_CREDENTIALS


async def test_oversized_and_garbled_tokens(hs: JwtAuthenticator) -> None:
    await denied(hs, make(claims(pad="x" * 20000), SECRET, "HS256"), "too large")
    small = JwtAuthenticator(secret=SECRET, max_token_bytes=100)
    await denied(small, make(claims(), SECRET, "HS256"), "too large")
    header = b64(b'{"alg":"HS256"}')
    await denied(hs, f"{header}.{b64(b'[1,2]')}.abcd".encode(), "bad signature")
    await denied(hs, f"{header}.{b64(b'not json')}.abcd".encode(), "bad signature")
    good = make(claims(), SECRET, "HS256").decode().split(".")
    await denied(hs, f"{good[0]}.{b64(b'[1,2]')}.{good[2]}".encode(), "bad signature")


async def test_es256_garbage_signatures(tmp_path: Path, ec_key: ec.EllipticCurvePrivateKey) -> None:
    es = JwtAuthenticator(public_key_file=write_pem(tmp_path / "e.pem", ec_key))
    good = make(claims(), ec_key, "ES256").decode().split(".")
    for signature in ("", "AAAA", good[2] + "AAAA"):
        await denied(es, f"{good[0]}.{good[1]}.{signature}".encode(), "bad signature")
    for signature in (good[2][:-8], "_" * 86):  # may not even decode as base64url: any refusal will do
        await denied(es, f"{good[0]}.{good[1]}.{signature}".encode(), "")


# --- ACL claims ----------------------------------------------------------------------------------------------


async def test_emqx4_acl_claim_with_placeholders(hs: JwtAuthenticator) -> None:
    acl = {"pub": ["up/%c", "up/${username}/x"], "sub": ["down/%u/#"], "all": ["chat/${clientid}"]}
    decision = await decide(hs, make(claims(acl=acl), SECRET, "HS256"))
    assert decision.outcome is Outcome.ALLOW and decision.acl is not None
    authz, me, other = decision.acl, ClientInfo("dev-1", "alice"), ClientInfo("dev-2", "bob")
    assert authz.allow_publish(me, "up/dev-1") and authz.allow_publish(me, "up/alice/x")
    assert not authz.allow_publish(other, "up/dev-1") and not authz.allow_publish(me, "down/alice/a")
    assert authz.subscribe_access(me, "down/alice/#") is SubscribeAccess.GRANTED
    assert authz.subscribe_access(me, "down/#") is SubscribeAccess.FILTERED
    assert authz.subscribe_access(me, "up/dev-1") is SubscribeAccess.DENIED
    assert authz.allow_read(me, "down/alice/t") and not authz.allow_read(me, "down/bob/t")
    assert authz.allow_publish(me, "chat/dev-1") and authz.allow_read(me, "chat/dev-1")
    assert not authz.allow_publish(me, "elsewhere")


async def test_emqx5_acl_list_deny_wins_over_allow(hs: JwtAuthenticator) -> None:
    acl = [
        {"permission": "allow", "action": "all", "topic": "t/#"},
        {"permission": "deny", "action": "publish", "topic": "t/secret/#", "retain": True},  # widened: deny
        {"permission": "allow", "action": "publish", "topic": "t/secret/ok"},  # later allow does not override
        {"permission": "allow", "action": "subscribe", "topic": "in/%c"},
    ]
    decision = await decide(hs, make(claims(acl=acl), SECRET, "HS256"))
    assert decision.outcome is Outcome.ALLOW and decision.acl is not None
    authz, me = decision.acl, ClientInfo("dev-1", "alice")
    assert authz.allow_publish(me, "t/a") and authz.allow_read(me, "t/a")
    assert not authz.allow_publish(me, "t/secret/ok")
    assert not authz.allow_read(me, "t/secret/x")  # a deny covers both directions
    assert authz.subscribe_access(me, "t/#") is SubscribeAccess.FILTERED
    assert authz.subscribe_access(me, "in/dev-1") is SubscribeAccess.GRANTED
    assert not authz.allow_publish(me, "in/dev-1")


@pytest.mark.parametrize("acl", [{}, []])
async def test_empty_acl_claim_grants_nothing(hs: JwtAuthenticator, acl: Any) -> None:
    decision = await decide(hs, make(claims(acl=acl), SECRET, "HS256"))
    assert decision.outcome is Outcome.ALLOW and decision.acl is not None
    me = ClientInfo("dev-1", "alice")
    assert not decision.acl.allow_publish(me, "a") and not decision.acl.allow_read(me, "a")
    assert decision.acl.subscribe_access(me, "#") is SubscribeAccess.DENIED


@pytest.mark.parametrize(
    "acl",
    [
        None, "pub", 3, {"pub": "a/b"}, {"pub": [1]}, {"pub": [""]}, {"deny": ["a"]}, {"pub": ["a/#/b"]},
        {"sub": ["eq t/#"]}, {"pub": ["t/${peerhost}"]}, ["a/b"], [{"permission": "allow", "action": "pub",
                                                                    "topic": "a"}],
        [{"permission": "maybe", "action": "all", "topic": "a"}], [{"permission": "allow", "action": "all"}],
        [{"permission": "allow", "action": "all", "topic": "a", "qos": [1]}],
        [{"permission": "allow", "action": "publish", "topic": "a", "retain": False}],
        [{"permission": "deny", "action": "all", "topic": "a", "colour": "red"}],
        [{"permission": "allow", "action": "all", "topic": "a+"}],
    ],
)
async def test_malformed_acl_claim_denies(hs: JwtAuthenticator, acl: Any) -> None:
    await denied(hs, make(claims(acl=acl), SECRET, "HS256"), "malformed acl claim")


async def test_acl_claim_name_is_configurable() -> None:
    auth = JwtAuthenticator(secret=SECRET, acl_claim="perms")
    decision = await decide(auth, make(claims(perms={"pub": ["a"]}, acl="ignored"), SECRET, "HS256"))
    assert decision.outcome is Outcome.ALLOW and decision.acl is not None
    assert decision.acl.allow_publish(ClientInfo("c", "alice"), "a")
    none = JwtAuthenticator(secret=SECRET, acl_claim=None)
    assert (await decide(none, make(claims(acl="junk"), SECRET, "HS256"))).acl is None


def test_grants_from_acl_claim_maps_access_words() -> None:
    assert grants_from_acl_claim({"pub": ["a"], "sub": ["b"], "all": ["c/${clientid}"]}) == [
        ("write", "a"), ("read", "b"), ("readwrite", "c/%c")]
    assert grants_from_acl_claim([{"permission": "deny", "action": "subscribe", "topic": "x/${username}"}]) == [
        ("deny", "x/%u")]


# --- configuration, keys and reload --------------------------------------------------------------------------


def test_configuration_errors(tmp_path: Path, ec_key: ec.EllipticCurvePrivateKey) -> None:
    with pytest.raises(ValueError, match="configure a secret"):
        JwtAuthenticator()
    with pytest.raises(ValueError, match="at least 32 bytes"):
        JwtAuthenticator(secret="short")
    with pytest.raises(ValueError, match="leeway"):
        JwtAuthenticator(secret=SECRET, leeway=-1)
    with pytest.raises(ValueError, match="cannot read"):
        JwtAuthenticator(public_key_file=tmp_path / "missing.pem")
    weak = rsa.generate_private_key(public_exponent=65537, key_size=1024)
    with pytest.raises(ValueError, match="1024 bits"):
        JwtAuthenticator(public_key_file=write_pem(tmp_path / "weak.pem", weak))
    private = tmp_path / "private.pem"
    private.write_bytes(ec_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                             serialization.NoEncryption()))
    with pytest.raises(ValueError, match="private key"):
        JwtAuthenticator(public_key_file=private)
    (tmp_path / "junk.pem").write_text("not a key")
    with pytest.raises(ValueError, match="not a PEM public key"):
        JwtAuthenticator(public_key_file=tmp_path / "junk.pem")


@pytest.mark.parametrize(
    ("document", "fragment"),
    [
        ("not json", "not JSON"),
        ('{"nokeys": []}', "no \"keys\" list"),
        ('{"keys": []}', "no signing keys"),
        ('{"keys": [{"kty": "oct", "k": "c2VjcmV0"}]}', "symmetric"),
        ('{"keys": [{"kty": "RSA", "n": "AQAB", "e": "AQAB", "d": "AQAB"}]}', "private key material"),
        ('{"keys": [{"kty": "RSA", "n": "!!", "e": "AQAB"}]}', "invalid JWK"),
    ],
)
def test_bad_jwks_files(tmp_path: Path, document: str, fragment: str) -> None:
    path = tmp_path / "jwks.json"
    path.write_text(document)
    with pytest.raises(ValueError, match=fragment):
        JwtAuthenticator(jwks_file=path)


def test_jwks_key_rules(tmp_path: Path, rsa_key: rsa.RSAPrivateKey, ec_key: ec.EllipticCurvePrivateKey) -> None:
    entry = RSAAlgorithm.to_jwk(rsa_key.public_key(), as_dict=True)
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps({"keys": [{**entry, "kid": "a"}, {**entry, "kid": "a"}]}))
    with pytest.raises(ValueError, match="used twice"):
        JwtAuthenticator(jwks_file=path)
    path.write_text(json.dumps({"keys": [entry, {**entry, "kid": "b"}]}))
    with pytest.raises(ValueError, match="needs a kid"):
        JwtAuthenticator(jwks_file=path)
    path.write_text(json.dumps({"keys": [{**entry, "kid": "a", "alg": "ES256"}]}))
    with pytest.raises(ValueError, match="invalid JWK"):
        JwtAuthenticator(jwks_file=path)
    ec_entry = ECAlgorithm.to_jwk(ec_key.public_key(), as_dict=True)
    path.write_text(json.dumps({"keys": [{**ec_entry, "kid": "a", "alg": "ES384"}]}))  # P-256 key
    with pytest.raises(ValueError, match="does not fit"):
        JwtAuthenticator(jwks_file=path)
    enc = {**ec_entry, "use": "enc", "kid": "e"}
    path.write_text(json.dumps({"keys": [{**entry, "kid": "a"}, enc]}))
    assert JwtAuthenticator(jwks_file=path)  # encryption keys are skipped


async def test_jwks_alg_pins_the_algorithm(tmp_path: Path, rsa_key: rsa.RSAPrivateKey) -> None:
    entry = {**RSAAlgorithm.to_jwk(rsa_key.public_key(), as_dict=True), "kid": "a", "alg": "RS256"}
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps({"keys": [entry]}))
    auth = JwtAuthenticator(jwks_file=path)
    assert (await decide(auth, make(claims(), rsa_key, "RS256", kid="a"))).outcome is Outcome.ALLOW
    await denied(auth, make(claims(), rsa_key, "PS256", kid="a"), "algorithm not allowed")


async def test_reload_swaps_keys_and_keeps_old_ones_on_error(tmp_path: Path, rsa_key: rsa.RSAPrivateKey,
                                                             rsa_key2: rsa.RSAPrivateKey) -> None:
    path = write_pem(tmp_path / "rsa.pem", rsa_key)
    auth = JwtAuthenticator(public_key_file=path)
    old, new = make(claims(), rsa_key, "RS256"), make(claims(), rsa_key2, "RS256")
    path.write_text("-----BEGIN PUBLIC KEY-----\ngarbage\n-----END PUBLIC KEY-----\n")
    with pytest.raises(ValueError, match="not a PEM public key"):
        auth.reload()
    assert (await decide(auth, old)).outcome is Outcome.ALLOW
    path.unlink()
    with pytest.raises(ValueError, match="cannot read"):
        auth.reload()
    assert (await decide(auth, old)).outcome is Outcome.ALLOW
    write_pem(path, rsa_key2)
    auth.reload()
    assert (await decide(auth, new)).outcome is Outcome.ALLOW
    await denied(auth, old, "bad signature")
    await auth.close()


async def test_reload_jwks(tmp_path: Path, rsa_key: rsa.RSAPrivateKey, rsa_key2: rsa.RSAPrivateKey) -> None:
    path = write_jwks(tmp_path / "jwks.json", {"k1": rsa_key})
    auth = JwtAuthenticator(jwks_file=path)
    token1, token2 = make(claims(), rsa_key, "RS256", kid="k1"), make(claims(), rsa_key2, "RS256", kid="k2")
    await denied(auth, token2, "unknown key id")
    path.write_text('{"keys": [')
    with pytest.raises(ValueError, match="not JSON"):
        auth.reload()
    assert (await decide(auth, token1)).outcome is Outcome.ALLOW
    write_jwks(path, {"k1": rsa_key, "k2": rsa_key2})  # rotation: both keys valid for a while
    auth.reload()
    assert (await decide(auth, token1)).outcome is Outcome.ALLOW
    assert (await decide(auth, token2)).outcome is Outcome.ALLOW


def test_from_settings(tmp_path: Path, rsa_key: rsa.RSAPrivateKey) -> None:
    assert JwtAuthenticator.from_settings(Settings()) is None
    assert JwtAuthenticator.from_settings(Settings(jwt_secret="")) is None
    path = write_pem(tmp_path / "rsa.pem", rsa_key)
    auth = JwtAuthenticator.from_settings(Settings(
        jwt_secret=SECRET, jwt_public_key=path, jwt_username_claim="name", jwt_acl_claim="perm",
        jwt_audience="aud", jwt_issuer="iss", jwt_leeway=2.5))
    assert auth is not None
    assert (auth.public_key_file, auth.jwks_file, auth.username_claim, auth.acl_claim) == (path, None, "name", "perm")
    assert (auth.audience, auth.issuer, auth.leeway) == ("aud", "iss", 2.5)


async def test_pem_key_and_jwks_together(tmp_path: Path, rsa_key: rsa.RSAPrivateKey,
                                         rsa_key2: rsa.RSAPrivateKey) -> None:
    auth = JwtAuthenticator(public_key_file=write_pem(tmp_path / "pem.pem", rsa_key2),
                            jwks_file=write_jwks(tmp_path / "jwks.json", {"r1": rsa_key}))
    assert (await decide(auth, make(claims(), rsa_key, "RS256", kid="r1"))).outcome is Outcome.ALLOW
    assert (await decide(auth, make(claims(), rsa_key2, "RS256"))).outcome is Outcome.ALLOW  # no kid: PEM key
    await denied(auth, make(claims(), rsa_key2, "RS256", kid="other"), "unknown key id")  # never falls back
