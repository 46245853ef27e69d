"""RocketMQ authentication (MQv2-HMAC-SHA1 against `rocketmq_credentials_file`) and the ACL per access key."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from rocketmq.grpc_protocol import Code, MessagingServiceStub, QueryRouteRequest
from rocketmq.v5.exception import ForbiddenException
from rocketmq.v5.util.signature import Signature

from tests.integration.conftest import Gateway, PahoFactory
from tests.waiting import wait_until

from .conftest import Clients, message, write_credentials

SECRET = "s3cr3t-Value-1"
WRONG = "wr0ng-Value-2"


def route_status(gw: Gateway, ak: str, sk: str) -> int:
    """QueryRoute through the client's generated stub, signed by the client's own signing code."""
    config = Clients().config(gw, ak, sk)
    with grpc.insecure_channel(f"127.0.0.1:{gw.rocketmq_port}") as channel:
        request = QueryRouteRequest()
        request.topic.name = "T"
        answer = MessagingServiceStub(channel).QueryRoute(request, metadata=Signature.metadata(config, "c1"),
                                                          timeout=5)
    return int(answer.status.code)


@pytest.fixture
def secured(rmq_gateway: Callable[..., Gateway], tmp_path: Path) -> Gateway:
    credentials = write_credentials(tmp_path / "rocketmq.credentials", {"ak1": SECRET, "ak2": "other-secret"})
    return rmq_gateway(env={"TIDEWIRE_ROCKETMQ_CREDENTIALS_FILE": str(credentials)})


def test_bad_credentials_are_refused(secured: Gateway, clients: Clients, paho_factory: PahoFactory) -> None:
    gw = secured
    assert route_status(gw, "ak1", SECRET) == Code.OK
    assert route_status(gw, "ak1", WRONG) == Code.UNAUTHORIZED
    assert route_status(gw, "nobody", SECRET) == Code.UNAUTHORIZED
    assert route_status(gw, "", "") == Code.UNAUTHORIZED  # credentials configured: no anonymous client
    sub = paho_factory(gw.port, "dev")
    sub.connect()
    sub.subscribe("T/#", qos=1)
    intruder = clients.producer(gw, ["T"], "ak1", WRONG)
    with pytest.raises(Exception):  # noqa: B017 - the client reports the refused route as a plain Exception
        intruder.send(message("T", b"forged"))
    producer = clients.producer(gw, ["T"], "ak1", SECRET)
    producer.send(message("T", b"signed"))
    assert sub.get().payload == b"signed"
    sub.assert_nothing()
    assert SECRET not in gw.stderr and WRONG not in gw.stderr


def test_anonymous_refused_when_the_node_requires_credentials(rmq_gateway: Callable[..., Gateway]) -> None:
    gw = rmq_gateway(allow_anonymous=False)
    assert route_status(gw, "", "") == Code.UNAUTHORIZED
    assert route_status(gw, "ak1", SECRET) == Code.UNAUTHORIZED  # nothing can verify it


ACL = """\
topic read T/#
user ak1
topic write T/#
topic read D/#
"""


def test_acl_per_access_key(rmq_gateway: Callable[..., Gateway], tmp_path: Path, clients: Clients,
                            paho_factory: PahoFactory) -> None:
    credentials = write_credentials(tmp_path / "rocketmq.credentials", {"ak1": SECRET})
    gw = rmq_gateway(acl_text=ACL, env={"TIDEWIRE_ROCKETMQ_CREDENTIALS_FILE": str(credentials)})
    sub = paho_factory(gw.port, "dev")
    sub.connect()
    sub.subscribe("T/#", qos=1)
    producer = clients.producer(gw, ["T", "U"], "ak1", SECRET)
    producer.send(message("T", b"allowed", properties={"mqttSecondTopic": "/x/"}))
    assert sub.get().topic == "T/x"
    with pytest.raises(ForbiddenException):
        producer.send(message("U", b"not allowed"))
    readable = clients.consumer(gw, "g", "D", ak="ak1", sk=SECRET, wait_declared=False)
    assert readable.receive(1, 10) == []
    unreadable = clients.consumer(gw, "g", "T", ak="ak1", sk=SECRET, wait_declared=False)
    with pytest.raises(ForbiddenException):
        unreadable.receive(1, 10)


@pytest.mark.slow  # its own gateway
def test_sighup_reloads_the_access_keys(rmq_gateway: Callable[..., Gateway], tmp_path: Path) -> None:
    """As the MQTT password file: SIGHUP reads the credentials file again; one that fails keeps the keys."""
    path = write_credentials(tmp_path / "rocketmq.credentials", {"ak1": SECRET})
    gw = rmq_gateway(env={"TIDEWIRE_ROCKETMQ_CREDENTIALS_FILE": str(path)})
    assert route_status(gw, "ak1", SECRET) == Code.OK
    assert route_status(gw, "ak3", "third-secret") == Code.UNAUTHORIZED
    write_credentials(path, {"ak3": "third-secret"})  # ak1 revoked, ak3 added
    gw.reload()
    wait_until(lambda: route_status(gw, "ak3", "third-secret") == Code.OK, what="ak3 accepted after SIGHUP")
    assert route_status(gw, "ak1", SECRET) == Code.UNAUTHORIZED
    path.write_text("not a credentials line\n")
    gw.reload()
    wait_until(lambda: "event=reload.failed" in gw.stderr, what="the failed reload logged")
    assert route_status(gw, "ak3", "third-secret") == Code.OK  # the previous keys stay
    assert "third-secret" not in gw.stderr
