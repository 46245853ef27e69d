"""JWT authentication source: a signed token in the password field proves a user name and, optionally, its grants.

What is accepted (each refusal is a DENY with BAD_CREDENTIALS and a reason naming the failed check, never the
token):

* The password must be JWT-shaped (three base64url segments, the first a JSON object) or the source IGNOREs it,
  so a password file elsewhere in the chain can still handle ordinary passwords.
* The algorithm comes from the header but must belong to the key it would be checked with: HS256/384/512 only
  with ``secret`` (each only when the secret is at least as long as its hash, RFC 7518 §3.2), RS*/PS* only with
  an RSA key (>= 2048 bits), ES256/384/512 only with the EC key of the matching curve, EdDSA only with an Ed25519
  or Ed448 key. ``none`` is never accepted; an HMAC algorithm is never checked against a public key, nor the
  reverse, so the classic algorithm-confusion attack has nothing to work with.
* Key choice: HMAC tokens use the secret. Other tokens carrying a ``kid`` use that key of the JWKS file when one
  is configured (unknown kid: DENY); otherwise the PEM public key; a JWKS file holding a single key also serves
  tokens without ``kid``. ``jku``/``x5u``/``jwk`` headers are never followed. A ``crit`` header is refused.
* Claims: ``exp``, ``nbf`` and ``iat`` are checked with ``leeway`` seconds of skew; ``aud`` must contain
  ``audience`` when configured, and, as RFC 7519 §4.1.3 requires, a token that names an audience is refused when
  none is configured; ``iss`` must equal ``issuer`` when configured. ``exp`` is optional (as in EMQX); when
  present the connection must be closed at ``exp + leeway`` (``AuthDecision.expires_at``).
* The user name is the ``username_claim`` claim: a non-empty string without U+0000, at most 65535 UTF-8 bytes.

ACL claim (``acl_claim``), as EMQX; topics may use ``%c``/``%u`` or EMQX 5's ``${clientid}``/``${username}``:

* EMQX 4 form ``{"pub": [...], "sub": [...], "all": [...]}``: write / read / readwrite grants.
* EMQX 5 form ``[{"permission": "allow"|"deny", "action": "publish"|"subscribe"|"all", "topic": "..."}]``.
  Our ACL engine is deny-first, unlike EMQX's first match: any matching deny wins over every allow, whatever the
  order, and a deny covers both directions whatever its action. Rule fields that would narrow a rule (``qos``,
  ``retain``, ``clientid_re``, ``ipaddr``...) cannot be enforced here: on a deny they are ignored (the rule
  denies more), on an allow they make the claim malformed (it would grant more).
* The claim grants exactly what it lists and nothing else (an empty list or object grants nothing). Anything
  malformed (unknown key, non-string topic, invalid filter, ``eq`` topics, other ``${...}`` placeholders, a null
  claim) is a DENY: a claim we cannot read is never taken as "no restriction". No claim: the ACL file applies.

Verification is a fraction of a millisecond of CPU (whole decision, measured on a shared 2-core EPYC: HS256
40-50 µs, RS256 65-110 µs, ES256 105-180 µs, plus about 30 µs when an ACL claim is compiled), far below the cost
of the TLS handshake before it, so it runs inline on the event loop rather than in a thread.
"""

from __future__ import annotations

import binascii
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeGuard

import jwt
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa
from jwt.utils import base64url_decode

from tidewire.extensions.acl import AclFile
from tidewire.extensions.authentication import IGNORE, AuthDecision, AuthRequest, Failure, Outcome

if TYPE_CHECKING:
    from tidewire.gateway.config import Settings

MAX_TOKEN_BYTES = 16384  # a token with a few hundred ACL rules fits; bigger ones are refused
MAX_HEADER_CHARS = 2048  # base64url characters of the header segment we are willing to decode
MAX_USERNAME_BYTES = 65535  # an MQTT UTF-8 string
MIN_RSA_BITS = 2048

