"""TLS for every TLS listener (MQTT over TLS and secure WebSocket, AMQP over TLS, RocketMQ's gRPC): the server
context from the settings (Mosquitto's option names), its certificate reloaded in place, the same files as PEM
for a server that takes bytes rather than a context (gRPC), and the name a client certificate proves
(Mosquitto's `use_identity_as_username` / `use_subject_as_username`)."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from typing import Any, Literal

from cryptography import x509
from cryptography.x509.oid import NameOID

from tidewire.gateway.config import Settings

CertUsername = Literal["cn", "subject"] | None


def tls_context(settings: Settings) -> ssl.SSLContext:
    """Server context: TLS 1.2+ only, certificate and key from files, client certificates per Mosquitto's
    `cafile`/`require_certificate`."""
    if settings.certfile is None or settings.keyfile is None:
        raise ValueError("a TLS listener needs certfile and keyfile")
    wants_cert = settings.require_certificate or settings.use_identity_as_username or settings.use_subject_as_username
    if wants_cert and settings.cafile is None:
        raise ValueError("require_certificate and use_*_as_username need cafile")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3 if settings.tls_min_version == "1.3" else ssl.TLSVersion.TLSv1_2
    ctx.options |= ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE
    if settings.tls_ciphers:
        ctx.set_ciphers(settings.tls_ciphers)
    ctx.load_cert_chain(settings.certfile, settings.keyfile)
    if settings.cafile is not None:
        ctx.load_verify_locations(settings.cafile)
        ctx.verify_mode = ssl.CERT_REQUIRED if settings.require_certificate else ssl.CERT_OPTIONAL
    return ctx


def reload_certificate(ctx: ssl.SSLContext, settings: Settings) -> None:
    """Load the certificate and key again into the live context: new handshakes use them, established
    connections keep theirs."""
    if settings.certfile is not None and settings.keyfile is not None:
        ctx.load_cert_chain(settings.certfile, settings.keyfile)


class CertificateFiles:
    """The TLS listeners' certificate chain, key and CA bundle as PEM bytes, read again by `reload` (SIGHUP): for
    gRPC, whose server asks for them before each handshake. `generation` goes up with each reload that took."""

    def __init__(self, settings: Settings) -> None:
        if settings.certfile is None or settings.keyfile is None:
            raise ValueError("a TLS listener needs certfile and keyfile")
        if settings.require_certificate and settings.cafile is None:
            raise ValueError("require_certificate needs cafile")
        self.settings = settings
        self.generation = 0
        self.pem = self._read()

    def _read(self) -> tuple[bytes, bytes, bytes | None]:
        """(key, chain, CA bundle), checked to form a usable pair (a bad file keeps the previous ones)."""
        certfile, keyfile, cafile = self.settings.certfile, self.settings.keyfile, self.settings.cafile
        assert certfile is not None and keyfile is not None
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(certfile, keyfile)  # raises on a bad pair
        return keyfile.read_bytes(), certfile.read_bytes(), cafile.read_bytes() if cafile is not None else None

    def reload(self) -> None:
        """Read the files again (raises OSError or ssl.SSLError, keeping the previous ones)."""
        self.pem = self._read()
        self.generation += 1


_RFC4514_NAMES = {NameOID.EMAIL_ADDRESS: "emailAddress"}  # as OpenSSL prints it (Mosquitto's subject)


def certificate_name(transport: asyncio.BaseTransport, kind: CertUsername) -> str | None:
    """The verified client certificate's CN or RFC 4514 subject, or None when there is no certificate."""
    ssl_object: Any = transport.get_extra_info("ssl_object")
    if ssl_object is None or kind is None:
        return None
    der = ssl_object.getpeercert(binary_form=True)
    if not der:
        return None
    with contextlib.suppress(ValueError):
        subject = x509.load_der_x509_certificate(der).subject
        if kind == "subject":
            return subject.rfc4514_string(_RFC4514_NAMES)
        names = subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        if names:
            value = names[0].value
            return value if isinstance(value, str) else value.decode("utf-8", "replace")
    return None
