"""TLS on the RocketMQ gRPC port (`rocketmq_tls`, the TLS listeners' certfile/keyfile) with the official client
(`tls_enable=True`): a client trusting the server's CA connects and sends, one without that trust store is
refused, and SIGHUP swaps the certificate for the next handshakes. The client takes its trust store from gRPC's
`GRPC_DEFAULT_SSL_ROOTS_FILE_PATH`, read once per process: each attempt runs in a process of its own."""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integration.certs import TestPKI, served_certificate
from tests.integration.conftest import Gateway
from tests.waiting import wait_until

SEND = """
import sys
from rocketmq import ClientConfiguration, Credentials, Message, Producer
producer = Producer(ClientConfiguration(sys.argv[1], Credentials(), request_timeout=3), topics=["T"],
                    tls_enable=True)
producer.startup()
message = Message()
message.topic = "T"
message.body = b"over tls"
print("sent", producer.send(message).message_id, flush=True)
producer.shutdown()
"""


def sends(gw: Gateway, trust: Path | None, home: Path) -> bool:
    """Whether a TLS producer trusting `trust` (None: gRPC's default roots) gets a message through."""
    env = {k: v for k, v in os.environ.items() if k != "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH"}
    env["HOME"] = str(home)  # the client writes its log under ~
    if trust is not None:
        env["GRPC_DEFAULT_SSL_ROOTS_FILE_PATH"] = str(trust)
    done = subprocess.run([sys.executable, "-c", SEND, f"127.0.0.1:{gw.rocketmq_port}"], env=env,
                          capture_output=True, text=True, timeout=60)
    return done.returncode == 0 and "sent " in done.stdout


def h2_context(pki: TestPKI) -> ssl.SSLContext:
    ctx = pki.client_context()
    ctx.set_alpn_protocols(["h2"])  # gRPC speaks HTTP/2 only
    return ctx


@pytest.mark.slow  # its own gateway and five client processes
def test_tls_with_trust_store_and_certificate_swap_on_sighup(rmq_gateway: Callable[..., Gateway],
                                                              tmp_path: Path) -> None:
    first, second = TestPKI(tmp_path / "pki1", "ca1"), TestPKI(tmp_path / "pki2", "ca2")
    gw = rmq_gateway(env={"TIDEWIRE_ROCKETMQ_TLS": "true", "TIDEWIRE_CERTFILE": str(first.server.certfile),
                          "TIDEWIRE_KEYFILE": str(first.server.keyfile)})
    assert "listener=rocketmq" in gw.stderr and "tls=True" in gw.stderr
    home = tmp_path / "home"
    home.mkdir()
    assert sends(gw, first.cafile, home)
    assert not sends(gw, None, home)  # the system's roots do not know the test CA
    assert not sends(gw, second.cafile, home)

    for source, target in ((second.server.certfile, first.server.certfile),
                           (second.server.keyfile, first.server.keyfile)):
        shutil.copyfile(source, target.with_suffix(".tmp"))
        target.with_suffix(".tmp").replace(target)  # never half a file for the reload to read
    gw.reload()

    def serves_the_new_one() -> bool:
        try:  # until the reload lands the old certificate is served, which the new CA refuses
            return served_certificate(gw.rocketmq_port, h2_context(second))[0] == second.server.serial
        except ssl.SSLCertVerificationError:
            return False

    wait_until(serves_the_new_one, what="the new certificate served after SIGHUP")
    assert sends(gw, second.cafile, home)
    assert not sends(gw, first.cafile, home)
    assert "event=reloaded" in gw.stderr
