"""TLS, mutual TLS, certificate identities, certificate reload, and MQTT over (secure) WebSocket, end to end.

Real clients only: `mosquitto_pub`/`mosquitto_sub` with `--cafile`/`--cert`/`--key`, paho over TLS and over
WebSocket, Python's `ssl` for handshakes that must fail. Certificates come from `trustme` (tests/integration/certs).
"""

from __future__ import annotations

import socket
import ssl
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.integration.certs import CertFiles, TestPKI, served_certificate
from tests.integration.conftest import (
    Gateway,
    GatewayFactory,
    PahoClient,
    PahoFactory,
    TlsOptions,
)
from tests.integration.rawconnect import raw_connect
from tests.waiting import wait_until


@pytest.fixture
def pki(tmp_path: Path) -> TestPKI:
    return TestPKI(tmp_path / "pki")


@pytest.fixture
def foreign_pki(tmp_path: Path) -> TestPKI:
    """Another CA, trusted by nobody here."""
    return TestPKI(tmp_path / "foreign", name="foreign")


def server_tls(pki: TestPKI, **flags: bool) -> TlsOptions:
    return TlsOptions(pki.server.certfile, pki.server.keyfile, pki.cafile, **flags)


def mtls(pki: TestPKI, **flags: bool) -> TlsOptions:
    return server_tls(pki, require_certificate=True, **flags)


def tls_client(paho_factory: PahoFactory, port: int, pki: TestPKI, client_id: str, version: int = 5,
               cert: CertFiles | None = None, **kwargs: object) -> PahoClient:
    c = paho_factory(port, client_id, version=version, ca_certs=pki.cafile,
                     certfile=None if cert is None else cert.certfile,
                     keyfile=None if cert is None else cert.keyfile, **kwargs)
    c.connect()
    return c


def mosquitto_tls_args(gw: Gateway, pki: TestPKI, cert: CertFiles | None = None) -> list[str]:
    assert gw.tls_port is not None
    args = ["-h", "127.0.0.1", "-p", str(gw.tls_port), "--cafile", str(pki.cafile)]
    if cert is not None:
        args += ["--cert", str(cert.certfile), "--key", str(cert.keyfile)]
    return args


