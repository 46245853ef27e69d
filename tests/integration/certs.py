"""Test PKI for the TLS end-to-end tests: CAs, a server certificate for 127.0.0.1 and client certificates (trustme).

Everything is written as PEM files under one directory, because the gateway and the `mosquitto_*` clients take
file names. Client-side `ssl` contexts and the served certificate's fingerprint are helpers for the tests.
"""

from __future__ import annotations

import hashlib
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path

import trustme
from cryptography import x509

SERVER_IDENTITIES = ("127.0.0.1", "localhost")


@dataclass(frozen=True, slots=True)
class CertFiles:
    """A leaf certificate (chain PEM) and its private key on disk."""

    certfile: Path
    keyfile: Path
    subject: str  # RFC 4514 (what Mosquitto's use_subject_as_username yields, most specific RDN first)
    common_name: str | None
    serial: int


class TestPKI:
    """One CA with a server certificate for 127.0.0.1/localhost; client certificates issued on demand."""

    __test__ = False  # not a pytest test class despite the name

    def __init__(self, directory: Path, name: str = "ca") -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.ca = trustme.CA(organization_name=f"Tidewire test {name}")
        self.cafile = self.dir / f"{name}.pem"
        self.ca.cert_pem.write_to_path(str(self.cafile))
        self.server = self.issue_server()

    def _write(self, leaf: trustme.LeafCert, stem: str, common_name: str | None) -> CertFiles:
        certfile = self.dir / f"{stem}.crt"
        keyfile = self.dir / f"{stem}.key"
        # Replace atomically: a gateway reloading on SIGHUP must never read half a file.
        for path, blob in ((certfile, leaf.cert_chain_pems), (keyfile, [leaf.private_key_pem])):
            tmp = path.with_suffix(path.suffix + ".tmp")
            tmp.write_bytes(b"".join(b.bytes() for b in blob))
            tmp.replace(path)
        cert = x509.load_pem_x509_certificate(leaf.cert_chain_pems[0].bytes())
        return CertFiles(certfile, keyfile, cert.subject.rfc4514_string(), common_name, cert.serial_number)

    def issue_server(self, stem: str = "server") -> CertFiles:
        """(Re)issue the server certificate into `<stem>.crt`/`<stem>.key` (same paths each time)."""
        leaf = self.ca.issue_cert(*SERVER_IDENTITIES, common_name="tidewire-test-server")
        return self._write(leaf, f"{self.name}-{stem}", "tidewire-test-server")

    def issue_client(self, common_name: str, organization: str = "Tidewire", unit: str = "devices") -> CertFiles:
        leaf = self.ca.issue_cert(f"{common_name}.clients.test", common_name=common_name,
                                  organization_name=organization, organization_unit_name=unit)
        return self._write(leaf, f"{self.name}-client-{common_name}", common_name)

    def client_context(self, client: CertFiles | None = None) -> ssl.SSLContext:
        """A context trusting this CA, presenting `client` if given (TLS 1.2+, hostname checked)."""
        ctx = ssl.create_default_context(cafile=str(self.cafile))
        if client is not None:
            ctx.load_cert_chain(str(client.certfile), str(client.keyfile))
        return ctx


def served_certificate(port: int, ctx: ssl.SSLContext, timeout: float = 3.0) -> tuple[int, str]:
    """Handshake with 127.0.0.1:port and return the served leaf certificate's (serial, sha256 fingerprint)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as raw, \
            ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    cert = x509.load_der_x509_certificate(der)
    return cert.serial_number, hashlib.sha256(der).hexdigest()