_HMAC_ALGS = {"HS256": 32, "HS384": 48, "HS512": 64}  # algorithm -> minimum secret bytes (RFC 7518 §3.2)
_RSA_ALGS = frozenset({"RS256", "RS384", "RS512", "PS256", "PS384", "PS512"})
_EC_ALGS = {"secp256r1": "ES256", "secp384r1": "ES384", "secp521r1": "ES512"}
_B64URL = re.compile(r"[A-Za-z0-9_-]*")
_EMQX_PLACEHOLDERS = (("${clientid}", "%c"), ("${username}", "%u"))
_OLD_FORM = {"pub": "write", "sub": "read", "all": "readwrite"}
_ACTIONS = {"publish": "write", "subscribe": "read", "all": "readwrite"}
# EMQX 5 rule fields that narrow when a rule applies; see the module docstring for how they are treated.
_NARROWING_FIELDS = frozenset(
    {"qos", "retain", "clientid_re", "username_re", "ipaddr", "zone", "zone_re", "listener", "listener_re"}
)

PublicKey = rsa.RSAPublicKey | ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey | ed448.Ed448PublicKey


@dataclass(frozen=True, slots=True)
class _Key:
    key: PublicKey | bytes
    algorithms: frozenset[str]


@dataclass(frozen=True, slots=True)
class _Keys:
    secret: _Key | None
    public: _Key | None
    jwks: Mapping[str, _Key]  # by kid
    jwks_single: _Key | None  # the JWKS file's only key: also used for tokens without kid

    def for_public_alg(self, kid: str | None) -> _Key | None:
        if kid is not None and self.jwks:
            return self.jwks.get(kid)
        if self.public is not None:
            return self.public
        return self.jwks_single


# PyJWT's refusals and what the log says of each; fixed texts, never token data.
_REFUSALS: tuple[tuple[type[jwt.InvalidTokenError], str], ...] = (
    (jwt.InvalidSignatureError, "bad signature"),
    (jwt.ExpiredSignatureError, "token expired"),
    (jwt.ImmatureSignatureError, "token not yet valid"),
    (jwt.InvalidIssuerError, "wrong issuer"),
    (jwt.InvalidAlgorithmError, "algorithm not allowed for the configured keys"),
)


def _deny(reason: str) -> AuthDecision:
    return AuthDecision(Outcome.DENY, failure=Failure.BAD_CREDENTIALS, reason=reason)


