"""RocketMQ clients get the node's admission: a new client id takes the listener's limits (max connections,
connect rate, a stopping or overloaded node) and is refused with TOO_MANY_REQUESTS; a known client never is.
Driven without sockets (time passed in), then over gRPC with the client library's own stub and signing, and with
the official Producer."""

from __future__ import annotations

import json
from collections.abc import Callable

import grpc
import pytest
from rocketmq.grpc_protocol import (
    Code,
    MessagingServiceStub,
    NotifyClientTerminationRequest,
    QueryRouteRequest,
)
from rocketmq.v5.util.signature import Signature

from tests.gateway.fakeclock import FakeClock
from tests.integration.conftest import Gateway
from tidewire.gateway.config import Settings
from tidewire.gateway.protocols.rocketmq.admission import ClientAdmission
from tidewire.gateway.transport.admission import Admission
from tidewire.gateway.transport.listeners import make_listener

from .conftest import Clients, message


def admission(now: float = 0.0, **settings: object) -> ClientAdmission:
    config = Settings(**settings)  # type: ignore[arg-type]
    return ClientAdmission(Admission(config), make_listener(config, "rocketmq", FakeClock(mono=now)), idle_s=60)


def test_max_connections_counts_client_ids_and_known_clients_pass() -> None:
    clients = admission(listeners={"rocketmq": {"max_connections": 2}})
    assert clients.admit("a", 0) is None and clients.admit("b", 1) is None
    refused = clients.admit("c", 2)
    assert refused is not None and refused.kind == "busy" and "max connections on listener rocketmq" in refused.detail
    assert clients.admit("a", 3) is None, "a known client is never refused"
    assert clients.listener.connections == 2
    clients.forget("b")
    assert clients.listener.connections == 1 and clients.admit("c", 4) is None


def test_a_silent_client_frees_its_slot_after_the_idle_time() -> None:
    clients = admission(listeners={"rocketmq": {"max_connections": 1}})
    assert clients.admit("a", 0) is None
    assert clients.admit("b", 59.9) is not None
    assert clients.admit("a", 30) is None  # a call renews it
    assert clients.admit("b", 89.9) is not None
    assert clients.admit("b", 90.0) is None and clients.listener.connections == 1


def test_connect_rate_and_a_stopping_node_refuse_new_clients_only() -> None:
    clients = admission(max_connection_rate=1, connection_rate_burst=1)
    assert clients.admit("a", 0) is None
    refused = clients.admit("b", 0.1)
    assert refused is not None and refused.kind == "rate"
    assert clients.admit("b", 1.2) is None  # a token again
    clients.admission.draining = True
    stopping = clients.admit("c", 5)
    assert stopping is not None and stopping.kind == "stopping"
    assert clients.admit("a", 5) is None, "clients already served finish their work while the node drains"


def route(gw: Gateway, client_id: str) -> tuple[int, str]:
    config = Clients().config(gw)
    with grpc.insecure_channel(f"127.0.0.1:{gw.rocketmq_port}") as channel:
        request = QueryRouteRequest()
        request.topic.name = "T"
        answer = MessagingServiceStub(channel).QueryRoute(request, metadata=Signature.metadata(config, client_id),
                                                          timeout=5)
    return int(answer.status.code), answer.status.message


def terminate(gw: Gateway, client_id: str) -> int:
    config = Clients().config(gw)
    with grpc.insecure_channel(f"127.0.0.1:{gw.rocketmq_port}") as channel:
        answer = MessagingServiceStub(channel).NotifyClientTermination(
            NotifyClientTerminationRequest(), metadata=Signature.metadata(config, client_id), timeout=5)
    return int(answer.status.code)


def test_a_full_listener_refuses_a_new_client_over_grpc(rmq_gateway: Callable[..., Gateway],
                                                        clients: Clients) -> None:
    gw = rmq_gateway(env={"TIDEWIRE_LISTENERS": json.dumps({"rocketmq": {"max_connections": 2}})})
    assert route(gw, "c1")[0] == Code.OK and route(gw, "c2")[0] == Code.OK
    code, text = route(gw, "c3")
    assert code == Code.TOO_MANY_REQUESTS and "max connections on listener rocketmq" in text
    assert route(gw, "c1")[0] == Code.OK
    # the official producer is refused too while the listener is full, and gets in once a slot is free
    with pytest.raises(Exception):  # noqa: B017 - the client reports a refused route as a plain Exception
        clients.producer(gw, ["T"]).send(message("T", b"refused"))
    assert terminate(gw, "c1") == Code.OK and terminate(gw, "c2") == Code.OK
    assert route(gw, "c3")[0] == Code.OK
    assert "event=rocketmq.refused" in gw.stderr