def sub_and_pub(gw: Gateway, pki: TestPKI, cert: CertFiles | None = None, topic: str = "tls/cli") -> str:
    """`mosquitto_sub -C 1` over TLS, with `mosquitto_pub` over TLS repeated until it has the message."""
    sub = subprocess.Popen(["/usr/bin/mosquitto_sub", *mosquitto_tls_args(gw, pki, cert), "-t", topic, "-C", "1",
                            "-W", "4"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        def received() -> bool:  # the subscriber's SUBSCRIBE is not observable: publish until it has one
            pub = subprocess.run(["/usr/bin/mosquitto_pub", *mosquitto_tls_args(gw, pki, cert), "-t", topic,
                                  "-m", "over tls"], capture_output=True, text=True, timeout=5)
            assert pub.returncode == 0, pub.stderr
            try:
                sub.wait(timeout=0.1)
            except subprocess.TimeoutExpired:
                return False
            return True

        wait_until(received, timeout=4, what="mosquitto_sub's message over TLS", interval=0)
        out, err = sub.communicate(timeout=5)
        assert sub.returncode == 0, (out, err)
        return out.strip()
    finally:
        if sub.poll() is None:
            sub.kill()
            sub.wait()


# -- server authentication ---------------------------------------------------------------------------

def test_mosquitto_clients_over_tls(gateway_factory: GatewayFactory, pki: TestPKI) -> None:
    gw = gateway_factory(tls=server_tls(pki))
    assert sub_and_pub(gw, pki) == "over tls"


def test_paho_over_tls_with_tcp_clients(gateway_factory: GatewayFactory, paho_factory: PahoFactory,
                                        pki: TestPKI) -> None:
    gw = gateway_factory(tls=server_tls(pki))
    assert gw.tls_port is not None
    for version in (4, 5):
        secure = tls_client(paho_factory, gw.tls_port, pki, f"tls-{version}", version)
        assert secure.subscribe("down/#", 1) == [1]
        plain = paho_factory(gw.port, f"tcp-{version}", version=version)
        plain.connect()
        assert plain.subscribe("up/#", 1) == [1]
        secure.publish("up/1", b"from tls", qos=1)
        plain.publish("down/1", b"to tls", qos=1)
        assert plain.get().payload == b"from tls"
        assert secure.get().payload == b"to tls"
        secure.disconnect()
        plain.disconnect()


def test_tls_1_1_is_refused(gateway_factory: GatewayFactory, pki: TestPKI) -> None:
    # The cipher security level is lowered on both sides so that only the minimum protocol version can refuse.
    gw = gateway_factory(tls=server_tls(pki), env={"TIDEWIRE_TLS_CIPHERS": "DEFAULT:@SECLEVEL=0"})
    assert gw.tls_port is not None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(str(pki.cafile))
    ctx.set_ciphers("DEFAULT:@SECLEVEL=0")
    ctx.minimum_version = ctx.maximum_version = ssl.TLSVersion.TLSv1_1
    assert _control_handshake(pki, ctx) == "TLSv1.1", "this client must be able to speak TLS 1.1"
    with pytest.raises(ssl.SSLError), socket.create_connection(("127.0.0.1", gw.tls_port), timeout=3) as raw, \
            ctx.wrap_socket(raw, server_hostname="127.0.0.1"):
        pass
    ok = pki.client_context()
    ok.maximum_version = ssl.TLSVersion.TLSv1_2
    assert raw_connect(gw.tls_port, 5, "tls12", tls=ok).code == 0


def _control_handshake(pki: TestPKI, client: ssl.SSLContext) -> str | None:
    """Handshake `client` with a local server that accepts TLS 1.0+: proves the client side can succeed."""
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.set_ciphers("DEFAULT:@SECLEVEL=0")
    server.minimum_version = ssl.TLSVersion.TLSv1
    server.load_cert_chain(str(pki.server.certfile), str(pki.server.keyfile))
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.settimeout(3)

        def accept() -> None:
            conn, _ = listener.accept()
            try:
                with server.wrap_socket(conn, server_side=True):
                    pass
            except (ssl.SSLError, OSError):
                conn.close()

        thread = threading.Thread(target=accept)
        thread.start()
        try:
            with socket.create_connection(listener.getsockname(), timeout=3) as raw, \
                    client.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                return tls.version()
        finally:
            thread.join(5)


# -- mutual TLS ---------------------------------------------------------------------------------------

def test_mtls_accepts_certificates_of_the_ca(gateway_factory: GatewayFactory, paho_factory: PahoFactory,
                                             pki: TestPKI) -> None:
    gw = gateway_factory(tls=mtls(pki))
    assert gw.tls_port is not None
    device = pki.issue_client("device-1")
    assert sub_and_pub(gw, pki, device, "mtls/cli") == "over tls"
    c = tls_client(paho_factory, gw.tls_port, pki, "mtls-paho", cert=device)
    assert c.subscribe("mtls/#", 1) == [1]
    c.publish("mtls/paho", b"mutual", qos=1)
    assert c.get().payload == b"mutual"


def test_mtls_refuses_missing_or_foreign_certificate(gateway_factory: GatewayFactory, paho_factory: PahoFactory,
                                                     pki: TestPKI, foreign_pki: TestPKI) -> None:
    gw = gateway_factory(tls=mtls(pki))
    assert gw.tls_port is not None
    good = pki.issue_client("good")
    watcher = tls_client(paho_factory, gw.tls_port, pki, "watcher", cert=good)
    assert watcher.subscribe("alive/#", 1) == [1]

    none = raw_connect(gw.tls_port, 5, "no-cert", tls=pki.client_context())
    foreign = raw_connect(gw.tls_port, 5, "foreign-cert", tls=pki.client_context(foreign_pki.issue_client("good")))
    assert none.code is None and none.closed, none
    assert foreign.code is None and foreign.closed, foreign
    cli = subprocess.run(["/usr/bin/mosquitto_pub", *mosquitto_tls_args(gw, pki), "-t", "alive/x", "-m", "no"],
                         capture_output=True, text=True, timeout=5)
    assert cli.returncode != 0, cli

    # The gateway keeps serving: the connected client stays, a new one with a good certificate gets in.
    assert raw_connect(gw.tls_port, 5, "good-raw", tls=pki.client_context(good)).code == 0
    later = tls_client(paho_factory, gw.tls_port, pki, "later", cert=good)
    later.publish("alive/1", b"still serving", qos=1)
    assert watcher.get().payload == b"still serving"
    watcher.assert_nothing(0.2)  # in particular not the refused mosquitto_pub's message
    assert watcher.disconnects.empty()


IDENTITY_ACL = """\
user alice
topic readwrite alice/#
user mallory
topic readwrite mallory/#
"""


def test_certificate_common_name_is_the_user_name(gateway_factory: GatewayFactory, paho_factory: PahoFactory,
                                                  pki: TestPKI) -> None:
    gw = gateway_factory(acl_text=IDENTITY_ACL, tls=mtls(pki, use_identity_as_username=True), allow_anonymous=False)
    assert gw.tls_port is not None
    alice = tls_client(paho_factory, gw.tls_port, pki, "alice-cert", cert=pki.issue_client("alice"))
    alice.subscribe("alice/#", 1)
    assert alice.publish("alice/1", b"mine", qos=1) == 0
    assert alice.get().payload == b"mine"

    mallory_cert = pki.issue_client("mallory")
    mallory = tls_client(paho_factory, gw.tls_port, pki, "mallory-cert", cert=mallory_cert)
    mallory.subscribe([("mallory/#", 1), ("alice/#", 1)])  # alice/#: refused (Tidewire) or filtered (Mosquitto)
    assert mallory.publish("mallory/1", b"hers", qos=1) == 0
    assert mallory.get().payload == b"hers"
    assert mallory.publish("alice/2", b"intrusion", qos=1) == 0x87
    alice.publish("alice/3", b"private", qos=1)
    assert alice.get().payload == b"private"
    mallory.assert_nothing(0.3)
    alice.assert_nothing(0.1)

    # Claiming alice's user name with mallory's certificate gives mallory's identity, or no connection at all.
    claimer = paho_factory(gw.tls_port, "claimer", username="alice", ca_certs=pki.cafile,
                           certfile=mallory_cert.certfile, keyfile=mallory_cert.keyfile)
    if claimer.connect(check=False).reason_code == 0:
        assert claimer.publish("alice/4", b"claimed", qos=1) == 0x87
        alice.assert_nothing(0.3)


SUBJECT = "CN=alice,OU=devices,O=Tidewire"  # Mosquitto: X509_NAME_print_ex(..., XN_FLAG_RFC2253)


def test_certificate_subject_is_the_user_name(gateway_factory: GatewayFactory, paho_factory: PahoFactory,
                                              pki: TestPKI) -> None:
    gw = gateway_factory(acl_text=f"user {SUBJECT}\ntopic readwrite subj/#\n",
                         tls=mtls(pki, use_subject_as_username=True), allow_anonymous=False)
    assert gw.tls_port is not None
    cert = pki.issue_client("alice")
    assert cert.subject == SUBJECT
    alice = tls_client(paho_factory, gw.tls_port, pki, "subject-alice", cert=cert)
    alice.subscribe("subj/#", 1)
    assert alice.publish("subj/1", b"by subject", qos=1) == 0
    assert alice.get().payload == b"by subject"

    # Same common name, other organisation: another subject, so none of alice's grants.
    other = tls_client(paho_factory, gw.tls_port, pki, "subject-other",
                       cert=pki.issue_client("alice", organization="Elsewhere"))
    assert other.publish("subj/2", b"same cn", qos=1) == 0x87
    alice.assert_nothing(0.3)


# -- certificate reload -------------------------------------------------------------------------------

def test_sighup_reloads_the_server_certificate(gateway_factory: GatewayFactory, paho_factory: PahoFactory,
                                               pki: TestPKI) -> None:
    gw = gateway_factory(tls=server_tls(pki))
    assert gw.tls_port is not None
    port = gw.tls_port
    old_serial, old_fingerprint = served_certificate(port, pki.client_context())
    assert old_serial == pki.server.serial
    early = tls_client(paho_factory, port, pki, "early")
    assert early.subscribe("reload/#", 1) == [1]

    new = pki.issue_server()  # same paths, new key and serial
    assert new.serial != old_serial
    gw.reload()
    wait_until(lambda: served_certificate(port, pki.client_context())[0] == new.serial,
               what="new certificate served after SIGHUP")
    assert served_certificate(port, pki.client_context())[1] != old_fingerprint

    late = tls_client(paho_factory, port, pki, "late")
    late.publish("reload/1", b"across the reload", qos=1)
    assert early.get().payload == b"across the reload"
    assert early.disconnects.empty(), "a certificate reload must not drop TLS connections"


@pytest.mark.tidewire_only
def test_failed_handshake_costs_one_log_line(gateway_factory: GatewayFactory, pki: TestPKI,
                                             foreign_pki: TestPKI) -> None:
    gw = gateway_factory(tls=mtls(pki))
    assert gw.tls_port is not None

    def settled_lines() -> list[str]:
        before: list[str] = []
        while True:  # the start-up probes of the listeners may still be logging
            lines = gw.stderr.splitlines()
            if lines == before:
                return lines
            before = lines
            time.sleep(0.3)  # absence: no line in 0.3 s (whatever the start-up probes log has no end event)

    before = settled_lines()
    res = raw_connect(gw.tls_port, 5, "foreign", tls=pki.client_context(foreign_pki.issue_client("x")))
    assert res.code is None
    after = settled_lines()
    new = after[len(before):]
    assert len(new) == 1, new
    assert "Traceback" not in gw.stderr


# -- WebSocket ----------------------------------------------------------------------------------------
# Debian's Mosquitto 2.0.11 is built without libwebsockets, so these run against Tidewire only.

@pytest.mark.tidewire_only
def test_websocket_qos_0_1_2_both_ways(gateway_factory: GatewayFactory, paho_factory: PahoFactory) -> None:
    gw = gateway_factory(ws=True)
    assert gw.ws_port is not None
    for version in (4, 5):
        ws = paho_factory(gw.ws_port, f"ws-{version}", version=version, websocket=True, ws_path="/mqtt")
        ws.connect()
        tcp = paho_factory(gw.port, f"tcp-{version}", version=version)
        tcp.connect()
        assert ws.subscribe("to-ws/#", 2) == [2]
        assert tcp.subscribe("from-ws/#", 2) == [2]
        for qos in (0, 1, 2):
            tcp.publish(f"to-ws/{qos}", f"tcp q{qos}".encode(), qos=qos)
            ws.publish(f"from-ws/{qos}", f"ws q{qos}".encode(), qos=qos)
            got_ws, got_tcp = ws.get(), tcp.get()
            assert (got_ws.topic, got_ws.payload, got_ws.qos) == (f"to-ws/{qos}", f"tcp q{qos}".encode(), qos)
            assert (got_tcp.topic, got_tcp.payload, got_tcp.qos) == (f"from-ws/{qos}", f"ws q{qos}".encode(), qos)
        ws.disconnect()
        tcp.disconnect()


@pytest.mark.tidewire_only
def test_websocket_big_payload(gateway_factory: GatewayFactory, paho_factory: PahoFactory) -> None:
    gw = gateway_factory(ws=True)
    assert gw.ws_port is not None
    big = bytes(range(256)) * 800  # 200 KB: many WebSocket frames and TCP segments
    ws = paho_factory(gw.ws_port, "ws-big", websocket=True)
    ws.connect()
    tcp = paho_factory(gw.port, "tcp-big")
    tcp.connect()
    ws.subscribe("big/to-ws", 1)
    tcp.subscribe("big/from-ws", 1)
    assert tcp.publish("big/to-ws", big, qos=1) in (0, 0x10)
    assert ws.publish("big/from-ws", big[::-1], qos=1) in (0, 0x10)
    assert ws.get(5).payload == big
    assert tcp.get(5).payload == big[::-1]


@pytest.mark.tidewire_only
def test_secure_websocket(gateway_factory: GatewayFactory, paho_factory: PahoFactory, pki: TestPKI) -> None:
    gw = gateway_factory(tls=server_tls(pki), wss=True)
    assert gw.wss_port is not None
    wss = tls_client(paho_factory, gw.wss_port, pki, "wss-client", websocket=True)
    tcp = paho_factory(gw.port, "wss-peer")
    tcp.connect()
    assert wss.subscribe("wss/in", 1) == [1]
    tcp.subscribe("wss/out", 1)
    tcp.publish("wss/in", b"to wss", qos=1)
    wss.publish("wss/out", b"from wss", qos=1)
    assert wss.get().payload == b"to wss"
    assert tcp.get().payload == b"from wss"
    plain = raw_connect(gw.wss_port, 5, "not-tls")  # MQTT bytes on the wss port are not a TLS ClientHello
    assert plain.code is None