class JwtAuthenticator:
    """The ``jwt`` source of the auth chain; see the module docstring for what it accepts."""

    __slots__ = (
        "_jwt",
        "_keys",
        "_secret",
        "acl_claim",
        "audience",
        "issuer",
        "jwks_file",
        "leeway",
        "max_token_bytes",
        "name",
        "public_key_file",
        "tenant_claim",
        "username_claim",
    )

    def __init__(
        self,
        *,
        secret: str | bytes | None = None,
        public_key_file: str | Path | None = None,
        jwks_file: str | Path | None = None,
        username_claim: str = "sub",
        acl_claim: str | None = "acl",
        audience: str | None = None,
        issuer: str | None = None,
        leeway: float = 0.0,
        max_token_bytes: int = MAX_TOKEN_BYTES,
        tenant_claim: str | None = None,
    ) -> None:
        """ValueError when no key is given, a key is weak or unreadable, or an option is out of range."""
        if secret is None and public_key_file is None and jwks_file is None:
            raise ValueError("jwt: configure a secret, a public key file or a JWKS file")
        if not username_claim:
            raise ValueError("jwt: username_claim must not be empty")
        if not math.isfinite(leeway) or leeway < 0:
            raise ValueError("jwt: leeway must be a finite number >= 0")
        if max_token_bytes < 1:
            raise ValueError("jwt: max_token_bytes must be >= 1")
        self.name = "jwt"
        self.tenant_claim = tenant_claim  # names the client's tenant (gateway.core.tenants); None: not read
        self._secret = _secret_key(secret) if secret is not None else None
        self.public_key_file = Path(public_key_file) if public_key_file is not None else None
        self.jwks_file = Path(jwks_file) if jwks_file is not None else None
        self.username_claim = username_claim
        self.acl_claim = acl_claim or None
        self.audience = audience
        self.issuer = issuer
        self.leeway = float(leeway)
        self.max_token_bytes = max_token_bytes
        # Key lengths are checked at load, so enforcing them here never fires; it is a second line of defence.
        self._jwt = jwt.PyJWT(options={"enforce_minimum_key_length": True})
        self._keys = self._load_keys()

    @classmethod
    def from_settings(cls, settings: Settings) -> JwtAuthenticator | None:
        """The source configured by the ``jwt_*`` settings; None when no JWT key is configured."""
        if not settings.jwt_configured:
            return None
        return cls(
            secret=settings.jwt_secret or None,
            public_key_file=settings.jwt_public_key,
            jwks_file=settings.jwt_jwks_file,
            username_claim=settings.jwt_username_claim,
            acl_claim=settings.jwt_acl_claim,
            audience=settings.jwt_audience,
            issuer=settings.jwt_issuer,
            leeway=settings.jwt_leeway,
            tenant_claim=settings.tenant_jwt_claim,
        )

    def _load_keys(self) -> _Keys:
        public = _load_public_key(self.public_key_file) if self.public_key_file is not None else None
        jwks: dict[str, _Key] = {}
        single: _Key | None = None
        if self.jwks_file is not None:
            jwks, single = _load_jwks(self.jwks_file)
        return _Keys(self._secret, public, jwks, single)

    def reload(self) -> None:
        """Re-read the key files; on error the previous keys stay in use and ValueError says why."""
        self._keys = self._load_keys()

    async def close(self) -> None:
        return None

    async def authenticate(self, request: AuthRequest) -> AuthDecision:
        if not request.password:
            return IGNORE
        return self.check(request.password)

    def check(self, password: bytes) -> AuthDecision:
        """The whole decision for one password (synchronous: verification is cheap)."""
        parsed = _jwt_shape(password)
        if parsed is None:
            return IGNORE
        token, header = parsed
        if len(token) > self.max_token_bytes:
            return _deny("token too large")
        if "crit" in header:
            return _deny("unsupported critical header")
        alg = header.get("alg")
        if not isinstance(alg, str) or not alg:
            return _deny("header has no algorithm")
        if alg.lower() == "none":
            return _deny("unsigned token (alg none)")
        keys = self._keys
        if alg in _HMAC_ALGS:
            key = keys.secret
        else:
            kid = header.get("kid")
            if kid is not None and not isinstance(kid, str):
                return _deny("malformed key id")
            key = keys.for_public_alg(kid)
            if key is None and kid is not None and keys.jwks:
                return _deny("unknown key id")
        if key is None or alg not in key.algorithms:
            return _deny("algorithm not allowed for the configured keys")
        try:
            claims = self._jwt.decode(
                token,
                key.key,
                algorithms=[alg],
                audience=self.audience,
                issuer=self.issuer,
                leeway=self.leeway,
            )
        except jwt.MissingRequiredClaimError as exc:
            return _deny(f"missing {exc.claim} claim")  # names one of our configured claims, never token data
        except jwt.InvalidAudienceError:
            if self.audience is None:
                return _deny("token has an audience but none is configured")
            return _deny("wrong audience")
        except jwt.InvalidTokenError as exc:
            return _deny(next((reason for kind, reason in _REFUSALS if isinstance(exc, kind)), "malformed token"))
        except Exception:  # e.g. OverflowError on absurd numbers: client input must never raise
            return _deny("malformed token")
        return self._decide(claims)

    def _decide(self, claims: dict[str, Any]) -> AuthDecision:
        username = claims.get(self.username_claim)
        if not _valid_username(username):
            return _deny("missing or invalid user name claim")
        expires_at: float | None = None
        exp = claims.get("exp")
        if exp is not None:
            if isinstance(exp, bool) or not isinstance(exp, int | float):
                return _deny("invalid exp claim")
            try:
                expires_at = float(exp) + self.leeway
            except OverflowError:
                return _deny("invalid exp claim")
            if not math.isfinite(expires_at):
                return _deny("invalid exp claim")
        acl: AclFile | None = None
        if self.acl_claim is not None and self.acl_claim in claims:
            try:
                acl = AclFile.from_grants(grants_from_acl_claim(claims[self.acl_claim]))
            except ValueError as exc:
                return _deny(f"malformed acl claim: {exc}")
        tenant: str | None = None
        if self.tenant_claim is not None and self.tenant_claim in claims:
            tenant = claims[self.tenant_claim]
            if not isinstance(tenant, str) or not tenant:
                return _deny("invalid tenant claim")  # the node checks the name itself (a topic level)
        return AuthDecision(Outcome.ALLOW, username=username, acl=acl, expires_at=expires_at, tenant=tenant)


