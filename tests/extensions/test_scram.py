"""Tests for extensions.scram (SCRAM-SHA-256 server), extensions.scram_credentials and extensions.enhanced_auth."""

from __future__ import annotations

import base64
import hashlib
import hmac
from pathlib import Path

import pytest

from tidewire.extensions.enhanced_auth import AuthResult, AuthSession, EnhancedAuth, EnhancedAuthRegistry
from tidewire.extensions.scram import ScramSha256
from tidewire.extensions.scram_credentials import CredentialEntry, Credentials, credential_line, hash_password, saslprep

# RFC 7677 §3 example exchange (user "user", password "pencil")
RFC_CLIENT_NONCE = "rOprNGfwEbeRWgbNEkqO"
RFC_SERVER_NONCE = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
RFC_SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
RFC_CLIENT_FIRST = b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
RFC_SERVER_FIRST = b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
RFC_CLIENT_FINAL = (b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                    b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
RFC_SERVER_FINAL = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="

ITERATIONS = 4096


class ScramClient:
    """Minimal SCRAM-SHA-256 client from RFC 5802 §3 with plain hashlib (independent of the server)."""

    def __init__(self, username: str, password: str, nonce: str = "fyko+d2lbbFgONRv9qkxdawL",
                 gs2_header: str = "n,,") -> None:
        self.username = username
        self.password = password
        self.nonce = nonce
        self.gs2_header = gs2_header
        escaped = username.replace("=", "=3D").replace(",", "=2C")
        self.first_bare = f"n={escaped},r={nonce}"
        self.server_signature = b""

    def first(self) -> bytes:
        return (self.gs2_header + self.first_bare).encode()

    def final(self, server_first: bytes, nonce_override: str | None = None) -> bytes:
        attrs = dict(item.split("=", 1) for item in server_first.decode().split(","))
        assert attrs["r"].startswith(self.nonce)
        salted = hashlib.pbkdf2_hmac("sha256", self.password.encode(), base64.b64decode(attrs["s"]),
                                     int(attrs["i"]))
        client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
        stored_key = hashlib.sha256(client_key).digest()
        cbind = base64.b64encode(self.gs2_header.encode()).decode()
        without_proof = f"c={cbind},r={nonce_override or attrs['r']}"
        auth_message = f"{self.first_bare},{server_first.decode()},{without_proof}".encode()
        signature = hmac.new(stored_key, auth_message, hashlib.sha256).digest()
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        server_key = hmac.new(salted, b"Server Key", hashlib.sha256).digest()
        self.server_signature = hmac.new(server_key, auth_message, hashlib.sha256).digest()
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def verify(self, server_final: bytes) -> bool:
        return server_final == b"v=" + base64.b64encode(self.server_signature)


@pytest.fixture(scope="module")
def credentials() -> Credentials:
    lines = ["# test users", "",
             credential_line("user", "pencil", RFC_SALT, ITERATIONS),
             credential_line("al,ice=x", "s3cret", None, ITERATIONS),
             credential_line("dev:7", "pw:with:colons", None, ITERATIONS)]
    return Credentials.parse("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def mechanism(credentials: Credentials) -> ScramSha256:
    return ScramSha256(credentials)


def begin(mech: EnhancedAuth, username: str | None = None) -> AuthSession:
    session = mech.begin("SCRAM-SHA-256", "client-1", username)
    assert session is not None
    return session


def assert_failed(result: AuthResult, fragment: str = "") -> None:
    assert result.done and not result.success and result.data is None
    assert fragment in result.reason


def exchange(mech: ScramSha256, client: ScramClient, connect_username: str | None = None) -> AuthResult:
    session = begin(mech, connect_username)
    first = session.step(client.first())
    assert not first.done and first.data is not None
    return session.step(client.final(first.data))


# --- RFC 7677 test vector -------------------------------------------------------------------------

def test_rfc7677_vector(credentials: Credentials) -> None:
    mech = ScramSha256(credentials, nonce_factory=lambda: RFC_SERVER_NONCE)
    session = begin(mech)
    first = session.step(RFC_CLIENT_FIRST)
    assert first == AuthResult(False, False, RFC_SERVER_FIRST)
    final = session.step(RFC_CLIENT_FINAL)
    assert final.done and final.success
    assert final.data == RFC_SERVER_FINAL
    assert final.username == "user"


def test_rfc7677_credentials_match_rfc_keys() -> None:
    # The stored line for "pencil" must verify the RFC's proof; recompute the keys independently too.
    line = hash_password("pencil", RFC_SALT, 4096)
    _, iterations, salt, stored, server = line.split(":")
    salted = hashlib.pbkdf2_hmac("sha256", b"pencil", RFC_SALT, 4096)
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    assert iterations == "4096" and base64.b64decode(salt) == RFC_SALT
    assert base64.b64decode(stored) == hashlib.sha256(client_key).digest()
    assert base64.b64decode(server) == hmac.new(salted, b"Server Key", hashlib.sha256).digest()


def test_rfc_proof_rejected_with_other_server_nonce(credentials: Credentials) -> None:
    # Replaying the RFC's client-final against a different server nonce must fail (nonce mismatch).
    session = begin(ScramSha256(credentials))
    assert not session.step(RFC_CLIENT_FIRST).done
    assert_failed(session.step(RFC_CLIENT_FINAL), "nonce")


# --- full exchanges -------------------------------------------------------------------------------

@pytest.mark.parametrize(("username", "password"), [("user", "pencil"), ("al,ice=x", "s3cret"),
                                                      ("dev:7", "pw:with:colons")])
def test_full_exchange(mechanism: ScramSha256, username: str, password: str) -> None:
    client = ScramClient(username, password)
    result = exchange(mechanism, client)
    assert result.done and result.success and result.data is not None
    assert client.verify(result.data)
    assert result.username == username


def test_connect_username_must_match(mechanism: ScramSha256) -> None:
    assert exchange(mechanism, ScramClient("user", "pencil"), connect_username="user").success
    session = begin(mechanism, "someone-else")
    assert_failed(session.step(ScramClient("user", "pencil").first()), "User Name")


def test_gs2_y_flag_accepted(mechanism: ScramSha256) -> None:
    client = ScramClient("user", "pencil", gs2_header="y,,")
    assert exchange(mechanism, client).success


def test_authzid_equal_to_user_accepted_other_refused(mechanism: ScramSha256) -> None:
    assert exchange(mechanism, ScramClient("user", "pencil", gs2_header="n,a=user,")).success
    session = begin(mechanism)
    other_identity = ScramClient("user", "pencil", gs2_header="n,a=admin,")
    assert_failed(session.step(other_identity.first()), "authorization")


def test_server_nonces_are_fresh(mechanism: ScramSha256) -> None:
    client = ScramClient("user", "pencil")
    firsts = {begin(mechanism).step(client.first()).data for _ in range(5)}
    assert len(firsts) == 5


def test_reauthentication_uses_a_new_session(mechanism: ScramSha256) -> None:
    client = ScramClient("user", "pencil")
    session = begin(mechanism)
    first = session.step(client.first())
    assert first.data is not None
    assert session.step(client.final(first.data)).success
    assert_failed(session.step(client.first()), "finished")  # a finished session cannot be reused
    assert exchange(mechanism, ScramClient("user", "pencil", nonce="another-nonce")).success


# --- failures -------------------------------------------------------------------------------------

def test_wrong_password(mechanism: ScramSha256) -> None:
    result = exchange(mechanism, ScramClient("user", "pencil2"))
    assert_failed(result, "authentication failed")


def test_unknown_user_looks_like_wrong_password(mechanism: ScramSha256, credentials: Credentials) -> None:
    session = begin(mechanism)
    first = session.step(ScramClient("nobody", "pencil").first())
    assert not first.done and first.data is not None
    real = begin(mechanism).step(ScramClient("user", "pencil").first())
    assert real.data is not None
    # same shape: r=..., s=<16-byte salt>, i=<usual iterations>
    fake_attrs = dict(item.split("=", 1) for item in first.data.decode().split(","))
    real_attrs = dict(item.split("=", 1) for item in real.data.decode().split(","))
    assert fake_attrs.keys() == real_attrs.keys()
    assert len(base64.b64decode(fake_attrs["s"])) == len(base64.b64decode(real_attrs["s"]))
    assert fake_attrs["i"] == real_attrs["i"] == str(credentials.typical_iterations())
    # the fake salt is stable across attempts, so probing twice reveals nothing
    again = begin(mechanism).step(ScramClient("nobody", "x").first())
    assert again.data is not None and f"s={fake_attrs['s']}," in again.data.decode()
    wrong_password = exchange(mechanism, ScramClient("user", "nope"))
    unknown = session.step(ScramClient("nobody", "pencil").final(first.data))
    assert_failed(unknown)
    assert unknown.reason == wrong_password.reason


class _FixedEntry(ScramSha256):
    """Looks every user up as one fixed entry, flagged known or not, so a proof can be forged for it."""

    entry = CredentialEntry("ghost", 4096, b"s" * 16, hashlib.sha256(b"k" * 32).digest(), b"v" * 32)
    known = False

    def _entry_for(self, username: str) -> tuple[CredentialEntry, bool]:
        return self.entry, self.known


@pytest.mark.parametrize("known", [True, False])
def test_unknown_user_cannot_pass_even_with_matching_proof(credentials: Credentials, known: bool) -> None:
    # Defence in depth: even if a proof matched the stand-in key, an unknown user never succeeds.
    mech = _FixedEntry(credentials)
    mech.known = known
    session = begin(mech)
    first = session.step(b"n,,n=ghost,r=abc")
    assert first.data is not None
    without_proof = "c=biws,r=" + first.data.decode().split(",")[0][2:]
    auth_message = f"n=ghost,r=abc,{first.data.decode()},{without_proof}".encode()
    signature = hmac.new(mech.entry.stored_key, auth_message, hashlib.sha256).digest()
    proof = bytes(a ^ b for a, b in zip(b"k" * 32, signature, strict=True))
    result = session.step(f"{without_proof},p={base64.b64encode(proof).decode()}".encode())
    assert result.success is known and result.done


def test_channel_binding_request_refused(mechanism: ScramSha256) -> None:
    session = begin(mechanism)
    assert_failed(session.step(b"p=tls-exporter,,n=user,r=abc"), "channel binding")


def test_channel_binding_data_must_match_header(mechanism: ScramSha256) -> None:
    client = ScramClient("user", "pencil")
    session = begin(mechanism)
    first = session.step(client.first())
    assert first.data is not None
    final = client.final(first.data).replace(b"c=biws", b"c=eSws")  # "y,," instead of the "n,," sent
    assert_failed(session.step(final), "channel binding")


def test_nonce_tampering(mechanism: ScramSha256) -> None:
    client = ScramClient("user", "pencil")
    session = begin(mechanism)
    first = session.step(client.first())
    assert first.data is not None
    server_nonce = first.data.decode().split(",")[0][2:]
    assert_failed(session.step(client.final(first.data, nonce_override=server_nonce + "x")), "nonce")
    session = begin(mechanism)
    first = session.step(client.first())  # now drop the server's part of the nonce
    assert first.data is not None
    assert_failed(session.step(client.final(first.data, nonce_override=client.nonce)), "nonce")


def test_tampered_proof(mechanism: ScramSha256) -> None:
    client = ScramClient("user", "pencil")
    session = begin(mechanism)
    first = session.step(client.first())
    assert first.data is not None
    final = client.final(first.data)
    head, proof = final.rsplit(b",p=", 1)
    raw = bytearray(base64.b64decode(proof))
    raw[0] ^= 1
    assert_failed(session.step(head + b",p=" + base64.b64encode(bytes(raw))), "authentication failed")


@pytest.mark.parametrize(
    ("message", "fragment"),
    [
        (None, "missing"),
        (b"", "missing"),
        (b"n=user,r=abc", "gs2"),
        (b"x,,n=user,r=abc", "gs2"),
        (b"n,", "gs2"),
        (b"n,,r=abc,n=user", "malformed"),
        (b"n,,n=user", "malformed"),
        (b"n,,n=,r=abc", "username"),
        (b"n,,n=us=2Xer,r=abc", "escape"),
        (b"n,,n=user,r=", "nonce"),
        (b"n,,n=user,r=a\x01b", "nonce"),
        (b"n,,n=user,r=abc,1bad", "attribute"),
        (b"n,,m=ext,n=user,r=abc", "mandatory extension"),
        (b"n,,n=\xff\xfe,r=abc", "encoding"),
        (b"n,,n=user,r=" + b"a" * 5000, "too long"),
    ],
)
def test_malformed_client_first(mechanism: ScramSha256, message: bytes | None, fragment: str) -> None:
    session = begin(mechanism)
    assert_failed(session.step(message), fragment)
    assert_failed(session.step(ScramClient("user", "pencil").first()))  # a failed exchange stays failed


@pytest.mark.parametrize(
    "mutate",
    [
        lambda final: final.split(b",p=")[0],  # no proof
        lambda final: final.replace(b",p=", b",p=!!"),  # proof not base64
        lambda final: final.rsplit(b",p=", 1)[0] + b",p=AAAA",  # proof too short
        lambda final: final.replace(b"c=biws,", b""),  # no channel binding attribute
        lambda final: final.replace(b"c=biws", b"c=b!ws"),  # channel binding not base64
        lambda final: final + b",x=trailing",  # proof is not last
        lambda final: b"\xff" + final,
    ],
)
def test_malformed_client_final(mechanism: ScramSha256, mutate: object) -> None:
    client = ScramClient("user", "pencil")
    session = begin(mechanism)
    first = session.step(client.first())
    assert first.data is not None
    assert callable(mutate)
    result = session.step(mutate(client.final(first.data)))
    assert_failed(result)


def test_client_final_extension_accepted(mechanism: ScramSha256) -> None:
    # Unknown extensions before the proof are part of AuthMessage and ignored otherwise (RFC 5802 §5.1).
    client = ScramClient("user", "pencil")
    session = begin(mechanism)
    first = session.step(client.first())
    assert first.data is not None
    attrs = dict(item.split("=", 1) for item in first.data.decode().split(","))
    salted = hashlib.pbkdf2_hmac("sha256", b"pencil", base64.b64decode(attrs["s"]), int(attrs["i"]))
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    without_proof = f"c=biws,r={attrs['r']},x=ext"
    auth_message = f"{client.first_bare},{first.data.decode()},{without_proof}".encode()
    signature = hmac.new(hashlib.sha256(client_key).digest(), auth_message, hashlib.sha256).digest()
    proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
    assert session.step(f"{without_proof},p={base64.b64encode(proof).decode()}".encode()).success


# --- registry -------------------------------------------------------------------------------------

class _Other:
    methods = frozenset({"TOKEN"})

    def begin(self, method: str, client_id: str, username: str | None) -> AuthSession | None:
        return None


def test_registry_dispatch(mechanism: ScramSha256) -> None:
    registry = EnhancedAuthRegistry([mechanism, _Other()])
    assert registry.methods == {"SCRAM-SHA-256", "TOKEN"}
    assert registry.begin("KERBEROS", "c", None) is None
    assert mechanism.begin("TOKEN", "c", None) is None
    client = ScramClient("user", "pencil")
    session = begin(registry)
    first = session.step(client.first())
    assert first.data is not None
    assert session.step(client.final(first.data)).success


def test_registry_rejects_duplicate_methods(mechanism: ScramSha256) -> None:
    with pytest.raises(ValueError, match="twice"):
        EnhancedAuthRegistry([mechanism, ScramSha256(Credentials({}))])


# --- credentials file -----------------------------------------------------------------------------

def test_hash_password_file_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "scram.creds"
    path.write_text("# users\n\n" + credential_line("alice", "wonder land", None, 4096) + "\n"
                    + "  # indented comment\n" + "bob:" + hash_password("builder", iterations=5000) + "\n")
    creds = Credentials.load(path)
    assert len(creds) == 2 and creds.lookup("carol") is None
    alice, bob = creds.lookup("alice"), creds.lookup("bob")
    assert alice is not None and bob is not None
    assert (alice.iterations, bob.iterations, len(alice.salt)) == (4096, 5000, 16)
    assert alice.salt != bob.salt
    mech = ScramSha256(creds)
    assert exchange(mech, ScramClient("alice", "wonder land")).success
    assert exchange(mech, ScramClient("bob", "builder")).success
    assert not exchange(mech, ScramClient("bob", "wonder land")).success


def test_hash_password_salts_differ() -> None:
    assert hash_password("pw", iterations=1) != hash_password("pw", iterations=1)
    assert hash_password("pw", b"salt", 1) == hash_password("pw", b"salt", 1)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("user:SCRAM-SHA-256:4096:c2FsdA==\n", "expected"),
        ("user:SCRAM-SHA-1:4096:c2FsdA==:" + "A" * 44 + ":" + "A" * 44, "mechanism"),
        ("user:SCRAM-SHA-256:0:c2FsdA==:" + "A" * 44 + ":" + "A" * 44, "iteration"),
        ("user:SCRAM-SHA-256:x:c2FsdA==:" + "A" * 44 + ":" + "A" * 44, "iteration"),
        ("user:SCRAM-SHA-256:4096:c2F*dA==:" + "A" * 44 + ":" + "A" * 44, "salt"),
        ("user:SCRAM-SHA-256:4096:c2FsdA==:AAAA:" + "A" * 44, "32 bytes"),
        (":SCRAM-SHA-256:4096:c2FsdA==:" + "A" * 44 + ":" + "A" * 44, "empty username"),
    ],
)
def test_credentials_parse_errors(text: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment) as info:
        Credentials.parse("# header\n" + text, "creds.txt")
    assert "creds.txt:2:" in str(info.value)


def test_credentials_duplicate_user() -> None:
    line = credential_line("u", "p", b"salt", 1)
    with pytest.raises(ValueError, match="duplicate"):
        Credentials.parse(f"{line}\n{line}\n")


def test_credential_line_rejects_unstorable_usernames() -> None:
    for bad in ("", "#root", " padded"):
        with pytest.raises(ValueError):
            credential_line(bad, "pw", b"salt", 1)


def test_saslprep() -> None:
    assert saslprep("pencil") == "pencil"
    assert saslprep("I\u00adX") == "IX"  # soft hyphen maps to nothing
    assert saslprep("\u2168") == "IX"  # NFKC
    assert saslprep("a\u00a0b") == "a b"  # non-ASCII space maps to space
    for bad in ("a\x07b", "a\u0627b1"):  # control character; mixed bidi
        with pytest.raises(ValueError):
            saslprep(bad)
    # a non-ASCII password verifies when the client normalises the same way
    creds = Credentials.parse(credential_line("u", "I\u00adX", None, 1))
    assert exchange(ScramSha256(creds), ScramClient("u", "IX")).success