def grants_from_acl_claim(value: object) -> list[tuple[str, str]]:
    """(access, topic filter) grants for `AclFile.from_grants` from an EMQX ACL claim in either form.

    ValueError for anything malformed; its message names positions and keys only, never claim content, so it
    may go into a reason. Topic filter syntax is left to `AclFile.from_grants`.
    """
    grants: list[tuple[str, str]] = []
    if isinstance(value, dict):
        for field, topics in value.items():
            access = _OLD_FORM.get(field)
            if access is None:
                raise ValueError("unknown key (pub|sub|all)")
            if not isinstance(topics, list):
                raise ValueError(f"{field!s} is not a list")
            for number, topic in enumerate(topics, start=1):
                grants.append((access, _topic(topic, f"{field!s} {number}")))
        return grants
    if isinstance(value, list):
        for number, rule in enumerate(value, start=1):
            grants.append(_rule(rule, number))
        return grants
    raise ValueError("not an object or a list")


def _rule(rule: object, number: int) -> tuple[str, str]:
    if not isinstance(rule, dict):
        raise ValueError(f"rule {number} is not an object")
    permission = rule.get("permission")
    if permission not in ("allow", "deny"):
        raise ValueError(f"rule {number}: permission must be allow or deny")
    action = rule.get("action")
    if not isinstance(action, str) or action not in _ACTIONS:
        raise ValueError(f"rule {number}: action must be publish, subscribe or all")
    if "topic" not in rule:
        raise ValueError(f"rule {number}: no topic")
    for field in rule:
        if field in ("permission", "action", "topic"):
            continue
        if field not in _NARROWING_FIELDS:
            raise ValueError(f"rule {number}: unknown field")
        if permission == "allow":
            raise ValueError(f"rule {number}: allow rules with qos/retain/client conditions are not supported")
    topic = _topic(rule["topic"], f"rule {number}")
    return ("deny" if permission == "deny" else _ACTIONS[action]), topic


def _topic(topic: object, where: str) -> str:
    if not isinstance(topic, str) or not topic:
        raise ValueError(f"{where}: topic is not a non-empty string")
    if topic.startswith("eq "):
        raise ValueError(f"{where}: 'eq' topics are not supported")
    for placeholder, ours in _EMQX_PLACEHOLDERS:
        topic = topic.replace(placeholder, ours)
    if "${" in topic:
        raise ValueError(f"{where}: unsupported placeholder (only %c, %u, ${{clientid}}, ${{username}})")
    if not _utf8(topic):
        raise ValueError(f"{where}: topic is not valid UTF-8")
    return topic


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates, which JSON allows and MQTT does not
        return False
    return True


def _valid_username(value: object) -> TypeGuard[str]:
    if not isinstance(value, str) or not value or "\x00" in value or not _utf8(value):
        return False
    return len(value.encode("utf-8")) <= MAX_USERNAME_BYTES


def _jwt_shape(password: bytes) -> tuple[str, dict[str, Any]] | None:
    """(token, header) when the password looks like a compact JWS; None for anything else."""
    if password.count(b".") != 2:
        return None
    try:
        token = password.decode("ascii")
    except UnicodeDecodeError:
        return None
    header_b64, payload_b64, signature_b64 = token.split(".")
    if not header_b64 or not payload_b64 or len(header_b64) > MAX_HEADER_CHARS:
        return None
    for segment in (header_b64, payload_b64, signature_b64):
        if len(segment) % 4 == 1 or not _B64URL.fullmatch(segment):
            return None
    try:
        header = json.loads(base64url_decode(header_b64))
    except (ValueError, binascii.Error):  # includes UnicodeDecodeError and JSONDecodeError
        return None
    if not isinstance(header, dict):
        return None
    return token, header


def _secret_key(secret: str | bytes) -> _Key:
    raw = secret.encode("utf-8") if isinstance(secret, str) else bytes(secret)
    algorithms = frozenset(alg for alg, minimum in _HMAC_ALGS.items() if len(raw) >= minimum)
    if not algorithms:
        raise ValueError("jwt: the secret must be at least 32 bytes (RFC 7518 §3.2)")
    return _Key(raw, algorithms)


def _public_key(key: object, where: str) -> _Key:
    """The key with the algorithms its type allows; ValueError for weak, private or unsupported keys."""
    if isinstance(key, rsa.RSAPublicKey):
        if key.key_size < MIN_RSA_BITS:
            raise ValueError(f"{where}: RSA key of {key.key_size} bits (at least {MIN_RSA_BITS})")
        return _Key(key, _RSA_ALGS)
    if isinstance(key, ec.EllipticCurvePublicKey):
        alg = _EC_ALGS.get(key.curve.name)
        if alg is None:
            raise ValueError(f"{where}: unsupported EC curve {key.curve.name}")
        return _Key(key, frozenset({alg}))
    if isinstance(key, ed25519.Ed25519PublicKey | ed448.Ed448PublicKey):
        return _Key(key, frozenset({"EdDSA"}))
    if isinstance(key, rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey
                  | ed448.Ed448PrivateKey):
        raise ValueError(f"{where}: is a private key; configure the public key")
    raise ValueError(f"{where}: unsupported key type")


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ValueError(f"jwt: cannot read {path}: {exc.strerror or exc}") from None


def _load_public_key(path: Path) -> _Key:
    data = _read(path)
    where = f"jwt: {path}"
    if b"PRIVATE KEY-----" in data:
        raise ValueError(f"{where}: is a private key; configure the public key")
    key: object
    try:
        if b"-----BEGIN CERTIFICATE-----" in data:
            key = x509.load_pem_x509_certificate(data).public_key()
        else:
            key = serialization.load_pem_public_key(data)
    except ValueError:
        raise ValueError(f"{where}: not a PEM public key or certificate") from None
    return _public_key(key, where)


def _load_jwks(path: Path) -> tuple[dict[str, _Key], _Key | None]:
    data = _read(path)
    try:
        document = json.loads(data)
    except ValueError:
        raise ValueError(f"jwt: {path}: not JSON") from None
    entries = document.get("keys") if isinstance(document, dict) else None
    if not isinstance(entries, list):
        raise ValueError(f"jwt: {path}: no \"keys\" list")
    keys: dict[str, _Key] = {}
    anonymous: list[_Key] = []
    for number, entry in enumerate(entries, start=1):
        where = f"jwt: {path}: key {number}"
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: not an object")
        if entry.get("use", "sig") != "sig":
            continue  # encryption keys may share the file; they never verify a signature
        if entry.get("kty") == "oct":
            raise ValueError(f"{where}: symmetric keys do not belong in a JWKS file; use the secret setting")
        if "d" in entry:
            raise ValueError(f"{where}: holds private key material; publish only the public key")
        try:
            key = jwt.PyJWK(entry).key
        except (jwt.PyJWTError, ValueError, TypeError, KeyError) as exc:
            raise ValueError(f"{where}: invalid JWK ({type(exc).__name__})") from None
        checked = _public_key(key, where)
        alg = entry.get("alg")
        if alg is not None:
            if alg not in checked.algorithms:
                raise ValueError(f"{where}: alg {alg!r} does not fit the key type")
            checked = _Key(checked.key, frozenset({alg}))
        kid = entry.get("kid")
        if kid is None:
            anonymous.append(checked)
            continue
        if not isinstance(kid, str) or kid in keys:
            raise ValueError(f"{where}: kid is not a string or is used twice")
        keys[kid] = checked
    found = len(keys) + len(anonymous)
    if found == 0:
        raise ValueError(f"jwt: {path}: no signing keys")
    if anonymous and found > 1:
        raise ValueError(f"jwt: {path}: with several keys, every key needs a kid")
    single = anonymous[0] if anonymous else (next(iter(keys.values())) if found == 1 else None)
    return keys, single
